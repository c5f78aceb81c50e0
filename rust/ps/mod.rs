//! The parameter server: named dense variables served over gRPC (`jaxcluster ps`).
//!
//! [`VariableStore`] holds one session's variables, one lock each, so every update to a
//! variable is atomic; [`sessions`] keeps one store per session (one program's strategy); [`service`] serves it as `jaxcluster.v1.ParameterServer` with the same bearer
//! token check, size limits and loopback-only default as the worker; [`PsClient`] calls it.
//! Requests are served entirely on the shared tokio runtime: nothing here knows Python
//! exists, so a ps process's interpreter is never on the request path.

pub mod client;
pub mod dtype;
pub mod optim;
pub mod service;
pub mod sessions;
pub mod store;
pub mod tensor;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;
use tonic::{Request, Status};

pub use client::PsClient;
pub use dtype::{DType, Op};
pub use store::{StoreError, VariableStore};

use crate::rpc::pb;
use crate::rpc::security::auth::{validate_token, AuthCheck, AUTHORIZATION};
use crate::rpc::server::connections::{ConnectionStats, ServerLimits};
use crate::rpc::server::serve::{self, BindError, Serving};
use crate::rpc::wire::limits::{validate_max_message_bytes, DEFAULT_MAX_MESSAGE_BYTES};
use service::{PsService, PsShared, PsStats};
use sessions::PsSessions;

/// Largest HTTP/2 frame each side accepts (shared with workers, see `rpc::wire::limits`).
pub use crate::rpc::wire::limits::MAX_FRAME_BYTES;

/// How to start a parameter server.
#[derive(Debug, Clone)]
pub struct PsConfig {
    /// `HOST:PORT` to bind; port 0 picks a free port.
    pub address: String,
    /// Token every request must carry; required unless the bound address is loopback.
    pub auth_token: Option<String>,
    /// This task's index in the `ps` job, reported by `GetStatus`.
    pub ps_index: i64,
    /// Largest request or response, in bytes.
    pub max_message_bytes: usize,
    /// Serve TLS with this certificate and key; plaintext when `None`.
    pub tls: Option<crate::rpc::security::tls::ServerTls>,
    /// Connections, streams per connection, and the time to authenticate.
    pub limits: ServerLimits,
    /// How long a vanished session's variables are kept (`--state-ttl`); zero releases
    /// them as its last connection closes.
    pub state_ttl: Duration,
}

impl Default for PsConfig {
    fn default() -> Self {
        Self {
            address: "127.0.0.1:0".to_owned(),
            auth_token: None,
            ps_index: 0,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            tls: None,
            limits: ServerLimits::default(),
            state_ttl: crate::rpc::server::sessions::DEFAULT_TTL,
        }
    }
}

/// Why a parameter server could not start.
#[derive(Debug, thiserror::Error)]
pub enum PsError {
    /// A setting is invalid; the message says which and what is expected.
    #[error("{0}")]
    Config(String),
    /// The address could not be resolved or bound.
    #[error("could not bind ps address {address:?}: {source}")]
    Bind {
        /// The address as given.
        address: String,
        /// The operating system's error.
        source: std::io::Error,
    },
}

impl From<BindError> for PsError {
    fn from(error: BindError) -> Self {
        match error {
            BindError::Failed { address, source } => Self::Bind { address, source },
            BindError::Insecure(message) => Self::Config(message),
        }
    }
}

/// The worker's token check ([`AuthCheck`]: same header, same constant-time comparison,
/// same refusal counter) with refusals worded for a parameter server.
#[derive(Clone)]
struct PsAuth(AuthCheck);

impl Interceptor for PsAuth {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let sent_token = request.metadata().contains_key(AUTHORIZATION);
        self.0.call(request).map_err(|_| {
            Status::unauthenticated(if sent_token {
                "the 'authorization' metadata does not carry this ps's token; expected \
                 'Bearer <token>' with the token the ps was started with (workers use their \
                 own token, coordinators auth_token= or JAXCLUSTER_AUTH_TOKEN)"
            } else {
                "this ps requires a token: send metadata 'authorization: Bearer <token>' \
                 (workers use their own token, coordinators auth_token= or \
                 JAXCLUSTER_AUTH_TOKEN)"
            })
        })
    }
}

/// A running parameter server; dropping it stops serving.
pub struct PsServer {
    // Declared first so that dropping the server stops serving before anything else goes.
    serving: Serving,
    local_addr: SocketAddr,
    shared: Arc<PsShared>,
}

impl PsServer {
    /// Binds, then serves on the current tokio runtime until [`PsServer::stop_serving`].
    pub async fn start(config: PsConfig) -> Result<Self, PsError> {
        let limit =
            validate_max_message_bytes(config.max_message_bytes).map_err(PsError::Config)?;
        if let Some(token) = &config.auth_token {
            validate_token(token).map_err(PsError::Config)?;
        }
        let limits = config.limits.validate().map_err(PsError::Config)?;
        if config.ps_index < 0 {
            return Err(PsError::Config(format!(
                "ps index {} is negative; expected 0 or more",
                config.ps_index
            )));
        }
        let exposes = "read and overwrite every variable";
        let (listener, local_addr) =
            serve::bind(&config.address, config.auth_token.is_some(), exposes).await?;
        let sessions = Arc::new(PsSessions::new(config.ps_index));
        let registry = Arc::new(PsShared::registry(&sessions, config.state_ttl));
        registry.spawn_sweeper();
        let shared = Arc::new(PsShared {
            ps_index: config.ps_index,
            incarnation: crate::rpc::new_incarnation(),
            max_message_bytes: limit,
            sessions,
            registry,
            stats: PsStats::default(),
            started: Instant::now(),
            connections: Arc::new(ConnectionStats::default()),
        });
        let service = pb::parameter_server_server::ParameterServerServer::new(PsService::new(
            Arc::clone(&shared),
        ))
        .max_decoding_message_size(limit)
        .max_encoding_message_size(limit);
        let auth = PsAuth(AuthCheck::new(
            config.auth_token.as_deref(),
            Arc::clone(&shared.stats.unauthenticated),
        ));
        let router = serve::server(
            config.tls.as_ref(),
            Some(MAX_FRAME_BYTES),
            &limits,
            crate::rpc::wire::limits::rewrite_ps_status,
        )
        .map_err(|e| PsError::Config(e.to_string()))?
        .add_service(InterceptedService::new(service, auth));
        Ok(Self {
            serving: Serving::spawn(router, listener, &limits, Arc::clone(&shared.connections)),
            local_addr,
            shared,
        })
    }

    /// The address actually bound (with the real port when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The `GetStatus` answer right now.
    pub fn status(&self) -> pb::PsStatusResponse {
        self.shared.status()
    }

    /// The variables of every session, for in-process inspection.
    pub fn sessions(&self) -> &PsSessions {
        &self.shared.sessions
    }

    /// Closes the listener and returns the serving task, which ends once in-flight RPCs
    /// have completed; `None` if already stopped.
    pub fn stop_serving(&self) -> Option<JoinHandle<Result<(), tonic::transport::Error>>> {
        self.serving.stop()
    }
}

#[cfg(test)]
mod tests;
