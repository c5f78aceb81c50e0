//! Binding and serving, shared by the worker and parameter servers.
//!
//! Both must apply the same safety rule (no unauthenticated listener on a reachable
//! address) and the same transport settings, and stop the same way; one copy keeps a fix
//! to either from missing the other.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::body::Body;
use tonic::codegen::http::Response;
use tonic::transport::server::Router;
use tonic::transport::Server;
use tower::layer::util::{Identity, Stack};
use tower::util::MapResponseLayer;

use super::connections::{
    effective_max_connections, raise_file_limit, ConnectionStats, Incoming, ServerLimits,
};
use crate::rpc::security::tls::{ServerTls, TlsError};
use crate::rpc::wire::limits::{status_layer, CONNECTION_WINDOW_BYTES, STREAM_WINDOW_BYTES};

/// The layers every server runs its services under (see [`server`]).
pub type Layers = Stack<MapResponseLayer<fn(Response<Body>) -> Response<Body>>, Identity>;

/// Why [`bind`] refused or failed.
#[derive(Debug)]
pub enum BindError {
    /// The address could not be resolved or bound.
    Failed {
        /// The address as given.
        address: String,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The address is not loopback and no token was given; the message says why and what
    /// to do instead.
    Insecure(String),
}

/// Binds the first address `address` resolves to, returning the listener and the address
/// actually bound. Without a token only a loopback address is accepted: anyone who can
/// reach the port could otherwise do what `exposes` says (e.g. "run code on this machine").
pub async fn bind(
    address: &str,
    has_token: bool,
    exposes: &str,
) -> Result<(TcpListener, SocketAddr), BindError> {
    let failed = |source| BindError::Failed {
        address: address.to_owned(),
        source,
    };
    let first = tokio::net::lookup_host(address)
        .await
        .map_err(failed)?
        .next()
        .ok_or_else(|| failed(std::io::Error::other("the name resolved to no address")))?;
    if !has_token && !first.ip().is_loopback() {
        return Err(BindError::Insecure(format!(
            "refusing to bind {address:?} ({}) without an auth token: anyone who can reach a \
             non-loopback address could {exposes}. Give a token \
             (--auth-token-file or JAXCLUSTER_AUTH_TOKEN) or bind 127.0.0.1",
            first.ip()
        )));
    }
    let listener = TcpListener::bind(first).await.map_err(failed)?;
    let local_addr = listener.local_addr().map_err(failed)?;
    Ok((listener, local_addr))
}

/// Largest header block a client may send: gRPC metadata is a few hundred bytes, and the
/// headers of a request are decoded before its token is checked.
const MAX_HEADER_LIST_BYTES: u32 = 64 * 1024;
/// HTTP/2 pings on idle connections, so the connection of a client that vanished without
/// closing it (a partitioned or powered-off host) is closed and its memory released.
const KEEPALIVE: (Duration, Duration) = (Duration::from_secs(30), Duration::from_secs(20));

/// A server builder with TLS when given, the shared flow-control windows, HTTP/2 frames of
/// up to `max_frame_bytes` (`None`: the default), at most `limits.max_streams_per_connection`
/// concurrent calls per connection, keepalive, and the layer `rewrite` that words size
/// refusals and malformed requests (`limits.rs`).
pub fn server(
    tls: Option<&ServerTls>,
    max_frame_bytes: Option<u32>,
    limits: &ServerLimits,
    rewrite: fn(Response<Body>) -> Response<Body>,
) -> Result<Server<Layers>, TlsError> {
    Ok(crate::rpc::security::tls::server_builder(tls)?
        .initial_stream_window_size(STREAM_WINDOW_BYTES)
        .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
        .max_frame_size(max_frame_bytes)
        .max_concurrent_streams(limits.max_streams_per_connection)
        .http2_max_header_list_size(MAX_HEADER_LIST_BYTES)
        .http2_keepalive_interval(Some(KEEPALIVE.0))
        .http2_keepalive_timeout(Some(KEEPALIVE.1))
        .layer(status_layer::<Body>(rewrite)))
}

/// The serving task of a server and the switch that stops it. Dropping it stops serving
/// and aborts the task, so the port is released promptly even if nobody awaits it.
pub struct Serving {
    stop: Mutex<Option<oneshot::Sender<()>>>,
    task: Mutex<Option<JoinHandle<Result<(), tonic::transport::Error>>>>,
}

impl Serving {
    /// Serves `router` on `listener` on the current tokio runtime until [`Serving::stop`],
    /// admitting connections under `limits` (see `connections.rs`; the process's file
    /// limit is raised to its hard limit first) and counting them in `stats`.
    pub fn spawn(
        router: Router<Layers>,
        listener: TcpListener,
        limits: &ServerLimits,
        stats: Arc<ConnectionStats>,
    ) -> Self {
        let max = effective_max_connections(limits.max_connections, raise_file_limit());
        if max < limits.max_connections {
            tracing::info!(
                target: "jaxcluster.server",
                max_connections = max,
                configured = limits.max_connections,
                "connections bounded by the open-file limit"
            );
        }
        let incoming = Incoming::new(listener, *limits, max, stats);
        let (stop, stopped) = oneshot::channel::<()>();
        let serve = router.serve_with_incoming_shutdown(incoming, async {
            let _ = stopped.await;
        });
        Self {
            stop: Mutex::new(Some(stop)),
            task: Mutex::new(Some(tokio::spawn(serve))),
        }
    }

    /// Closes the listener and returns the serving task, which ends once in-flight RPCs
    /// have completed; `None` if already stopped.
    pub fn stop(&self) -> Option<JoinHandle<Result<(), tonic::transport::Error>>> {
        if let Some(stop) = self
            .stop
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            let _ = stop.send(());
        }
        self.task
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        if let Some(task) = self.stop() {
            // Nobody will await it; abort so the port is released promptly.
            task.abort();
        }
    }
}
