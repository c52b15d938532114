//! The SMTP protocol, without I/O.

pub mod message_buffer;
pub mod params;
pub mod path_command;
pub mod reply;
pub mod session;

#[cfg(test)]
mod session_tests;
