//! Pulls of kept values from other workers (dataflow): a closure's argument names a value
//! another worker holds (`jaxcluster.wire.KeptRef`), and this worker reads it from that
//! holder with `ReadValue`, in the closure's session, with the token and TLS settings the
//! worker was started with. Bytes come straight from the holder, never through the
//! coordinator; both ends count them (`GetStatus.peer_*`).
//!
//! One lazily connected client per (holder, session) is kept, so a chain of closures
//! pulling from the same holder reuses its connection; the table is bounded
//! ([`MAX_CLIENTS`]) and simply emptied when full.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::stats::{value_bytes, Stats};
use crate::rpc::client::worker::ClientConfig;
use crate::rpc::security::tls::ClientTls;
use crate::rpc::wire::session::SessionId;
use crate::rpc::{pb, RpcError, WorkerClient};

/// Most clients kept at once; a worker talks to few (holder, session) pairs.
const MAX_CLIENTS: usize = 256;

/// How this worker dials its peers.
#[derive(Debug, Clone, Default)]
pub struct PeerSettings {
    /// The token peers expect (the worker's own: one cluster, one token).
    pub auth_token: Option<String>,
    /// TLS to verify peers with; plaintext when `None`.
    pub tls: Option<ClientTls>,
    /// Largest message a pull accepts per chunk (the worker's own limit).
    pub max_message_bytes: usize,
    /// Bound on connecting to a peer.
    pub connect_timeout: Duration,
}

/// The worker's pulls: clients by (holder, session), and the counters they add to.
pub struct PeerPulls {
    settings: PeerSettings,
    clients: Mutex<HashMap<(String, SessionId), WorkerClient>>,
    stats: Arc<Stats>,
}

impl PeerPulls {
    /// Pulls dialled with `settings`, counted into `stats`.
    pub fn new(settings: PeerSettings, stats: Arc<Stats>) -> Self {
        Self {
            settings,
            clients: Mutex::default(),
            stats,
        }
    }

    /// The client for `holder` in `session`, made on first use. Must run inside the tokio
    /// runtime (the connection's task is spawned there).
    pub fn client(&self, holder: &str, session: &SessionId) -> Result<WorkerClient, RpcError> {
        let key = (holder.to_owned(), session.clone());
        let mut clients = self.clients.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(client) = clients.get(&key) {
            return Ok(client.clone());
        }
        let mut config = ClientConfig::new(holder);
        config.auth_token.clone_from(&self.settings.auth_token);
        config.tls.clone_from(&self.settings.tls);
        config.max_message_bytes = self.settings.max_message_bytes;
        config.connect_timeout = self.settings.connect_timeout;
        config.session = (!session.is_anonymous()).then(|| session.as_str().to_owned());
        let client = WorkerClient::connect_lazy(&config)?;
        if clients.len() >= MAX_CLIENTS {
            clients.clear();
        }
        clients.insert(key, client.clone());
        Ok(client)
    }

    /// Reads `value_id` from `client`'s worker, counting the pull and its bytes.
    pub async fn pull(
        &self,
        client: WorkerClient,
        value_id: u64,
        timeout: Option<Duration>,
    ) -> Result<pb::Value, RpcError> {
        let value = client.read_value(value_id, timeout).await?;
        self.stats.peer_pulls.fetch_add(1, Ordering::Relaxed);
        self.stats
            .peer_bytes_received
            .fetch_add(value_bytes(&value), Ordering::Relaxed);
        Ok(value)
    }

    /// Whether pulls verify peers with TLS.
    pub fn uses_tls(&self) -> bool {
        self.settings.tls.is_some()
    }
}
