//! Folders and files that only the daemon's own user may read: the queue
//! database and the messages written in file mode. The mode is set with
//! chmod after creation, so no umask can widen (or narrow) it. Files are
//! opened without following symlinks: in a folder other users can write
//! to, a planted link must not make us chmod (or write) its target.

use std::fs::{self, DirBuilder, File, OpenOptions, Permissions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

pub const DIR_MODE: u32 = 0o700;
pub const FILE_MODE: u32 = 0o600;

/// Creates `dir` and any missing parents as 0700. Returns whether `dir`
/// itself was created (an existing folder keeps its mode).
pub fn create_dir(dir: &Path) -> io::Result<bool> {
    if dir.is_dir() {
        return Ok(false);
    }
    DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(dir)?;
    fs::set_permissions(dir, Permissions::from_mode(DIR_MODE))?;
    Ok(true)
}

/// The permission bits of `path` when group or others have any access.
pub fn shared_mode(path: &Path) -> io::Result<Option<u32>> {
    let mode = fs::metadata(path)?.permissions().mode() & 0o777;
    Ok((mode & 0o077 != 0).then_some(mode))
}

/// Sets the file at `path` to `mode` if group or others have access;
/// returns the mode it had. A missing file is left missing; a symlink is
/// an error.
pub fn tighten(path: &Path, mode: u32) -> io::Result<Option<u32>> {
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(no_follow())
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(symlink_said(e)),
    };
    let old = file.metadata()?.permissions().mode() & 0o777;
    if old & 0o077 == 0 {
        return Ok(None);
    }
    file.set_permissions(Permissions::from_mode(mode))?;
    Ok(Some(old))
}

/// Opens (creating if needed, never truncating) a read-write file that is
/// 0600 once this returns, whatever mode it had. A symlink is an error.
pub fn open_file(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(FILE_MODE)
        .custom_flags(no_follow())
        .open(path)
        .map_err(symlink_said)?;
    file.set_permissions(Permissions::from_mode(FILE_MODE))?;
    Ok(file)
}

/// Creates a new 0600 file for writing. Fails if the name exists, even as
/// a symlink, so nothing planted under that name is followed.
pub fn create_new_file(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .open(path)?;
    file.set_permissions(Permissions::from_mode(FILE_MODE))?;
    Ok(file)
}

/// `O_NOFOLLOW`: opening a symlink fails (ELOOP).
fn no_follow() -> i32 {
    // The flag is a small positive constant.
    rustix::fs::OFlags::NOFOLLOW.bits() as i32
}

/// ELOOP from `O_NOFOLLOW`, in words.
fn symlink_said(e: io::Error) -> io::Error {
    if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error()) {
        io::Error::new(e.kind(), "is a symlink, which is not followed here")
    } else {
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        fs::metadata(p).expect("stat").permissions().mode() & 0o777
    }

    #[test]
    fn created_private_and_tightened_on_request() {
        let tmp = tempfile::tempdir().expect("tmp");
        let dir = tmp.path().join("a/b");
        assert!(create_dir(&dir).expect("create"));
        assert_eq!(mode(&dir), 0o700);
        assert!(!create_dir(&dir).expect("exists"));
        fs::set_permissions(&dir, Permissions::from_mode(0o755)).expect("chmod");
        assert_eq!(shared_mode(&dir).expect("stat"), Some(0o755));
        assert_eq!(tighten(&dir, DIR_MODE).expect("tighten"), Some(0o755));
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(
            tighten(&dir.join("none"), FILE_MODE).expect("missing"),
            None
        );

        let f = dir.join("f");
        fs::write(&f, b"x").expect("write");
        fs::set_permissions(&f, Permissions::from_mode(0o666)).expect("chmod");
        open_file(&f).expect("open");
        assert_eq!(mode(&f), 0o600);
        assert_eq!(fs::read(&f).expect("read"), b"x", "never truncated");
        fs::set_permissions(&f, Permissions::from_mode(0o644)).expect("chmod");
        assert_eq!(tighten(&f, FILE_MODE).expect("tighten"), Some(0o644));
        assert_eq!(mode(&f), 0o600);
    }

    #[test]
    fn planted_symlinks_are_never_followed() {
        let tmp = tempfile::tempdir().expect("tmp");
        let target = tmp.path().join("target");
        fs::write(&target, b"keep").expect("write");
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&target, &link).expect("symlink");
        fs::set_permissions(&target, Permissions::from_mode(0o644)).expect("chmod");
        assert!(create_new_file(&link).is_err());
        assert!(open_file(&link).is_err());
        assert!(tighten(&link, FILE_MODE).is_err());
        assert_eq!(fs::read(&target).expect("read"), b"keep");
        assert_eq!(mode(&target), 0o644, "the target's mode is untouched");
        let new = tmp.path().join("new");
        create_new_file(&new).expect("create");
        assert_eq!(mode(&new), 0o600);
    }
}
