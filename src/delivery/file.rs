//! `mode = "file"`: each message becomes `<queue-id>.eml` in a folder,
//! written atomically (temporary name, fsync, rename, fsync of the folder),
//! so a reader never sees a partial file and a crash leaves either nothing
//! or the whole message. Writing it again after a crash replaces the file
//! with identical bytes: still exactly one copy.
//!
//! Messages are private: each file is 0600 and a folder we create is 0700,
//! whatever the umask. A folder that already exists keeps the mode the
//! operator gave it (another program may read it), with a warning when
//! other users can enter it.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::outgoing::Outgoing;
use super::{DeliveryError, RcptResult, Status};
use crate::private_fs;

const TEMP_SUFFIX: &str = ".eml.tmp";

pub struct FileTransport {
    dir: PathBuf,
}

impl FileTransport {
    /// Creates the folder, and removes temporary files a crash left behind.
    pub fn new(dir: &Path) -> Result<Self, DeliveryError> {
        let setup =
            |e: std::io::Error| DeliveryError::Setup(format!("relay.dir {}: {e}", dir.display()));
        if !private_fs::create_dir(dir).map_err(setup)?
            && let Some(mode) = private_fs::shared_mode(dir).map_err(setup)?
        {
            tracing::warn!(
                dir = %dir.display(),
                "relay.dir is mode {mode:04o}: other users can enter it (each message file is 0600); left as set"
            );
        }
        if let Ok(entries) = std::fs::read_dir(dir) {
            for entry in entries.flatten() {
                let name = entry.file_name();
                let name = name.to_string_lossy();
                if name.starts_with('.') && name.ends_with(TEMP_SUFFIX) {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
        Ok(Self {
            dir: dir.to_path_buf(),
        })
    }

    pub async fn deliver(&self, msg: &Outgoing, recipients: &[String]) -> Vec<RcptResult> {
        let mut bytes = envelope_headers(&msg.reverse_path, recipients);
        bytes.extend_from_slice(&msg.bytes_for(recipients));
        let dir = self.dir.clone();
        let id = msg.id.clone();
        let written =
            tokio::task::spawn_blocking(move || write_atomically(&dir, &id, &bytes)).await;
        match written {
            Ok(Ok(path)) => {
                let hop = path.display().to_string();
                RcptResult::all(
                    recipients,
                    Status::Delivered,
                    "250 2.0.0 written",
                    Some(&hop),
                )
            }
            Ok(Err(e)) => RcptResult::all(
                recipients,
                Status::Deferred,
                &format!("451 4.3.0 cannot write to {}: {e}", self.dir.display()),
                None,
            ),
            Err(e) => RcptResult::all(
                recipients,
                Status::Deferred,
                &format!("451 4.3.0 {e}"),
                None,
            ),
        }
    }
}

/// What a final delivery adds (RFC 5321 4.4 `Return-Path`), plus the
/// envelope recipients, which a file cannot otherwise show.
fn envelope_headers(reverse_path: &str, recipients: &[String]) -> Vec<u8> {
    let to: Vec<String> = recipients.iter().map(|r| format!("<{r}>")).collect();
    format!(
        "Return-Path: <{reverse_path}>\r\nX-Envelope-To: {}\r\n",
        to.join(",\r\n\t")
    )
    .into_bytes()
}

fn write_atomically(dir: &Path, id: &str, bytes: &[u8]) -> std::io::Result<PathBuf> {
    let final_path = dir.join(format!("{id}.eml"));
    let temp_path = dir.join(format!(".{id}{TEMP_SUFFIX}"));
    let result = (|| {
        // A stale temporary file (an attempt cut off mid-write) goes first;
        // the new one is created fresh, never through a planted symlink.
        match std::fs::remove_file(&temp_path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let mut file = private_fs::create_new_file(&temp_path)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&temp_path, &final_path)?;
        // The rename is durable only once the folder is synced.
        std::fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temp_path);
    }
    result.map(|()| final_path)
}
