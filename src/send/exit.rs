//! Exit codes from `sysexits.h`, as sendmail-style callers expect them.

use std::process::ExitCode;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Exit {
    /// Accepted (a replay included).
    Ok = 0,
    /// EX_USAGE: bad arguments.
    Usage = 64,
    /// EX_DATAERR: the message is refused for its content (a 5xx to it,
    /// a bare CR, a conflicting key).
    DataErr = 65,
    /// EX_NOINPUT: no message on stdin, or an input file unreadable.
    NoInput = 66,
    /// EX_UNAVAILABLE: another 5xx.
    Unavailable = 69,
    /// EX_CANTCREAT: the spool cannot be written, so nothing was sent.
    CantCreat = 73,
    /// EX_TEMPFAIL: gave up for now; the message is kept in the spool.
    TempFail = 75,
    /// EX_NOPERM: a 5xx refusing the account or the sender.
    NoPerm = 77,
    /// EX_CONFIG: our settings or the server's offer make sending impossible.
    Config = 78,
}

impl Exit {
    pub fn code(self) -> u8 {
        self as u8
    }
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> ExitCode {
        ExitCode::from(e.code())
    }
}
