//! A tonic client for one parameter server, wrapped by `jaxcluster._core.PsClient`.
//!
//! Built on the same [`crate::rpc::channel`] as [`crate::rpc::WorkerClient`]: a lazily
//! connecting channel that reconnects by itself (a restarted ps is usable as soon as it
//! answers), the bearer-token interceptor, the shared size limits and flow-control windows,
//! and a per-call deadline. Clones share the connection.

use std::time::Duration;

use prost::Message;

use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use super::dtype::Op;
use crate::rpc::auth::BearerToken;
use crate::rpc::channel::{self, Callee, Peer};
use crate::rpc::client::ClientConfig;
use crate::rpc::{pb, RpcError};

type Inner =
    pb::parameter_server_client::ParameterServerClient<InterceptedService<Channel, BearerToken>>;

/// A connection to one ps task's `ParameterServer` service.
#[derive(Clone)]
pub struct PsClient {
    inner: Inner,
    callee: Callee,
    max_message_bytes: usize,
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
        let inner = pb::parameter_server_client::ParameterServerClient::with_interceptor(
            lazy.channel,
            lazy.auth,
        )
        .max_decoding_message_size(limit)
        .max_encoding_message_size(limit);
        Ok(Self {
            inner,
            callee: Callee::new(&PS, config.address.clone()),
            max_message_bytes: limit,
        })
    }

    /// The address this client was made for, as given.
    pub fn address(&self) -> &str {
        self.callee.address()
    }

    /// Runs `method` through `CallChunked`, for messages above the size limit (protocol
    /// revision 4; see [`Callee::call_chunked`]).
    async fn chunked<Req, Resp>(
        &self,
        method: &str,
        timeout: Option<Duration>,
        request: &Req,
    ) -> Result<Resp, RpcError>
    where
        Req: prost::Message,
        Resp: prost::Message + Default,
    {
        let mut c = self.inner.clone();
        let limit = self.max_message_bytes;
        self.callee
            .call_chunked(method, timeout, request, limit, |r| async move {
                c.call_chunked(r).await
            })
            .await
    }

    /// Whether `request` is too large for one message.
    fn too_large(&self, request: &impl prost::Message) -> bool {
        request.encoded_len() > self.max_message_bytes
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
        if self.too_large(&request) {
            let response: pb::CreateVariableResponse =
                self.chunked("CreateVariable", timeout, &request).await?;
            return Ok(response.replaced);
        }
        let mut c = self.inner.clone();
        let response = self
            .callee
            .call("CreateVariable", timeout, request, |r| async move {
                c.create_variable(r).await
            })
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
            Err(RpcError::ResourceExhausted(_)) => self.chunked("Read", timeout, &request).await,
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
        // The value read back is as large as the value sent: chunk both when that is large.
        let answer_too = if request.read_value { 2 } else { 1 };
        if request.encoded_len() * answer_too > self.max_message_bytes {
            let method = match op {
                Op::Assign => "Assign",
                Op::Add => "AssignAdd",
                Op::Sub => "AssignSub",
            };
            return self.chunked(method, timeout, &request).await;
        }
        let mut c = self.inner.clone();
        match op {
            Op::Assign => {
                self.callee
                    .call(
                        "Assign",
                        timeout,
                        request,
                        |r| async move { c.assign(r).await },
                    )
                    .await
            }
            Op::Add => {
                self.callee
                    .call("AssignAdd", timeout, request, |r| async move {
                        c.assign_add(r).await
                    })
                    .await
            }
            Op::Sub => {
                self.callee
                    .call("AssignSub", timeout, request, |r| async move {
                        c.assign_sub(r).await
                    })
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
        if self.too_large(&request) {
            return self.chunked("ScatterAdd", timeout, &request).await;
        }
        let mut c = self.inner.clone();
        self.callee
            .call("ScatterAdd", timeout, request, |r| async move {
                c.scatter_add(r).await
            })
            .await
    }

    /// One optimizer step on the ps (`ApplyUpdate`, protocol revision 5).
    pub async fn apply_update(
        &self,
        request: pb::ApplyUpdateRequest,
        timeout: Option<Duration>,
    ) -> Result<pb::UpdateResponse, RpcError> {
        if self.too_large(&request) {
            return self.chunked("ApplyUpdate", timeout, &request).await;
        }
        let mut c = self.inner.clone();
        self.callee
            .call("ApplyUpdate", timeout, request, |r| async move {
                c.apply_update(r).await
            })
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
                self.chunked("ReadMany", timeout, &request).await?
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
        if self.too_large(&request) {
            let response: pb::AssignManyResponse =
                self.chunked("AssignMany", timeout, &request).await?;
            return Ok((response.assigned, response.created));
        }
        let mut c = self.inner.clone();
        let response = self
            .callee
            .call("AssignMany", timeout, request, |r| async move {
                c.assign_many(r).await
            })
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
