//! The spool: every message `send` submits is on disk, durably, before the
//! first attempt, and leaves only after the server's final word (2xx or
//! 5xx). A spooled entry is the exact bytes of every attempt: envelope,
//! account and message with its key, so `--flush` resends what the first
//! attempt sent and the server replays instead of queueing a second copy.
//!
//! Each entry is locked (`flock`) by the process working on it, from before
//! it appears under its name until it is removed; a `--flush` skips entries
//! locked by someone else. A killed process's lock goes with it.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::address::{ForwardPath, ReversePath};
use crate::private_fs;

const MAGIC: &str = "smtp-once-spool 1";
const SUFFIX: &str = ".msg";
const TMP_PREFIX: &str = ".tmp-";
/// A temporary file this old was left by a process that died before its
/// first attempt; nothing of it was ever sent.
const STALE_TMP: Duration = Duration::from_secs(3600);

#[derive(Debug, thiserror::Error)]
pub(super) enum SpoolError {
    #[error("spool {0}: {1}")]
    Io(PathBuf, io::Error),
    #[error("spool entry {0}: not a spool entry ({1})")]
    Corrupt(PathBuf, &'static str),
}

/// What one attempt sends, and as whom.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Envelope {
    /// `--user`, empty without AUTH: a key is scoped to the account's
    /// workspace, so only the same account may resend an entry.
    pub user: String,
    pub key: String,
    /// Between the brackets of MAIL FROM; empty for `<>`.
    pub from: String,
    pub to: Vec<String>,
}

pub(super) struct Spool {
    dir: PathBuf,
}

/// A spooled message this process holds the lock on.
pub(super) struct Entry {
    pub path: PathBuf,
    pub envelope: Envelope,
    pub message: Vec<u8>,
    /// When it was spooled.
    pub age: Duration,
    /// Holds the lock; closed (and unlocked) on drop.
    _file: File,
}

/// `$XDG_STATE_HOME/smtp-once/spool`, else `~/.local/state/smtp-once/spool`.
pub(super) fn default_dir() -> Option<PathBuf> {
    let state = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| {
            std::env::var_os("HOME")
                .map(PathBuf::from)
                .filter(|p| p.is_absolute())
                .map(|h| h.join(".local/state"))
        })?;
    Some(state.join("smtp-once/spool"))
}

impl Spool {
    /// Opens (creating, 0700) the spool folder.
    pub(super) fn open(dir: &Path) -> Result<Spool, SpoolError> {
        let err = |e| SpoolError::Io(dir.to_owned(), e);
        private_fs::create_dir(dir).map_err(err)?;
        private_fs::tighten(dir, private_fs::DIR_MODE).map_err(err)?;
        Ok(Spool {
            dir: dir.to_owned(),
        })
    }

    /// Opens the folder only if it exists (`--flush` creates nothing).
    pub(super) fn existing(dir: &Path) -> Result<Option<Spool>, SpoolError> {
        if dir.is_dir() {
            Self::open(dir).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Writes the entry durably and returns it locked: a temporary file,
    /// fsync, lock, rename, fsync of the folder.
    pub(super) fn add(&self, envelope: Envelope, message: Vec<u8>) -> Result<Entry, SpoolError> {
        let id = uuid::Uuid::new_v4().simple();
        let millis = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let tmp = self.dir.join(format!("{TMP_PREFIX}{id}"));
        let path = self.dir.join(format!("{millis:013}-{id}{SUFFIX}"));
        let err = |p: &Path| {
            let p = p.to_owned();
            move |e| SpoolError::Io(p, e)
        };
        let mut file = private_fs::create_new_file(&tmp).map_err(err(&tmp))?;
        let written = file
            .write_all(&serialise(&envelope, &message))
            .and_then(|()| file.sync_all())
            .and_then(|()| lock(&file, &tmp));
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(SpoolError::Io(tmp, e));
        }
        if let Err(e) = fs::rename(&tmp, &path) {
            let _ = fs::remove_file(&tmp);
            return Err(SpoolError::Io(path, e));
        }
        self.sync_dir()?;
        Ok(Entry {
            path,
            envelope,
            message,
            age: Duration::ZERO,
            _file: file,
        })
    }

    /// Every entry no one else holds, oldest first, locked. Entries that
    /// cannot be read are reported and skipped.
    pub(super) fn take_all(&self) -> Result<Vec<Result<Entry, SpoolError>>, SpoolError> {
        let mut names: Vec<String> = Vec::new();
        let read = fs::read_dir(&self.dir).map_err(|e| SpoolError::Io(self.dir.clone(), e))?;
        for dirent in read {
            let dirent = dirent.map_err(|e| SpoolError::Io(self.dir.clone(), e))?;
            let Ok(name) = dirent.file_name().into_string() else {
                continue;
            };
            if name.starts_with(TMP_PREFIX) {
                self.remove_if_stale(&dirent.path());
            } else if name.ends_with(SUFFIX) {
                names.push(name);
            }
        }
        names.sort();
        Ok(names
            .into_iter()
            .filter_map(|n| self.take(&self.dir.join(n)).transpose())
            .collect())
    }

    /// Locks and reads one entry; `None` when another process holds it or
    /// it was removed meanwhile.
    fn take(&self, path: &Path) -> Result<Option<Entry>, SpoolError> {
        let err = |e| SpoolError::Io(path.to_owned(), e);
        let mut file = match OpenOptions::new()
            .read(true)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(err(e)),
        };
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Ok(None),
            Err(TryLockError::Error(e)) => return Err(err(e)),
        }
        // Locked: is it still the file under that name? (Its holder may
        // have removed it between our open and our lock.)
        let ours = file.metadata().map_err(err)?;
        match fs::symlink_metadata(path) {
            Ok(now) if now.dev() == ours.dev() && now.ino() == ours.ino() => {}
            _ => return Ok(None),
        }
        let mut bytes = Vec::with_capacity(usize::try_from(ours.len()).unwrap_or(0));
        file.read_to_end(&mut bytes).map_err(err)?;
        let (envelope, message) =
            parse(&bytes).map_err(|why| SpoolError::Corrupt(path.to_owned(), why))?;
        let age = ours
            .modified()
            .ok()
            .and_then(|m| SystemTime::now().duration_since(m).ok())
            .unwrap_or_default();
        Ok(Some(Entry {
            path: path.to_owned(),
            envelope,
            message: message.to_vec(),
            age,
            _file: file,
        }))
    }

    /// Removes an entry after the server's final word (2xx or 5xx).
    pub(super) fn remove(&self, entry: Entry) -> Result<(), SpoolError> {
        fs::remove_file(&entry.path).map_err(|e| SpoolError::Io(entry.path.clone(), e))?;
        self.sync_dir()
        // The lock goes with `entry`, after the name is gone.
    }

    fn sync_dir(&self) -> Result<(), SpoolError> {
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| SpoolError::Io(self.dir.clone(), e))
    }

    fn remove_if_stale(&self, path: &Path) {
        let old = fs::symlink_metadata(path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|m| SystemTime::now().duration_since(m).ok())
            .is_some_and(|age| age > STALE_TMP);
        if old {
            let _ = fs::remove_file(path);
        }
    }
}

