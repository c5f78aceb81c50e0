//! Binding and serving, shared by the worker and parameter servers.
//!
//! Both must apply the same safety rule (no unauthenticated listener on a reachable
//! address) and the same transport settings, and stop the same way; one copy keeps a fix
//! to either from missing the other.

use std::net::SocketAddr;
use std::sync::{Mutex, PoisonError};

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::body::Body;
use tonic::codegen::http::Response;
use tonic::transport::server::{Router, TcpIncoming};
use tonic::transport::Server;
use tower::layer::util::{Identity, Stack};
use tower::util::MapResponseLayer;

use super::limits::{size_status_layer, CONNECTION_WINDOW_BYTES, STREAM_WINDOW_BYTES};
use super::tls::{ServerTls, TlsError};

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

/// A server builder with TLS when given, the shared flow-control windows, HTTP/2 frames of
/// up to `max_frame_bytes` (`None`: the default), and the layer that words size refusals.
pub fn server(
    tls: Option<&ServerTls>,
    max_frame_bytes: Option<u32>,
) -> Result<Server<Layers>, TlsError> {
    Ok(super::tls::server_builder(tls)?
        .initial_stream_window_size(STREAM_WINDOW_BYTES)
        .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
        .max_frame_size(max_frame_bytes)
        .layer(size_status_layer::<Body>()))
}

/// The serving task of a server and the switch that stops it. Dropping it stops serving
/// and aborts the task, so the port is released promptly even if nobody awaits it.
pub struct Serving {
    stop: Mutex<Option<oneshot::Sender<()>>>,
    task: Mutex<Option<JoinHandle<Result<(), tonic::transport::Error>>>>,
}

impl Serving {
    /// Serves `router` on `listener` on the current tokio runtime until [`Serving::stop`].
    pub fn spawn(router: Router<Layers>, listener: TcpListener) -> Self {
        let (stop, stopped) = oneshot::channel::<()>();
        let serve = router.serve_with_incoming_shutdown(
            TcpIncoming::from(listener).with_nodelay(Some(true)),
            async {
                let _ = stopped.await;
            },
        );
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
