//! Folders and files that only the daemon's own user may read: the queue
//! database and the messages written in file mode. The mode is set with
//! chmod after creation, so no umask can widen (or narrow) it.

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

/// Sets `path` to `mode` if group or others have access; returns the mode
/// it had. A missing file is left missing.
pub fn tighten(path: &Path, mode: u32) -> io::Result<Option<u32>> {
    match shared_mode(path) {
        Ok(Some(old)) => {
            fs::set_permissions(path, Permissions::from_mode(mode))?;
            Ok(Some(old))
        }
        Ok(None) => Ok(None),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Opens (creating if needed, never truncating) a read-write file that is
/// 0600 once this returns, whatever mode it had.
pub fn open_file(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(FILE_MODE)
        .open(path)?;
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
    }

    #[test]
    fn a_new_file_never_follows_a_planted_symlink() {
        let tmp = tempfile::tempdir().expect("tmp");
        let target = tmp.path().join("target");
        fs::write(&target, b"keep").expect("write");
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&target, &link).expect("symlink");
        assert!(create_new_file(&link).is_err());
        assert_eq!(fs::read(&target).expect("read"), b"keep");
        let new = tmp.path().join("new");
        create_new_file(&new).expect("create");
        assert_eq!(mode(&new), 0o600);
    }
}
