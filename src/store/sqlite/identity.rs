//! Is the database we have open still the file at its path? SQLite keeps
//! writing to a deleted (or moved, or replaced) file without complaint, and
//! such writes are gone at the next start: after an `rm -rf` of the data
//! directory, a 250 would promise mail that is already lost. Checking is
//! one `stat` per file, cheap enough before every commit batch.
//!
//! (device, inode) pairs cannot be reused while we hold the files open, so
//! a new file at the same path always differs.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone)]
pub struct FileIdentity {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl FileIdentity {
    /// The file at `path` now (just after opening it).
    pub fn of(path: &Path) -> std::io::Result<Self> {
        let m = std::fs::metadata(path)?;
        Ok(Self {
            path: path.to_path_buf(),
            dev: m.dev(),
            ino: m.ino(),
        })
    }

    /// The file behind an open handle, which was opened as `path`.
    pub fn of_open(file: &File, path: &Path) -> std::io::Result<Self> {
        let m = file.metadata()?;
        Ok(Self {
            path: path.to_path_buf(),
            dev: m.dev(),
            ino: m.ino(),
        })
    }

    /// Why the path no longer leads to this file, if it doesn't.
    pub fn check(&self) -> Result<(), String> {
        match std::fs::metadata(&self.path) {
            Ok(m) if m.dev() == self.dev && m.ino() == self.ino => Ok(()),
            Ok(_) => Err(format!(
                "{} was replaced by another file while running",
                self.path.display()
            )),
            Err(e) => Err(format!(
                "{} is gone ({e}): deleted or moved while running",
                self.path.display()
            )),
        }
    }
}

/// The files that make a data directory ours: the database and the lock.
#[derive(Debug, Clone)]
pub(super) struct DataDirIdentity {
    pub files: Vec<FileIdentity>,
}

impl DataDirIdentity {
    pub(super) fn check(&self) -> Result<(), String> {
        self.files.iter().try_for_each(FileIdentity::check)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deleted_moved_and_replaced_files_are_noticed() {
        let tmp = tempfile::tempdir().expect("tmp");
        let path = tmp.path().join("db");
        std::fs::write(&path, b"x").expect("write");
        let held = File::open(&path).expect("open");
        let id = FileIdentity::of_open(&held, &path).expect("identity");
        assert!(id.check().is_ok());

        let moved = tmp.path().join("moved");
        std::fs::rename(&path, &moved).expect("mv");
        assert!(id.check().expect_err("moved").contains("gone"));
        std::fs::write(&path, b"x").expect("another file");
        assert!(id.check().expect_err("replaced").contains("replaced"));
        std::fs::rename(&moved, &path).expect("mv back");
        assert!(id.check().is_ok(), "the same file back in place");
        std::fs::remove_file(&path).expect("rm");
        assert!(id.check().is_err());
    }
}
