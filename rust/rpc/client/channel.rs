//! The channel setup and per-call deadline that the worker and ps clients share.
//!
//! Both clients must behave alike on the wire (same keepalive, flow-control windows, size
//! limits and timeout wording) so that the dispatcher can treat a slow or vanished worker
//! and a slow or vanished ps the same way; keeping one copy of that logic is what keeps them
//! alike. What differs between the two is gathered in a [`Peer`].

use std::future::Future;
use std::time::Duration;

use tonic::transport::Channel;

use crate::rpc::security::auth::CallHeaders;
use crate::rpc::wire::limits::{
    validate_max_message_bytes, CONNECTION_WINDOW_BYTES, STREAM_WINDOW_BYTES,
};
use crate::rpc::{ClientConfig, RpcError};

/// What sets one kind of server apart, as seen by a client.
#[derive(Debug)]
pub struct Peer {
    /// The task's kind as error messages name it (`worker`, `ps`).
    pub kind: &'static str,
    /// The port the address examples in error messages use.
    pub example_port: u16,
    /// Largest HTTP/2 frame to accept; `None` keeps the HTTP/2 default.
    pub max_frame_bytes: Option<u32>,
    /// Turns a failed call's status into the error callers see.
    pub status_error: fn(tonic::Status) -> RpcError,
}

/// Turns `host:port` (optionally with a `grpc://` or `http://` scheme) into an endpoint URI.
pub fn endpoint_uri(address: &str, peer: &Peer) -> Result<String, RpcError> {
    let rest = address
        .strip_prefix("grpc://")
        .or_else(|| address.strip_prefix("http://"))
        .unwrap_or(address);
    let valid = rest
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    if !valid || rest.contains('/') {
        let (kind, port) = (peer.kind, peer.example_port);
        return Err(RpcError::InvalidArgument(format!(
            "{kind} address {address:?} is not HOST:PORT; expected e.g. '127.0.0.1:{port}', \
             '[::1]:{port}' or 'grpc://{kind}-0:{port}'"
        )));
    }
    Ok(format!("http://{rest}"))
}

/// A lazily connecting channel and what a generated client needs to wrap it.
pub struct LazyChannel {
    /// Connects on first use and reconnects by itself after a failure.
    pub channel: Channel,
    /// The interceptor that adds the bearer token and the session.
    pub auth: CallHeaders,
    /// The validated message-size limit, for both directions.
    pub max_message_bytes: usize,
}

/// Validates `config` and makes the channel. Must run inside the tokio runtime (e.g. under
/// `runtime().enter()`), which owns the connection's background task.
pub fn connect_lazy(config: &ClientConfig, peer: &Peer) -> Result<LazyChannel, RpcError> {
    let max_message_bytes =
        validate_max_message_bytes(config.max_message_bytes).map_err(RpcError::InvalidArgument)?;
    let auth = CallHeaders::new(config.auth_token.as_deref(), config.session.as_deref())
        .map_err(RpcError::InvalidArgument)?;
    let uri = endpoint_uri(&config.address, peer)?;
    let endpoint = crate::rpc::security::tls::endpoint(uri, config.tls.as_ref())
        .map_err(|e| {
            RpcError::InvalidArgument(format!("{} address {:?}: {e}", peer.kind, config.address))
        })?
        .connect_timeout(config.connect_timeout)
        .tcp_nodelay(true)
        .initial_stream_window_size(STREAM_WINDOW_BYTES)
        .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
        .max_frame_size(peer.max_frame_bytes)
        // Keepalive pings notice a server that vanished without closing its socket (a
        // partitioned or frozen host) while a long call is in flight.
        .http2_keep_alive_interval(Duration::from_secs(15))
        .keep_alive_timeout(Duration::from_secs(20))
        .keep_alive_while_idle(true);
    Ok(LazyChannel {
        channel: endpoint.connect_lazy(),
        auth,
        max_message_bytes,
    })
}

/// One server a client calls: its kind and its address, which every error names, and the
/// largest message it takes, which decides whether a call goes whole or in chunks
/// (`chunked.rs`).
#[derive(Debug, Clone)]
pub struct Callee {
    pub(super) peer: &'static Peer,
    address: String,
    max_message_bytes: usize,
}

impl Callee {
    /// A callee of kind `peer` at `address` (as given, for messages) that takes messages up
    /// to `max_message_bytes` (validated, as [`connect_lazy`] gives it).
    pub fn new(peer: &'static Peer, address: String, max_message_bytes: usize) -> Self {
        Self {
            peer,
            address,
            max_message_bytes,
        }
    }

    /// The address this callee was made for, as given.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The largest request or response sent to or accepted from this callee, in bytes.
    pub fn max_message_bytes(&self) -> usize {
        self.max_message_bytes
    }

