//! The tonic `Worker` service: each handler turns its message into a call on the
//! [`WorkerState`] (checks, lookups, the hand-off to the executor) and its answer back into
//! a message. Nothing else lives here, so the protocol's surface reads in one place.

use std::sync::Arc;

use tonic::{Request, Response, Status, Streaming};

use bytes::Bytes;
use prost::Message;

use super::jobs::{JobReply, JobRequest};
use super::outgoing::Outgoing;
use super::reader;
use super::state::WorkerState;
use crate::rpc::wire::chunks;
use crate::rpc::wire::session::SessionId;
use crate::rpc::{pb, PROTOCOL_REVISION, REVISION_HEADER};

/// The unary methods `CallChunked` carries.
const CHUNKED_METHODS: [&str; 3] = ["RunClosure", "CreateResource", "RegisterFunction"];

fn mismatched() -> Status {
    Status::internal("the worker's executor answered with a reply of the wrong kind (a bug)")
}

/// The `jaxcluster.v1.Worker` service.
pub struct WorkerService {
    state: Arc<WorkerState>,
}

impl WorkerService {
    /// A service over `state`.
    pub fn new(state: Arc<WorkerState>) -> Self {
        Self { state }
    }

    /// The session `request` belongs to (see [`WorkerState::session_of`]).
    fn session<T>(&self, request: &Request<T>) -> Result<SessionId, Status> {
        self.state
            .session_of(request.metadata(), request.extensions())
    }
}

/// A chunked request decoded; a failure is counted as a rejected request.
fn decoded<M: Message + Default>(
    state: &WorkerState,
    encoded: Bytes,
    what: &str,
) -> Result<M, Status> {
    chunks::decode(encoded, what).map_err(|s| state.stats.reject(s))
}

impl WorkerService {
    /// Runs one closure for unary `RunClosure` (whole or chunked): its answer is built
    /// here, once, from what the executor says it gave.
    async fn run(
        &self,
        session: &SessionId,
        request: pb::RunClosureRequest,
    ) -> Result<pb::RunClosureResponse, Status> {
        let closure_id = request.closure_id;
        let save = request.preemption_save;
        let job = self.state.run_job(request)?;
        let reply = if save {
            self.state.submit_preemption_save(session, job).await?
        } else {
            self.state.submit_as(session, job).await?
        };
        let JobReply::Run(ran) = reply else {
            return Err(mismatched());
        };
        Ok(pb::RunClosureResponse {
            closure_id,
            outcome: Some(ran),
        })
    }

    /// Runs one unary call that came through `CallChunked`: as the unary handler would,
    /// except that the answer may be of any size (it leaves in chunks).
    async fn chunked(
        &self,
        session: &SessionId,
        method: String,
        encoded: Bytes,
    ) -> Result<Vec<pb::Chunk>, Status> {
        let state = &self.state;
        let what = format!("a chunked {method} request");
        let what = what.as_str();
        let limit = state.max_message_bytes;
        Ok(match method.as_str() {
            "RunClosure" => chunks::answer(
                &self.run(session, decoded(state, encoded, what)?).await?,
                limit,
            ),
            "CreateResource" => {
                let job = state.create_resource_job(decoded(state, encoded, what)?)?;
                let JobReply::CreateResource(response) = state.submit_as(session, job).await?
                else {
                    return Err(mismatched());
                };
                chunks::answer(&response, limit)
            }
            "RegisterFunction" => {
                chunks::answer(&state.register(decoded(state, encoded, what)?)?, limit)
            }
            other => {
                return Err(state
                    .stats
                    .reject(chunks::unknown_method(other, &CHUNKED_METHODS)))
            }
        })
    }
}

#[tonic::async_trait]
impl pb::worker_server::Worker for WorkerService {
    async fn get_status(
        &self,
        _request: Request<pb::GetStatusRequest>,
    ) -> Result<Response<pb::GetStatusResponse>, Status> {
        Ok(Response::new(self.state.status()))
    }

