//! The tonic `Worker` service: validation, the function store, and the hand-off of
//! execution requests to the executor.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use prost::Message;
use tonic::{Request, Response, Status, Streaming};

use super::jobs::{JobQueue, JobReply, JobRequest};
use super::stats::Stats;
use super::store::{FunctionStore, StoredFunction};
use super::stream::{self, Replies};
use super::validate;
use crate::rpc::limits::too_large;
use crate::rpc::{pb, HASH_LEN, PROTOCOL_REVISION};

/// State shared by the service, the server handle and the executor.
pub struct Shared {
    /// `--index` of this worker.
    pub worker_index: i64,
    /// Reported in `GetStatus`.
    pub jax_version: String,
    /// Reported in `GetStatus`.
    pub platform: String,
    /// Reported by `ListDevices`.
    pub devices: Vec<pb::Device>,
    /// Largest request or response, in bytes.
    pub max_message_bytes: usize,
    /// Registered functions.
    pub store: FunctionStore,
    /// Jobs waiting for the executor.
    pub queue: Arc<JobQueue>,
    /// Counters.
    pub stats: Arc<Stats>,
    /// When the server started, for `uptime_seconds`.
    pub started: Instant,
}

impl Shared {
    /// The `GetStatus` answer right now.
    pub fn status(&self) -> pb::GetStatusResponse {
        let (queued, inflight) = self.queue.depth();
        let state = if self.queue.is_draining() {
            pb::ServingState::Draining
        } else {
            pb::ServingState::Serving
        };
        let load = |counter: &std::sync::atomic::AtomicU64| counter.load(Ordering::Relaxed);
        pb::GetStatusResponse {
            state: state.into(),
            worker_index: self.worker_index,
            jaxcluster_version: env!("CARGO_PKG_VERSION").to_owned(),
            jax_version: self.jax_version.clone(),
            platform: self.platform.clone(),
            functions_registered: self.store.len() as u64,
            closures_run: load(&self.stats.closures_run),
            closures_failed: load(&self.stats.closures_failed),
            queued: queued as u32,
            inflight: inflight as u32,
            resources_created: load(&self.stats.resources_created),
            resources_released: load(&self.stats.resources_released),
            unauthenticated_requests: load(&self.stats.unauthenticated),
            rejected_requests: load(&self.stats.rejected),
            pid: u64::from(std::process::id()),
            uptime_seconds: self.started.elapsed().as_secs_f64(),
            protocol_revision: PROTOCOL_REVISION,
        }
    }

    /// The registered function an execution request names, after checking its hash and
    /// arguments; every refusal is counted. Unary and streamed requests share it so that
    /// they are refused alike.
    fn checked_function(
        &self,
        function_hash: &[u8],
        args: Option<&pb::Value>,
    ) -> Result<StoredFunction, Status> {
        let hash = validate::function_hash(function_hash)
            .and_then(|hash| validate::value(args, "args").map(|()| hash))
            .map_err(|s| self.stats.reject(s))?;
        self.lookup(&hash)
    }

    /// The job for a `RunClosure` request, unary or streamed.
    pub(super) fn run_job(&self, request: pb::RunClosureRequest) -> Result<JobRequest, Status> {
        let function = self.checked_function(&request.function_hash, request.args.as_ref())?;
        Ok(JobRequest::Run {
            closure_id: request.closure_id,
            function,
            args: request.args,
        })
    }

    fn lookup(&self, hash: &[u8; HASH_LEN]) -> Result<StoredFunction, Status> {
        self.store.get(hash).ok_or_else(|| {
            self.stats.reject(Status::not_found(format!(
                "worker {} holds no function with hash 0x{}; call RegisterFunction with its \
                 payload first (a restarted worker has lost its functions)",
                self.worker_index,
                validate::hex(hash)
            )))
        })
    }

    /// Queues `request` for the executor and waits for its answer.
    async fn submit(&self, request: JobRequest) -> Result<JobReply, Status> {
        let receiver = self.queue.push(request)?;
        receiver.await.unwrap_or_else(|_| {
            Err(Status::internal(
                "the worker's executor stopped before answering this request",
            ))
        })
    }

