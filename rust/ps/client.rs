//! A tonic client for one parameter server, wrapped by `jaxcluster._core.PsClient`.
//!
//! Built on the same [`crate::rpc::client::channel`] as [`crate::rpc::WorkerClient`]: a lazily
//! connecting channel that reconnects by itself (a restarted ps is usable as soon as it
//! answers), the bearer-token interceptor, the shared size limits and flow-control windows,
//! and a per-call deadline. Clones share the connection.

use std::time::Duration;

use prost::Message;

use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use super::dtype::Op;
use crate::rpc::client::channel::{self, Callee, Peer};
use crate::rpc::client::chunked::ChunkStream;
use crate::rpc::client::framed;
use crate::rpc::client::ClientConfig;
use crate::rpc::security::auth::CallHeaders;
use crate::rpc::{pb, RpcError};

type Inner =
    pb::parameter_server_client::ParameterServerClient<InterceptedService<Channel, CallHeaders>>;

/// A connection to one ps task's `ParameterServer` service.
#[derive(Clone)]
pub struct PsClient {
    inner: Inner,
    /// The same connection without the generated client, for `CallChunked`, whose chunks
    /// `frames.rs` frames (`rpc::client::framed`): a large gradient's chunks are written
    /// from its own memory.
    raw: framed::Raw,
    callee: Callee,
}

/// What sets a ps apart, as the shared client code sees it: large frames for multi-megabyte
/// variables, and a broken connection counted as the ps being unavailable.
static PS: Peer = Peer {
    kind: "ps",
    example_port: 2222,
    max_frame_bytes: Some(super::MAX_FRAME_BYTES),
    status_error: call_error,
};

impl PsClient {
    /// Creates a client that connects on first use. Must run inside the tokio runtime
    /// (e.g. under `runtime().enter()`), which owns the connection's background task.
    pub fn connect_lazy(config: &ClientConfig) -> Result<Self, RpcError> {
        let lazy = channel::connect_lazy(config, &PS)?;
        let limit = lazy.max_message_bytes;
        let raw = InterceptedService::new(lazy.channel.clone(), lazy.auth.clone());
        let inner = pb::parameter_server_client::ParameterServerClient::with_interceptor(
            lazy.channel,
            lazy.auth,
        )
        .max_decoding_message_size(limit)
        .max_encoding_message_size(limit);
        Ok(Self {
            inner,
            raw,
            callee: Callee::new(&PS, config.address.clone(), limit),
        })
    }

    /// Starts `CallChunked` for [`Callee::call_sized`], framed ([`framed::call_chunked`]).
    fn chunked(
        &self,
    ) -> impl FnOnce(Inner, tonic::Request<ChunkStream>) -> framed::Pending + use<> {
        framed::chunked_call(
            &self.raw,
            crate::rpc::PS_CALL_CHUNKED_PATH,
            self.callee.max_message_bytes(),
        )
    }

    /// The address this client was made for, as given.
    pub fn address(&self) -> &str {
        self.callee.address()
    }

    /// Identity and counters of the ps.
    pub async fn get_status(
        &self,
        timeout: Option<Duration>,
    ) -> Result<pb::PsStatusResponse, RpcError> {
        let mut c = self.inner.clone();
        let request = pb::PsStatusRequest {};
        self.callee
            .call("GetStatus", timeout, request, |r| async move {
                c.get_status(r).await
            })
            .await
    }

    /// Creates a variable; returns whether one of that name was replaced.
    pub async fn create_variable(
        &self,
        request: pb::CreateVariableRequest,
        timeout: Option<Duration>,
    ) -> Result<bool, RpcError> {
        let response = self
            .callee
            .call_sized(
                &self.inner,
                "CreateVariable",
                timeout,
                request,
                |mut c, r| async move { c.create_variable(r).await },
                self.chunked(),
            )
            .await?;
        Ok(response.replaced)
    }

    /// A consistent copy of a variable and its version.
    pub async fn read(
        &self,
        name: String,
        timeout: Option<Duration>,
    ) -> Result<pb::ReadResponse, RpcError> {
        let mut c = self.inner.clone();
        let request = pb::ReadRequest { name };
        let unary = self
            .callee
            .call("Read", timeout, request.clone(), |r| async move {
                c.read(r).await
            })
            .await;
        match unary {
            // A value above the message limit: read it again in chunks (a read changes
            // nothing, so asking twice is safe).
            Err(RpcError::ResourceExhausted(_)) => {
                self.callee
                    .call_chunked(&self.inner, "Read", timeout, &request, self.chunked())
                    .await
            }
            other => other,
        }
    }

    /// `Assign`, `AssignAdd` or `AssignSub`, by `op`.
    pub async fn update(
        &self,
        op: Op,
        request: pb::UpdateRequest,
        timeout: Option<Duration>,
    ) -> Result<pb::UpdateResponse, RpcError> {
        let method = match op {
            Op::Assign => "Assign",
            Op::Add => "AssignAdd",
            Op::Sub => "AssignSub",
        };
        // The value read back is as large as the value sent: chunk both when that is large.
        if request.read_value && request.encoded_len() * 2 > self.callee.max_message_bytes() {
            return self
                .callee
                .call_chunked(&self.inner, method, timeout, &request, self.chunked())
                .await;
        }
        let (inner, callee) = (&self.inner, &self.callee);
        match op {
            Op::Assign => {
                let unary = |mut c: Inner, r| async move { c.assign(r).await };
                callee
                    .call_sized(inner, method, timeout, request, unary, self.chunked())
                    .await
            }
            Op::Add => {
                let unary = |mut c: Inner, r| async move { c.assign_add(r).await };
                callee
                    .call_sized(inner, method, timeout, request, unary, self.chunked())
                    .await
            }
            Op::Sub => {
                let unary = |mut c: Inner, r| async move { c.assign_sub(r).await };
                callee
                    .call_sized(inner, method, timeout, request, unary, self.chunked())
                    .await
            }
        }
    }

