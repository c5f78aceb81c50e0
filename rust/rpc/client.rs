//! A tonic client for one worker: what `jaxcluster.WorkerClient` wraps and what the
//! coordinator's dispatcher holds per worker.
//!
//! The channel connects lazily and reconnects by itself after a failure, so a client made
//! while its worker is down becomes usable as soon as the worker answers. Clones share the
//! connection. Each call takes an optional timeout; on expiry it fails with
//! [`RpcError::DeadlineExceeded`] and the worker is told through `grpc-timeout`.

use std::future::Future;
use std::time::Duration;

use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use super::auth::BearerToken;
use super::limits::{
    validate_max_message_bytes, CONNECTION_WINDOW_BYTES, DEFAULT_MAX_MESSAGE_BYTES,
    STREAM_WINDOW_BYTES,
};
use super::pb;
use super::RpcError;

pub(super) type Inner = pb::worker_client::WorkerClient<InterceptedService<Channel, BearerToken>>;

/// How to reach a worker.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// `host:port`, `[v6]:port`, or the same behind `grpc://` or `http://`.
    pub address: String,
    /// Sent as `authorization: Bearer <token>` on every call.
    pub auth_token: Option<String>,
    /// Bound on establishing a connection.
    pub connect_timeout: Duration,
    /// Largest request or response accepted, in bytes.
    pub max_message_bytes: usize,
    /// Connect with TLS, verifying the worker against this CA; plaintext when `None`.
    pub tls: Option<super::tls::ClientTls>,
}

impl ClientConfig {
    /// A config with no token, a 10 s connect timeout and the 64 MiB default limit.
    pub fn new(address: impl Into<String>) -> Self {
        Self {
            address: address.into(),
            auth_token: None,
            connect_timeout: Duration::from_secs(10),
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            tls: None,
        }
    }
}

/// Turns `host:port` (optionally with a `grpc://` or `http://` scheme) into an endpoint URI.
pub fn endpoint_uri(address: &str) -> Result<String, RpcError> {
    let rest = address
        .strip_prefix("grpc://")
        .or_else(|| address.strip_prefix("http://"))
        .unwrap_or(address);
    let valid = rest
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    if !valid || rest.contains('/') {
        return Err(RpcError::InvalidArgument(format!(
            "worker address {address:?} is not HOST:PORT; expected e.g. '127.0.0.1:8470', \
             '[::1]:8470' or 'grpc://worker-0:8470'"
        )));
    }
    Ok(format!("http://{rest}"))
}

/// A connection to one worker's `Worker` service.
#[derive(Clone)]
pub struct WorkerClient {
    inner: Inner,
    address: String,
    max_message_bytes: usize,
}

impl WorkerClient {
    /// Creates a client that connects on first use. Must run inside the tokio runtime
    /// (e.g. under `runtime().enter()`), which owns the connection's background task.
    pub fn connect_lazy(config: &ClientConfig) -> Result<Self, RpcError> {
        let limit = validate_max_message_bytes(config.max_message_bytes)
            .map_err(RpcError::InvalidArgument)?;
        let auth =
            BearerToken::new(config.auth_token.as_deref()).map_err(RpcError::InvalidArgument)?;
        let endpoint = super::tls::endpoint(endpoint_uri(&config.address)?, config.tls.as_ref())
            .map_err(|e| {
                RpcError::InvalidArgument(format!("worker address {:?}: {e}", config.address))
            })?
            .connect_timeout(config.connect_timeout)
            .tcp_nodelay(true)
            .initial_stream_window_size(STREAM_WINDOW_BYTES)
            .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
            // Keepalive pings notice a worker that vanished without closing its socket
            // (a partitioned or frozen host) while a long closure is in flight.
            .http2_keep_alive_interval(Duration::from_secs(15))
            .keep_alive_timeout(Duration::from_secs(20))
            .keep_alive_while_idle(true);
        let channel = endpoint.connect_lazy();
        let inner = pb::worker_client::WorkerClient::with_interceptor(channel, auth)
            .max_decoding_message_size(limit)
            .max_encoding_message_size(limit);
        Ok(Self {
            inner,
            address: config.address.clone(),
            max_message_bytes: limit,
        })
    }

