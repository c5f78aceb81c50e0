//! A tonic client for one worker: what `jaxcluster.WorkerClient` wraps and what the
//! coordinator's dispatcher holds per worker.
//!
//! The channel connects lazily and reconnects by itself after a failure, so a client made
//! while its worker is down becomes usable as soon as the worker answers. Clones share the
//! connection. Each call takes an optional timeout; on expiry it fails with
//! [`RpcError::DeadlineExceeded`] and the worker is told through `grpc-timeout`.

use std::time::Duration;

use tonic::body::Body;
use tonic::codegen::http::Response;
use tonic::service::interceptor::{InterceptedService, ResponseBody};
use tonic::transport::Channel;
use tonic::Status;

use super::channel::{self, Callee, Peer};
use super::chunked::ChunkStream;
use super::framed;
use crate::rpc::pb;
use crate::rpc::security::auth::CallHeaders;
use crate::rpc::wire::chunks;
use crate::rpc::wire::limits::DEFAULT_MAX_MESSAGE_BYTES;
use crate::rpc::RpcError;

pub(super) type Inner = pb::worker_client::WorkerClient<InterceptedService<Channel, CallHeaders>>;

/// How to reach a worker.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// `host:port`, `[v6]:port`, or the same behind `grpc://` or `http://`.
    pub address: String,
    /// Sent as `authorization: Bearer <token>` on every call.
    pub auth_token: Option<String>,
    /// The session every call belongs to, sent as `jaxcluster-session`
    /// (`crate::rpc::wire::session`); `None`: the anonymous session.
    pub session: Option<String>,
    /// Bound on establishing a connection.
    pub connect_timeout: Duration,
    /// Largest request or response accepted, in bytes.
    pub max_message_bytes: usize,
    /// Connect with TLS, verifying the worker against this CA; plaintext when `None`.
    pub tls: Option<crate::rpc::security::tls::ClientTls>,
}

impl ClientConfig {
    /// A config with no token, a 10 s connect timeout and the 64 MiB default limit.
    pub fn new(address: impl Into<String>) -> Self {
        Self {
            address: address.into(),
            auth_token: None,
            session: None,
            connect_timeout: Duration::from_secs(10),
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            tls: None,
        }
    }
}

/// What sets workers apart from other servers, as the shared client code sees them.
pub static WORKER: Peer = Peer {
    kind: "worker",
    example_port: 8470,
    max_frame_bytes: Some(crate::rpc::wire::limits::MAX_FRAME_BYTES),
    status_error: RpcError::from,
};

/// A connection to one worker's `Worker` service.
#[derive(Clone)]
pub struct WorkerClient {
    inner: Inner,
    /// The same connection without the generated client, for the calls whose messages
    /// `frames.rs` frames: `RunClosures` and `CallChunked` (see [`framed`]).
    raw: framed::Raw,
    callee: Callee,
}

impl WorkerClient {
    /// Creates a client that connects on first use. Must run inside the tokio runtime
    /// (e.g. under `runtime().enter()`), which owns the connection's background task.
    pub fn connect_lazy(config: &ClientConfig) -> Result<Self, RpcError> {
        let lazy = channel::connect_lazy(config, &WORKER)?;
        let limit = lazy.max_message_bytes;
        let raw = InterceptedService::new(lazy.channel.clone(), lazy.auth.clone());
        let inner = pb::worker_client::WorkerClient::with_interceptor(lazy.channel, lazy.auth)
            .max_decoding_message_size(limit)
            .max_encoding_message_size(limit);
        Ok(Self {
            inner,
            raw,
            callee: Callee::new(&WORKER, config.address.clone(), limit),
        })
    }

    /// The address this client was made for, as given.
    pub fn address(&self) -> &str {
        self.callee.address()
    }

    /// The largest request or response this client sends or accepts, in bytes.
    pub fn max_message_bytes(&self) -> usize {
        self.callee.max_message_bytes()
    }

