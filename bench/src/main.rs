//! The `smtp-once-bench` binary: parse the arguments, run the bench on a
//! multi-threaded runtime, exit 1 with the reason on failure.

use std::process::ExitCode;

use clap::Parser;
use smtp_once_bench::BenchArgs;

/// Load generator: submit messages over SMTP and report msgs/s and latency.
#[derive(Parser, Debug)]
#[command(name = "smtp-once-bench", version)]
struct Cli {
    #[command(flatten)]
    args: BenchArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli.args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            // Worded as `smtp-once bench` always was: scripts read it.
            eprintln!("smtp-once: bench: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: BenchArgs) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start runtime: {e}"))?;
    runtime
        .block_on(smtp_once_bench::run_cli(args))
        .map_err(|e| e.to_string())
}