    /// The address this client was made for, as given.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The largest request or response this client sends or accepts, in bytes.
    pub fn max_message_bytes(&self) -> usize {
        self.max_message_bytes
    }

    /// A handle on the generated client (cheap: clones share the connection).
    pub(super) fn inner(&self) -> Inner {
        self.inner.clone()
    }

    /// Health, identity and counters of the worker.
    pub async fn get_status(
        &self,
        timeout: Option<Duration>,
    ) -> Result<pb::GetStatusResponse, RpcError> {
        let mut c = self.inner.clone();
        self.call(
            "GetStatus",
            timeout,
            pb::GetStatusRequest {},
            |r| async move { c.get_status(r).await },
        )
        .await
    }

    /// The worker's devices with TF-style names.
    pub async fn list_devices(
        &self,
        timeout: Option<Duration>,
    ) -> Result<Vec<pb::Device>, RpcError> {
        let mut c = self.inner.clone();
        let response = self
            .call(
                "ListDevices",
                timeout,
                pb::ListDevicesRequest {},
                |r| async move { c.list_devices(r).await },
            )
            .await?;
        Ok(response.devices)
    }

    /// Stores a function payload on the worker under its content hash.
    pub async fn register_function(
        &self,
        request: pb::RegisterFunctionRequest,
        timeout: Option<Duration>,
    ) -> Result<pb::RegisterFunctionResponse, RpcError> {
        let mut c = self.inner.clone();
        self.call("RegisterFunction", timeout, request, |r| async move {
            c.register_function(r).await
        })
        .await
    }

    /// Runs a registered function; a closure that raised is `Ok` with `outcome = Error`.
    pub async fn run_closure(
        &self,
        request: pb::RunClosureRequest,
        timeout: Option<Duration>,
    ) -> Result<pb::RunClosureResponse, RpcError> {
        let mut c = self.inner.clone();
        self.call("RunClosure", timeout, request, |r| async move {
            c.run_closure(r).await
        })
        .await
    }

    /// Runs a registered function and keeps the result on the worker as a resource.
    pub async fn create_resource(
        &self,
        request: pb::CreateResourceRequest,
        timeout: Option<Duration>,
    ) -> Result<pb::CreateResourceResponse, RpcError> {
        let mut c = self.inner.clone();
        self.call("CreateResource", timeout, request, |r| async move {
            c.create_resource(r).await
        })
        .await
    }

    /// Drops resources from the worker; returns how many it held.
    pub async fn release_resource(
        &self,
        resource_ids: Vec<u64>,
        timeout: Option<Duration>,
    ) -> Result<u32, RpcError> {
        let mut c = self.inner.clone();
        let request = pb::ReleaseResourceRequest { resource_ids };
        let response = self
            .call("ReleaseResource", timeout, request, |r| async move {
                c.release_resource(r).await
            })
            .await?;
        Ok(response.released)
    }

    /// Runs one call with an optional deadline and names the method and worker in errors.
    async fn call<Req, Resp, F, Fut>(
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
        let context = || format!("{method} on worker {}", self.address);
        let result = match timeout {
            None => send(request).await,
            Some(limit) => {
                request.set_timeout(limit);
                match tokio::time::timeout(limit, send(request)).await {
                    Ok(result) => result,
                    Err(_) => {
                        return Err(RpcError::DeadlineExceeded(format!(
                            "{} did not answer within {:.3} s",
                            context(),
                            limit.as_secs_f64()
                        )))
                    }
                }
            }
        };
        result
            .map(tonic::Response::into_inner)
            .map_err(|status| RpcError::from(status).with_context(&context()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_normalised_or_refused_clearly() {
        assert_eq!(endpoint_uri("127.0.0.1:80").unwrap(), "http://127.0.0.1:80");
        assert_eq!(endpoint_uri("grpc://w-0:8470").unwrap(), "http://w-0:8470");
        assert_eq!(endpoint_uri("[::1]:1").unwrap(), "http://[::1]:1");
        for bad in ["", "host", "host:", ":80", "host:99999", "http://h:1/path"] {
            let e = endpoint_uri(bad).unwrap_err();
            assert!(matches!(e, RpcError::InvalidArgument(_)), "{bad}");
            assert!(e.message().contains("HOST:PORT"), "{e}");
        }
    }
}