    async fn list_devices(
        &self,
        _request: Request<pb::ListDevicesRequest>,
    ) -> Result<Response<pb::ListDevicesResponse>, Status> {
        Ok(Response::new(pb::ListDevicesResponse {
            devices: self.state.devices.clone(),
        }))
    }

    async fn register_function(
        &self,
        request: Request<pb::RegisterFunctionRequest>,
    ) -> Result<Response<pb::RegisterFunctionResponse>, Status> {
        Ok(Response::new(self.state.register(request.into_inner())?))
    }

    async fn run_closure(
        &self,
        request: Request<pb::RunClosureRequest>,
    ) -> Result<Response<pb::RunClosureResponse>, Status> {
        let session = self.session(&request)?;
        let response = self.run(&session, request.into_inner()).await?;
        self.state.check_size(&response, "the closure's result")?;
        Ok(Response::new(response))
    }

    type RunClosuresStream = Outgoing;

    async fn run_closures(
        &self,
        request: Request<Streaming<pb::RunClosuresRequest>>,
    ) -> Result<Response<Self::RunClosuresStream>, Status> {
        // Reached only by a caller that bypasses `route.rs` (which serves this path with
        // its own framing); kept so the generated service is whole.
        let session = self.session(&request)?;
        let incoming = Box::pin(request.into_inner());
        let mut response = Response::new(reader::serve(&self.state, incoming, session));
        response
            .metadata_mut()
            .insert(REVISION_HEADER, PROTOCOL_REVISION.into());
        Ok(response)
    }

    type CallChunkedStream = chunks::AnswerStream;

    async fn call_chunked(
        &self,
        request: Request<Streaming<pb::Chunk>>,
    ) -> Result<Response<Self::CallChunkedStream>, Status> {
        let state = &self.state;
        let session = self.session(&request)?;
        let session = &session;
        let answer = chunks::serve(
            request.into_inner(),
            |status| state.stats.reject(status),
            |method, encoded| self.chunked(session, method, encoded),
        )
        .await?;
        Ok(Response::new(answer))
    }

    async fn create_resource(
        &self,
        request: Request<pb::CreateResourceRequest>,
    ) -> Result<Response<pb::CreateResourceResponse>, Status> {
        let state = &self.state;
        let session = self.session(&request)?;
        let job = state.create_resource_job(request.into_inner())?;
        let JobReply::CreateResource(response) = state.submit_as(&session, job).await? else {
            return Err(mismatched());
        };
        state.check_size(&response, "the resource's creation error")?;
        Ok(Response::new(response))
    }

    async fn release_resource(
        &self,
        request: Request<pb::ReleaseResourceRequest>,
    ) -> Result<Response<pb::ReleaseResourceResponse>, Status> {
        let session = self.session(&request)?;
        let job = JobRequest::ReleaseResource {
            resource_ids: request.into_inner().resource_ids,
        };
        let JobReply::ReleaseResource(response) = self.state.submit_as(&session, job).await? else {
            return Err(mismatched());
        };
        Ok(Response::new(response))
    }

    type ReadValueStream = chunks::AnswerStream;

    async fn read_value(
        &self,
        request: Request<pb::ReadValueRequest>,
    ) -> Result<Response<Self::ReadValueStream>, Status> {
        let session = self.session(&request)?;
        let value_id = request.into_inner().value_id;
        let value = self.state.read_value(&session, value_id).await?;
        let pieces = chunks::split_message(&value, self.state.max_message_bytes, "");
        Ok(Response::new(tokio_stream::iter(
            pieces.into_iter().map(Ok).collect::<Vec<_>>(),
        )))
    }

    async fn end_session(
        &self,
        request: Request<pb::EndSessionRequest>,
    ) -> Result<Response<pb::EndSessionResponse>, Status> {
        let session = self.session(&request)?;
        let known = self.state.sessions.end(&session);
        Ok(Response::new(pb::EndSessionResponse { known }))
    }
}