    /// Opens `RunClosures` with `body` as its request stream: the gRPC call tonic's generated
    /// client makes, with the messages framed by `frames.rs` so that arrays are neither
    /// copied into an encoder nor out of a decoder (see [`framed::open`]).
    pub(super) async fn open_run_closures<B>(
        &self,
        body: B,
    ) -> Result<Response<ResponseBody<Body>>, Status>
    where
        B: http_body::Body<Data = bytes::Bytes, Error = Status> + Send + 'static,
    {
        framed::open(
            &self.raw,
            crate::rpc::RUN_CLOSURES_PATH,
            tonic::codegen::http::HeaderMap::new(),
            body,
            "RunClosures",
        )
        .await
    }

    /// Starts `CallChunked` for [`Callee::call_sized`], framed ([`framed::call_chunked`]).
    fn chunked(
        &self,
    ) -> impl FnOnce(Inner, tonic::Request<ChunkStream>) -> framed::Pending + use<> {
        framed::chunked_call(
            &self.raw,
            crate::rpc::WORKER_CALL_CHUNKED_PATH,
            self.max_message_bytes(),
        )
    }

    /// Health, identity and counters of the worker.
    pub async fn get_status(
        &self,
        timeout: Option<Duration>,
    ) -> Result<pb::GetStatusResponse, RpcError> {
        let mut c = self.inner.clone();
        self.callee
            .call(
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
            .callee
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
        self.callee
            .call_sized(
                &self.inner,
                "RegisterFunction",
                timeout,
                request,
                |mut c, r| async move { c.register_function(r).await },
                self.chunked(),
            )
            .await
    }

    /// Runs a registered function; a closure that raised is `Ok` with `outcome = Error`.
    /// A preemption save (`preemption_save`) always goes through `CallChunked`: its answer
    /// is a worker's whole device state, which may be above any one message's limit.
    pub async fn run_closure(
        &self,
        request: pb::RunClosureRequest,
        timeout: Option<Duration>,
    ) -> Result<pb::RunClosureResponse, RpcError> {
        if request.preemption_save {
            return self
                .callee
                .call_chunked(&self.inner, "RunClosure", timeout, &request, self.chunked())
                .await;
        }
        self.callee
            .call_sized(
                &self.inner,
                "RunClosure",
                timeout,
                request,
                |mut c, r| async move { c.run_closure(r).await },
                self.chunked(),
            )
            .await
    }

    /// Runs a registered function and keeps the result on the worker as a resource.
    pub async fn create_resource(
        &self,
        request: pb::CreateResourceRequest,
        timeout: Option<Duration>,
    ) -> Result<pb::CreateResourceResponse, RpcError> {
        self.callee
            .call_sized(
                &self.inner,
                "CreateResource",
                timeout,
                request,
                |mut c, r| async move { c.create_resource(r).await },
                self.chunked(),
            )
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
            .callee
            .call("ReleaseResource", timeout, request, |r| async move {
                c.release_resource(r).await
            })
            .await?;
        Ok(response.released)
    }

    /// Ends this client's session on the worker: what it created there is released at
    /// once. `true` when the worker knew the session.
    pub async fn end_session(&self, timeout: Option<Duration>) -> Result<bool, RpcError> {
        let mut c = self.inner.clone();
        let response = self
            .callee
            .call(
                "EndSession",
                timeout,
                pb::EndSessionRequest {},
                |r| async move { c.end_session(r).await },
            )
            .await?;
        Ok(response.known)
    }
    /// (Dataflow.) The value this client's session kept on the worker under `value_id`,
    /// as its chunks arrive assembled: the encoded value a closure's result would be.
    /// `NotFound` when the session holds no such value there.
    pub async fn read_value(
        &self,
        value_id: u64,
        timeout: Option<Duration>,
    ) -> Result<pb::Value, RpcError> {
        let mut c = self.inner.clone();
        self.callee
            .call(
                "ReadValue",
                timeout,
                pb::ReadValueRequest { value_id },
                |r| async move {
                    let (metadata, incoming, extensions) = c.read_value(r).await?.into_parts();
                    let (_, encoded) = chunks::read_message(incoming).await?;
                    let value = chunks::decode(encoded, "a ReadValue answer")?;
                    Ok(tonic::Response::from_parts(metadata, value, extensions))
                },
            )
            .await
    }
}
