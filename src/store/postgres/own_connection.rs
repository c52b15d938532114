//! One connection of the operators' own (queue admin, outbox admin),
//! connected again when it was lost: the API's and the console's admins live
//! as long as the daemon, and a database restart must not leave them failing
//! until the daemon restarts too.

use std::path::PathBuf;

use tokio::sync::{MappedMutexGuard, Mutex, MutexGuard};

use super::connect_one;
use crate::store::StoreError;

pub(super) struct OwnConnection {
    url: String,
    ca_file: Option<PathBuf>,
    /// Names the connection in logs.
    what: &'static str,
    /// Behind a lock: a transaction needs the client to itself.
    client: Mutex<Option<tokio_postgres::Client>>,
}

impl OwnConnection {
    /// Connects with the store's settings (TLS with `ca_file`, timeouts).
    pub(super) async fn connect(
        url: &str,
        ca_file: Option<&std::path::Path>,
        what: &'static str,
    ) -> Result<Self, StoreError> {
        let client = connect_one(url, ca_file, what).await?;
        Ok(Self {
            url: url.to_owned(),
            ca_file: ca_file.map(PathBuf::from),
            what,
            client: Mutex::new(Some(client)),
        })
    }

    /// The client, connected again if its connection was lost.
    pub(super) async fn client(
        &self,
    ) -> Result<MappedMutexGuard<'_, tokio_postgres::Client>, StoreError> {
        let mut guard = self.client.lock().await;
        if guard.as_ref().is_none_or(tokio_postgres::Client::is_closed) {
            *guard = None;
            *guard = Some(connect_one(&self.url, self.ca_file.as_deref(), self.what).await?);
        }
        MutexGuard::try_map(guard, Option::as_mut)
            .map_err(|_| StoreError::Unavailable(format!("{} not connected", self.what)))
    }
}
