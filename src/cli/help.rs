//! `smtp-once --help`: the subcommands grouped by what they are for, each
//! with the first line of its own `about`, so the list cannot drift from
//! the commands. Clap 4 has no subcommand groups; the list goes into the
//! help template in place of `{subcommands}`.

use clap::Subcommand;

/// Every subcommand in exactly one group (a unit test holds this).
const GROUPS: &[(&str, &[&str])] = &[
    ("Serve", &["serve", "check-config"]),
    ("Submit", &["send"]),
    (
        "Operate",
        &[
            "status", "queue", "retry", "hold", "release", "cancel", "delete", "webhooks",
        ],
    ),
    ("Keys", &["hash-password", "new-api-key", "dkim-keygen"]),
    ("Bench", &["bench"]),
];

/// Where a subcommand missing from [`GROUPS`] still shows up.
const UNGROUPED: &str = "Other";

/// The top-level help template: clap's own layout with the grouped list.
pub(super) fn template() -> String {
    format!(
        "{{about-with-newline}}\n{{usage-heading}} {{usage}}\n\n{}\
         `smtp-once help COMMAND` or `smtp-once COMMAND --help` for one command's options.\n\n\
         Options:\n{{options}}{{after-help}}",
        grouped(&commands())
    )
}

/// (name, one-line about) of every subcommand, in declaration order.
fn commands() -> Vec<(String, String)> {
    super::Command::augment_subcommands(clap::Command::new("smtp-once"))
        .get_subcommands()
        .map(|c| {
            let about = c.get_about().map(|a| a.to_string()).unwrap_or_default();
            let line = about.lines().next().unwrap_or_default().trim().to_owned();
            (c.get_name().to_owned(), line)
        })
        .collect()
}

/// "Heading:" and an indented, aligned line per command, group by group.
fn grouped(commands: &[(String, String)]) -> String {
    let width = commands.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
    let line = |(name, about): &(String, String)| format!("  {name:width$}  {about}\n");
    let mut out = String::new();
    for (heading, names) in GROUPS {
        let members: Vec<_> = commands
            .iter()
            .filter(|(n, _)| names.contains(&n.as_str()))
            .collect();
        if members.is_empty() {
            continue;
        }
        out.push_str(&format!("{heading}:\n"));
        members.into_iter().for_each(|c| out.push_str(&line(c)));
        out.push('\n');
    }
    let other: Vec<_> = commands
        .iter()
        .filter(|(n, _)| group_of(n).is_none())
        .collect();
    if !other.is_empty() {
        out.push_str(&format!("{UNGROUPED}:\n"));
        other.into_iter().for_each(|c| out.push_str(&line(c)));
        out.push('\n');
    }
    out
}

fn group_of(name: &str) -> Option<&'static str> {
    GROUPS
        .iter()
        .find(|(_, names)| names.contains(&name))
        .map(|(heading, _)| *heading)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_subcommand_is_in_exactly_one_group() {
        let commands = commands();
        for (name, about) in &commands {
            let groups = GROUPS.iter().filter(|(_, n)| n.contains(&name.as_str()));
            assert_eq!(
                groups.count(),
                1,
                "`{name}` needs exactly one group in GROUPS"
            );
            assert!(!about.is_empty(), "`{name}` has no about line");
        }
        for (_, names) in GROUPS {
            for name in *names {
                assert!(
                    commands.iter().any(|(n, _)| n == name),
                    "GROUPS names `{name}`, which is no subcommand"
                );
            }
        }
    }

    #[test]
    fn an_ungrouped_command_is_still_listed() {
        let commands = vec![
            ("serve".to_owned(), "Run it".to_owned()),
            ("frobnicate".to_owned(), "New".to_owned()),
        ];
        let text = grouped(&commands);
        assert!(text.contains("Serve:\n  serve       Run it\n"), "{text}");
        assert!(text.contains("Other:\n  frobnicate  New\n"), "{text}");
    }
}