fn lock(file: &File, path: &Path) -> io::Result<()> {
    file.try_lock().map_err(|e| match e {
        TryLockError::WouldBlock => io::Error::other(format!(
            "{}: a fresh file is locked by someone else",
            path.display()
        )),
        TryLockError::Error(e) => e,
    })
}

/// The entry's bytes: a small text envelope, a blank line, the message.
/// Addresses and keys never hold a line break (they were checked).
fn serialise(env: &Envelope, message: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "{MAGIC}\nuser {}\nkey {}\nfrom {}\n",
        env.user, env.key, env.from
    );
    for to in &env.to {
        out.push_str(&format!("to {to}\n"));
    }
    out.push('\n');
    let mut out = out.into_bytes();
    out.extend_from_slice(message);
    out
}

fn parse(bytes: &[u8]) -> Result<(Envelope, &[u8]), &'static str> {
    let end = memchr::memmem::find(bytes, b"\n\n").ok_or("no envelope")?;
    let head = std::str::from_utf8(&bytes[..end]).map_err(|_| "envelope is not UTF-8")?;
    let message = &bytes[end + 2..];
    let mut lines = head.split('\n');
    if lines.next() != Some(MAGIC) {
        return Err("unknown format");
    }
    let mut env = Envelope {
        user: String::new(),
        key: String::new(),
        from: String::new(),
        to: Vec::new(),
    };
    for line in lines {
        let (field, value) = line.split_once(' ').ok_or("bad envelope line")?;
        match field {
            "user" => env.user = value.to_owned(),
            "key" => env.key = value.to_owned(),
            "from" => {
                ReversePath::parse(value).map_err(|_| "bad sender")?;
                env.from = value.to_owned();
            }
            "to" => {
                ForwardPath::parse(value).map_err(|_| "bad recipient")?;
                env.to.push(value.to_owned());
            }
            _ => return Err("unknown envelope field"),
        }
    }
    if env.to.is_empty() || message.is_empty() {
        return Err("no recipients or no message");
    }
    Ok((env, message))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn envelope() -> Envelope {
        Envelope {
            user: "alice".into(),
            key: "k-1".into(),
            from: "a@example.test".into(),
            to: vec!["b@example.net".into(), "c@example.net".into()],
        }
    }

    #[test]
    fn entries_round_trip_private_and_locked() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("spool");
        let spool = Spool::open(&dir).unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        let entry = spool
            .add(envelope(), b"Subject: x\r\n\r\nb\r\n".to_vec())
            .unwrap();
        assert_eq!(mode(&entry.path), 0o600);
        // Held by us: a flush sees nothing to take.
        assert!(spool.take_all().unwrap().is_empty());
        drop(entry);
        let mut all = spool.take_all().unwrap();
        assert_eq!(all.len(), 1);
        let again = all.pop().unwrap().unwrap();
        assert_eq!(again.envelope, envelope());
        assert_eq!(again.message, b"Subject: x\r\n\r\nb\r\n");
        spool.remove(again).unwrap();
        assert!(spool.take_all().unwrap().is_empty());
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 0);
    }

    #[test]
    fn a_foreign_file_is_reported_not_sent() {
        let tmp = tempfile::tempdir().unwrap();
        let spool = Spool::open(tmp.path()).unwrap();
        fs::write(tmp.path().join("0-x.msg"), b"hello\n\nworld").unwrap();
        let all = spool.take_all().unwrap();
        assert!(matches!(all[..], [Err(SpoolError::Corrupt(..))]));
    }
}
