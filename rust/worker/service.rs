//! The tonic `Worker` service: each handler turns its message into a call on the
//! [`WorkerState`] (checks, lookups, the hand-off to the executor) and its answer back into
//! a message. Nothing else lives here, so the protocol's surface reads in one place.

use std::sync::Arc;

use tonic::{Request, Response, Status, Streaming};

use super::jobs::{JobReply, JobRequest};
use super::reader;
use super::state::WorkerState;
use super::stream::Replies;
use crate::rpc::pb;

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
        let state = &self.state;
        let job = state.run_job(request.into_inner())?;
        let JobReply::Run(response) = state.submit(job).await? else {
            return Err(mismatched());
        };
        state.check_size(&response, "the closure's result")?;
        Ok(Response::new(response))
    }

    type RunClosuresStream = Replies;

    async fn run_closures(
        &self,
        request: Request<Streaming<pb::RunClosuresRequest>>,
    ) -> Result<Response<Self::RunClosuresStream>, Status> {
        Ok(Response::new(reader::serve(
            &self.state,
            request.into_inner(),
        )))
    }

    async fn create_resource(
        &self,
        request: Request<pb::CreateResourceRequest>,
    ) -> Result<Response<pb::CreateResourceResponse>, Status> {
        let state = &self.state;
        let job = state.create_resource_job(request.into_inner())?;
        let JobReply::CreateResource(response) = state.submit(job).await? else {
            return Err(mismatched());
        };
        state.check_size(&response, "the resource's creation error")?;
        Ok(Response::new(response))
    }

    async fn release_resource(
        &self,
        request: Request<pb::ReleaseResourceRequest>,
    ) -> Result<Response<pb::ReleaseResourceResponse>, Status> {
        let job = JobRequest::ReleaseResource {
            resource_ids: request.into_inner().resource_ids,
        };
        let JobReply::ReleaseResource(response) = self.state.submit(job).await? else {
            return Err(mismatched());
        };
        Ok(Response::new(response))
    }
}
