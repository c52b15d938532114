use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = smtp_once::cli::Cli::parse();
    smtp_once::cli::run(cli)
}
