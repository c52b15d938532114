//! The SMTP protocol, without I/O.

pub mod path_command;
pub mod reply;
pub mod session;

#[cfg(test)]
mod session_tests;
