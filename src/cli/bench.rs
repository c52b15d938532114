//! `smtp-once bench`: the load generator is its own program,
//! `smtp-once-bench` (the `bench/` package), installed beside this one so
//! that the relay's library carries no bench code. The subcommand replaces
//! this process with it (`exec`): the same arguments, standard streams,
//! signals and exit code, as if it had been run directly.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, ExitCode};

/// The bench's binary, looked up in the folder of the running `smtp-once`.
pub const BENCH_BINARY: &str = "smtp-once-bench";

#[derive(Debug, thiserror::Error)]
enum ForwardError {
    #[error("cannot tell where smtp-once runs from: {0}")]
    OwnPath(std::io::Error),
    #[error(
        "{BENCH_BINARY} is not installed beside smtp-once: no {path} \
         (`cargo build --release` builds both; install them side by side)"
    )]
    Missing { path: PathBuf },
    #[error("cannot run {path}: {source}")]
    Exec {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Runs `smtp-once-bench` with `args`; returns only when it could not.
pub(super) fn forward(args: Vec<OsString>) -> ExitCode {
    let error = match bench_path() {
        Ok(path) => exec(path, args),
        Err(e) => e,
    };
    eprintln!("smtp-once: bench: {error}");
    ExitCode::FAILURE
}

fn bench_path() -> Result<PathBuf, ForwardError> {
    // current_exe resolves symlinks, so a link to smtp-once in PATH still
    // finds the bench beside the real binary.
    let own = std::env::current_exe().map_err(ForwardError::OwnPath)?;
    let folder = own.parent().ok_or_else(|| {
        ForwardError::OwnPath(std::io::Error::other(format!(
            "{} has no folder",
            own.display()
        )))
    })?;
    Ok(folder.join(BENCH_BINARY))
}

fn exec(path: PathBuf, args: Vec<OsString>) -> ForwardError {
    // argv[0] names the command the user typed, so clap's usage and help
    // lines read `smtp-once bench`, as they did when it was a subcommand.
    let source = Command::new(&path)
        .arg0("smtp-once bench")
        .args(args)
        .exec();
    if source.kind() == std::io::ErrorKind::NotFound {
        ForwardError::Missing { path }
    } else {
        ForwardError::Exec { path, source }
    }
}