    /// Adds rows of updates into a variable.
    pub async fn scatter_add(
        &self,
        request: pb::ScatterAddRequest,
        timeout: Option<Duration>,
    ) -> Result<pb::UpdateResponse, RpcError> {
        self.callee
            .call_sized(
                &self.inner,
                "ScatterAdd",
                timeout,
                request,
                |mut c, r| async move { c.scatter_add(r).await },
                self.chunked(),
            )
            .await
    }

    /// One optimizer step on the ps (`ApplyUpdate`, protocol revision 5).
    pub async fn apply_update(
        &self,
        request: pb::ApplyUpdateRequest,
        timeout: Option<Duration>,
    ) -> Result<pb::UpdateResponse, RpcError> {
        self.callee
            .call_sized(
                &self.inner,
                "ApplyUpdate",
                timeout,
                request,
                |mut c, r| async move { c.apply_update(r).await },
                self.chunked(),
            )
            .await
    }

    /// Every variable's name, dtype, shape and version.
    pub async fn list_variables(
        &self,
        timeout: Option<Duration>,
    ) -> Result<Vec<pb::VariableInfo>, RpcError> {
        let mut c = self.inner.clone();
        let request = pb::ListVariablesRequest {};
        let response = self
            .callee
            .call("ListVariables", timeout, request, |r| async move {
                c.list_variables(r).await
            })
            .await?;
        Ok(response.variables)
    }

    /// Copies of several variables (all of them when `names` is empty).
    pub async fn read_many(
        &self,
        names: Vec<String>,
        timeout: Option<Duration>,
    ) -> Result<Vec<pb::NamedTensor>, RpcError> {
        let mut c = self.inner.clone();
        let request = pb::ReadManyRequest { names };
        let unary = self
            .callee
            .call("ReadMany", timeout, request.clone(), |r| async move {
                c.read_many(r).await
            })
            .await;
        let response: pb::ReadManyResponse = match unary {
            // Values above the message limit: read again in chunks (reads change nothing).
            Err(RpcError::ResourceExhausted(_)) => {
                self.callee
                    .call_chunked(&self.inner, "ReadMany", timeout, &request, self.chunked())
                    .await?
            }
            other => other?,
        };
        Ok(response.variables)
    }

    /// Assigns several variables all-or-nothing; returns `(assigned, created)`.
    pub async fn assign_many(
        &self,
        request: pb::AssignManyRequest,
        timeout: Option<Duration>,
    ) -> Result<(u32, u32), RpcError> {
        let response = self
            .callee
            .call_sized(
                &self.inner,
                "AssignMany",
                timeout,
                request,
                |mut c, r| async move { c.assign_many(r).await },
                self.chunked(),
            )
            .await?;
        Ok((response.assigned, response.created))
    }

    /// Drops variables; returns how many existed.
    pub async fn delete_variables(
        &self,
        names: Vec<String>,
        timeout: Option<Duration>,
    ) -> Result<u32, RpcError> {
        let mut c = self.inner.clone();
        let request = pb::DeleteVariablesRequest { names };
        let response = self
            .callee
            .call("DeleteVariables", timeout, request, |r| async move {
                c.delete_variables(r).await
            })
            .await?;
        Ok(response.deleted)
    }
}

impl PsClient {
    /// Ends this client's session on the ps: its variables are released at once.
    /// Returns the variables and bytes released.
    pub async fn end_session(&self, timeout: Option<Duration>) -> Result<(u64, u64), RpcError> {
        let mut c = self.inner.clone();
        let request = pb::PsEndSessionRequest {};
        let response = self
            .callee
            .call("EndSession", timeout, request, |r| async move {
                c.end_session(r).await
            })
            .await?;
        Ok((response.variables, response.bytes))
    }

    /// Adopts a live variable `name` of this dtype and shape into this client's session
    /// (see `ps.proto`); `None` when no session holds it, else the slots that came with it.
    pub async fn reattach(
        &self,
        request: pb::ReattachRequest,
        timeout: Option<Duration>,
    ) -> Result<Option<Vec<String>>, RpcError> {
        let mut c = self.inner.clone();
        let response = self
            .callee
            .call("Reattach", timeout, request, |r| async move {
                c.reattach(r).await
            })
            .await?;
        Ok(response.found.then_some(response.slots))
    }
}

/// The error for a failed call. A call whose connection broke before the ps answered
/// (a `tonic::transport::Error` in the status's source chain: the connection was reset or
/// closed mid-call, as when the ps is killed) is `UNAVAILABLE`, like a refused connection;
/// tonic reports it `UNKNOWN`, `INTERNAL` or — when the connection closed under a request
/// still in flight — `CANCELLED` ("operation was canceled: connection closed"), none of which
/// would count as a ps failure. A status the ps itself sent has no source and keeps its code.
fn call_error(status: tonic::Status) -> RpcError {
    let mut source = std::error::Error::source(&status);
    let mut transport = false;
    while let Some(error) = source {
        transport |= error.is::<tonic::transport::Error>();
        source = error.source();
    }
    let broke = transport
        && matches!(
            status.code(),
            tonic::Code::Unknown | tonic::Code::Internal | tonic::Code::Cancelled
        );
    let error = RpcError::from(status);
    if broke {
        RpcError::Unavailable(error.message().to_owned())
    } else {
        error
    }
}