    /// Runs one call with an optional deadline. The deadline is both sent (`grpc-timeout`,
    /// so the server gives up too, and first: see [`answer_grace`]) and enforced here, so
    /// a server that never answers still fails the call, at most [`answer_grace`] late.
    pub async fn call<Req, Resp, F, Fut>(
        &self,
        method: &str,
        timeout: Option<Duration>,
        message: Req,
        send: F,
    ) -> Result<Resp, RpcError>
    where
        F: FnOnce(tonic::Request<Req>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, tonic::Status>>,
    {
        let mut request = tonic::Request::new(message);
        let context = || format!("{method} on {} {}", self.peer.kind, self.address);
        let late = |limit: Duration| {
            RpcError::DeadlineExceeded(format!(
                "{} did not answer within {:.3} s",
                context(),
                limit.as_secs_f64()
            ))
        };
        let result = match timeout {
            None => send(request).await,
            Some(limit) => {
                request.set_timeout(limit);
                match tokio::time::timeout(limit.saturating_add(answer_grace(limit)), send(request))
                    .await
                {
                    Ok(result) => result,
                    Err(_) => return Err(late(limit)),
                }
            }
        };
        result.map(tonic::Response::into_inner).map_err(|status| {
            match timeout.filter(|_| server_gave_up(&status)) {
                Some(limit) => late(limit),
                None => (self.peer.status_error)(status).with_context(&context()),
            }
        })
    }
}

/// How much longer than a call's deadline this client waits for the server's own answer to
/// it. The server is sent the deadline (`grpc-timeout`) and gives up at it: it drops the
/// call's work first (a queued unary closure is withdrawn, never to run) and answers after.
/// Waiting a little past the deadline lets that answer win, so a call that failed its
/// deadline is, whenever the server could answer at all, one the server has let go of; had
/// the local timer fired first, the server would learn of it only from the stream's reset
/// a moment later, and a closure queued behind a finishing one could still start. The
/// local timer stays, for a server that cannot answer. A tenth of the deadline, at least
/// 5 ms (a loaded host's scheduling delay) and at most 1 s.
fn answer_grace(limit: Duration) -> Duration {
    (limit / 10).clamp(Duration::from_millis(5), Duration::from_secs(1))
}

/// Whether `status` is a tonic server ending the call at the `grpc-timeout` this client
/// sent. The server's clock can run out a hair before ours, and tonic's server then answers
/// `CANCELLED` with its `TimeoutExpired` text rather than gRPC's `DEADLINE_EXCEEDED`; to the
/// caller both are the one deadline it set, so both are [`RpcError::DeadlineExceeded`]
/// (a caller that cancelled nothing must never see `CancelledError`).
fn server_gave_up(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::Cancelled
        && status.message() == tonic::TimeoutExpired(()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEER: Peer = Peer {
        kind: "worker",
        example_port: 8470,
        max_frame_bytes: None,
        status_error: RpcError::from,
    };

    #[test]
    fn addresses_are_normalised_or_refused_clearly() {
        let uri = |a| endpoint_uri(a, &PEER);
        assert_eq!(uri("127.0.0.1:80").unwrap(), "http://127.0.0.1:80");
        assert_eq!(uri("grpc://w-0:8470").unwrap(), "http://w-0:8470");
        assert_eq!(uri("[::1]:1").unwrap(), "http://[::1]:1");
        for bad in ["", "host", "host:", ":80", "host:99999", "http://h:1/path"] {
            let e = uri(bad).unwrap_err();
            assert!(matches!(e, RpcError::InvalidArgument(_)), "{bad}");
            assert!(e.message().contains("HOST:PORT"), "{e}");
        }
    }

    #[tokio::test]
    async fn a_server_ending_the_call_at_our_deadline_is_our_deadline() {
        let callee = Callee::new(&PEER, "127.0.0.1:1".into(), 1 << 20);
        let limit = Some(Duration::from_millis(500));
        let expired = || tonic::Status::cancelled(tonic::TimeoutExpired(()).to_string());
        let call = |status: tonic::Status| {
            callee.call("Ping", limit, (), |_| async move {
                Err::<tonic::Response<()>, _>(status)
            })
        };
        let e = call(expired()).await.unwrap_err();
        assert!(matches!(e, RpcError::DeadlineExceeded(_)), "{e:?}");
        assert_eq!(
            e.message(),
            "Ping on worker 127.0.0.1:1 did not answer within 0.500 s"
        );
        // Any other cancellation is still one, and without a deadline nothing is re-read.
        let e = call(tonic::Status::cancelled("closure cancelled"))
            .await
            .unwrap_err();
        assert!(matches!(e, RpcError::Cancelled(_)), "{e:?}");
        let e = callee
            .call("Ping", None, (), |_| async move {
                Err::<tonic::Response<()>, _>(expired())
            })
            .await
            .unwrap_err();
        assert!(matches!(e, RpcError::Cancelled(_)), "{e:?}");
    }

    #[tokio::test]
    async fn an_answer_just_past_the_deadline_is_waited_for_and_a_silent_server_is_not() {
        let callee = Callee::new(&PEER, "127.0.0.1:1".into(), 1 << 20);
        let limit = Duration::from_millis(500);
        assert_eq!(answer_grace(limit), Duration::from_millis(50));
        assert_eq!(
            answer_grace(Duration::from_millis(1)),
            Duration::from_millis(5)
        );
        assert_eq!(
            answer_grace(Duration::from_secs(60)),
            Duration::from_secs(1)
        );
        // The server's answer at its own deadline, a hair after ours, is the one returned.
        let late = callee.call("Ping", Some(limit), (), |_| async move {
            tokio::time::sleep(limit + Duration::from_millis(1)).await;
            Ok(tonic::Response::new(7))
        });
        assert_eq!(late.await.unwrap(), 7);
        // A server that never answers fails the call, and not before the grace ran out.
        let started = std::time::Instant::now();
        let silent = callee.call("Ping", Some(limit), (), |_| {
            std::future::pending::<Result<tonic::Response<()>, tonic::Status>>()
        });
        let e = silent.await.unwrap_err();
        assert!(matches!(e, RpcError::DeadlineExceeded(_)), "{e:?}");
        assert!(started.elapsed() >= limit + answer_grace(limit));
    }

    #[test]
    fn the_refusal_names_the_peer_and_its_example_port() {
        let ps = Peer {
            kind: "ps",
            example_port: 2222,
            ..PEER
        };
        let e = endpoint_uri("nope", &ps).unwrap_err();
        assert_eq!(
            e.message(),
            "ps address \"nope\" is not HOST:PORT; expected e.g. '127.0.0.1:2222', \
             '[::1]:2222' or 'grpc://ps-0:2222'"
        );
    }
}
