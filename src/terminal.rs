//! Reading a secret from the terminal without echoing it.

use std::io::{self, BufRead, Write};

use rustix::termios::{self, LocalModes, OptionalActions, Termios};

/// Terminal echo off on stdin until dropped, so the terminal gets its echo
/// back on every way out, errors included.
struct EchoOff {
    saved: Termios,
}

impl EchoOff {
    fn new() -> io::Result<Self> {
        let saved = termios::tcgetattr(io::stdin())?;
        let mut quiet = saved.clone();
        quiet.local_modes.remove(LocalModes::ECHO);
        // The Enter still shows, so the next prompt starts on a new line.
        quiet.local_modes.insert(LocalModes::ECHONL);
        // Flush: what was typed before the prompt is not taken as the secret.
        termios::tcsetattr(io::stdin(), OptionalActions::Flush, &quiet)?;
        Ok(Self { saved })
    }
}

impl Drop for EchoOff {
    fn drop(&mut self) {
        let _ = termios::tcsetattr(io::stdin(), OptionalActions::Now, &self.saved);
    }
}

/// Prints `prompt` on stderr and reads one line from stdin, which must be a
/// terminal, with echo off. The line ending is not part of the result.
pub fn read_hidden_line(prompt: &str) -> io::Result<String> {
    // Echo off before the prompt: what is typed once it shows stays hidden.
    let _echo_off = EchoOff::new()?;
    let mut stderr = io::stderr();
    stderr.write_all(prompt.as_bytes())?;
    stderr.flush()?;
    let mut line = String::new();
    io::stdin().lock().read_line(&mut line)?;
    Ok(line.trim_end_matches(['\r', '\n']).to_string())
}