    /// Refuses a response above the size limit before tonic tries to encode it.
    fn check_size<M: Message>(&self, message: &M, what: &str) -> Result<(), Status> {
        let size = message.encoded_len();
        if size > self.max_message_bytes {
            return Err(self
                .stats
                .reject(too_large(what, size, self.max_message_bytes)));
        }
        Ok(())
    }
}

fn mismatched() -> Status {
    Status::internal("the worker's executor answered with a reply of the wrong kind (a bug)")
}

/// The `jaxcluster.v1.Worker` service.
pub struct WorkerService {
    shared: Arc<Shared>,
}

impl WorkerService {
    /// A service over `shared`.
    pub fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }
}

#[tonic::async_trait]
impl pb::worker_server::Worker for WorkerService {
    async fn get_status(
        &self,
        _request: Request<pb::GetStatusRequest>,
    ) -> Result<Response<pb::GetStatusResponse>, Status> {
        Ok(Response::new(self.shared.status()))
    }

    async fn list_devices(
        &self,
        _request: Request<pb::ListDevicesRequest>,
    ) -> Result<Response<pb::ListDevicesResponse>, Status> {
        Ok(Response::new(pb::ListDevicesResponse {
            devices: self.shared.devices.clone(),
        }))
    }

    async fn register_function(
        &self,
        request: Request<pb::RegisterFunctionRequest>,
    ) -> Result<Response<pb::RegisterFunctionResponse>, Status> {
        let shared = &self.shared;
        let request = request.into_inner();
        let checked = validate::function_hash(&request.function_hash).and_then(|hash| {
            let kind = validate::function_kind(request.kind)?;
            validate::function_payload(kind, &request.payload, &hash)?;
            Ok((hash, kind))
        });
        let (hash, kind) = checked.map_err(|s| shared.stats.reject(s))?;
        let already_registered = shared.store.insert(StoredFunction {
            hash,
            kind,
            payload: request.payload,
        });
        Ok(Response::new(pb::RegisterFunctionResponse {
            already_registered,
        }))
    }

    async fn run_closure(
        &self,
        request: Request<pb::RunClosureRequest>,
    ) -> Result<Response<pb::RunClosureResponse>, Status> {
        let shared = &self.shared;
        let job = shared.run_job(request.into_inner())?;
        let JobReply::Run(response) = shared.submit(job).await? else {
            return Err(mismatched());
        };
        shared.check_size(&response, "the closure's result")?;
        Ok(Response::new(response))
    }

    type RunClosuresStream = Replies;

    async fn run_closures(
        &self,
        request: Request<Streaming<pb::RunClosuresRequest>>,
    ) -> Result<Response<Self::RunClosuresStream>, Status> {
        Ok(Response::new(stream::serve(
            &self.shared,
            request.into_inner(),
        )))
    }

    async fn create_resource(
        &self,
        request: Request<pb::CreateResourceRequest>,
    ) -> Result<Response<pb::CreateResourceResponse>, Status> {
        let shared = &self.shared;
        let request = request.into_inner();
        let function = shared.checked_function(&request.function_hash, request.args.as_ref())?;
        let job = JobRequest::CreateResource {
            resource_id: request.resource_id,
            function,
            args: request.args,
        };
        let JobReply::CreateResource(response) = shared.submit(job).await? else {
            return Err(mismatched());
        };
        shared.check_size(&response, "the resource's creation error")?;
        Ok(Response::new(response))
    }

    async fn release_resource(
        &self,
        request: Request<pb::ReleaseResourceRequest>,
    ) -> Result<Response<pb::ReleaseResourceResponse>, Status> {
        let job = JobRequest::ReleaseResource {
            resource_ids: request.into_inner().resource_ids,
        };
        let JobReply::ReleaseResource(response) = self.shared.submit(job).await? else {
            return Err(mismatched());
        };
        Ok(Response::new(response))
    }
}
