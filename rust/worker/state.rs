//! [`WorkerState`]: the one state a worker's RPC handlers, its stream readers, the server
//! handle and the executor share, and what every request does with it before it becomes
//! a job (validation, lookups, size checks).
//!
//! The tonic handlers in `service.rs` only translate between messages and these methods,
//! so unary and streamed requests are checked, refused and counted by the same code.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use prost::Message;
use tonic::Status;

use super::acks::Farewells;
use super::jobs::{JobQueue, JobReply, JobRequest};
use super::peers::PeerPulls;
use super::preemption::Preemption;
use super::reads::ReadQueue;
use super::stats::{value_bytes, Stats};
use super::store::{FunctionStore, StoredFunction};
use super::validate;
use crate::rpc::server::connections::{connection_info, ConnectionInfo, ConnectionStats};
use crate::rpc::server::sessions::{SessionRegistry, SessionSnapshot};
use crate::rpc::wire::limits::too_large;
use crate::rpc::wire::session::SessionId;
use crate::rpc::{hex, pb, HASH_LEN, PROTOCOL_REVISION};

/// State shared by the service, the stream readers, the server handle and the executor.
pub struct WorkerState {
    /// `--index` of this worker.
    pub worker_index: i64,
    /// Reported in `GetStatus`.
    pub jax_version: String,
    /// Reported in `GetStatus`.
    pub platform: String,
    /// Reported in `GetStatus` (`major.minor.micro`; empty: not known).
    pub python_version: String,
    /// Reported by `ListDevices` (their number by `GetStatus`).
    pub devices: Vec<pb::Device>,
    /// The devices' `device_kind`, reported by `GetStatus`.
    pub device_kind: String,
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
    /// How the previous worker process on this address ended, if its launcher said.
    pub previous_exit: String,
    /// Connections admitted and dropped (shared with the accept loop).
    pub connections: Arc<ConnectionStats>,
    /// Random per server; a restart changes it (see `GetStatusResponse.incarnation`).
    pub incarnation: u64,
    /// The slice this worker is a host of, if any (see `GetStatusResponse.slice`).
    pub slice: Option<pb::SliceMembership>,
    /// The preemption notice, once one arrived (see `preemption.rs`).
    pub preemption: Arc<Preemption>,
    /// The streams being read, which a drain waits on until their answers are
    /// acknowledged.
    pub farewells: Farewells,
    /// The sessions holding values here, and when each is released.
    pub sessions: Arc<SessionRegistry>,
    /// (Dataflow.) `ReadValue` calls waiting for the reader thread.
    pub reads: ReadQueue,
    /// (Dataflow.) Clients for pulling kept values from peers.
    pub peers: PeerPulls,
}

impl WorkerState {
    /// The `GetStatus` answer right now.
    pub fn status(&self) -> pb::GetStatusResponse {
        let (queued, inflight) = self.queue.depth();
        let notice = self.preemption.notice().cloned();
        let state = if notice.is_some() {
            pb::ServingState::Preempting
        } else if self.queue.is_draining() {
            pb::ServingState::Draining
        } else {
            pb::ServingState::Serving
        };
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        pb::GetStatusResponse {
            state: state.into(),
            worker_index: self.worker_index,
            jaxcluster_version: env!("CARGO_PKG_VERSION").to_owned(),
            jax_version: self.jax_version.clone(),
            python_version: self.python_version.clone(),
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
            previous_exit: self.previous_exit.clone(),
            connections_open: load(&self.connections.open),
            connections_dropped: load(&self.connections.dropped),
            incarnation: self.incarnation,
            last_error: self.stats.last_error(),
            device_count: self.devices.len() as u32,
            device_kind: self.device_kind.clone(),
            closure_bytes_received: load(&self.stats.bytes_received),
            closure_bytes_sent: load(&self.stats.bytes_sent),
            slice: self.slice,
            preemption: notice,
            sessions: self
                .sessions
                .snapshot()
                .iter()
                .map(SessionSnapshot::to_proto)
                .collect(),
            state_ttl_seconds: self.sessions.ttl().as_secs_f64(),
            peer_bytes_sent: load(&self.stats.peer_bytes_sent),
            peer_bytes_received: load(&self.stats.peer_bytes_received),
            peer_reads_served: load(&self.stats.peer_reads_served),
            peer_pulls: load(&self.stats.peer_pulls),
        }
    }

    /// The session a call belongs to (its metadata), recorded as active on its connection
    /// (so the session's ttl starts only once every connection that carried it closed);
    /// a malformed id is refused and counted.
    pub fn session_of(
        &self,
        metadata: &tonic::metadata::MetadataMap,
        extensions: &tonic::Extensions,
    ) -> Result<SessionId, Status> {
        let session = SessionId::from_metadata(metadata).map_err(|s| self.stats.reject(s))?;
        let info = connection_info(extensions);
        if self.sessions.touch(&session, info.map(ConnectionInfo::id)) {
            if let Some(info) = info {
                let registry = Arc::downgrade(&self.sessions);
                let connection = info.id();
                info.on_close(move || {
                    if let Some(registry) = registry.upgrade() {
                        registry.connection_closed(connection);
                    }
                });
            }
        }
        Ok(session)
    }

    /// Queues `request` of `session` for the executor and waits for its answer.
    pub async fn submit_as(
        &self,
        session: &SessionId,
        request: JobRequest,
    ) -> Result<JobReply, Status> {
        self.await_reply(self.queue.push_as(session, request)?)
            .await
    }

    /// Queues a preemption save of `session` and waits for the executor's answer. Only a
    /// worker that announced its preemption takes one while draining (see
    /// [`JobQueue::push_preemption_save`]); otherwise it is queued as any job.
    pub async fn submit_preemption_save(
        &self,
        session: &SessionId,
        request: JobRequest,
    ) -> Result<JobReply, Status> {
        let receiver = if self.preemption.notice().is_some() {
            self.queue.push_preemption_save(session, request)?
        } else {
            self.queue.push_as(session, request)?
        };
        self.await_reply(receiver).await
    }

    async fn await_reply(
        &self,
        receiver: tokio::sync::oneshot::Receiver<Result<JobReply, Status>>,
    ) -> Result<JobReply, Status> {
        receiver.await.unwrap_or_else(|_| {
            Err(Status::internal(
                "the worker's executor stopped before answering this request",
            ))
        })
    }

    /// Checks and stores a function payload; `already_registered` when its hash was held.
    /// Every refusal is counted.
    pub fn register(
        &self,
        request: pb::RegisterFunctionRequest,
    ) -> Result<pb::RegisterFunctionResponse, Status> {
        let checked = validate::function_hash(&request.function_hash).and_then(|hash| {
            let kind = validate::function_kind(request.kind)?;
            validate::function_payload(kind, &request.payload, &hash)?;
            Ok((hash, kind))
        });
        let (hash, kind) = checked.map_err(|s| self.stats.reject(s))?;
        let already_registered = self
            .store
            .insert(StoredFunction {
                hash,
                kind,
                payload: request.payload,
            })
            .map_err(|s| self.stats.reject(s))?;
        Ok(pb::RegisterFunctionResponse { already_registered })
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

    fn count_received(&self, args: Option<&pb::Value>) {
        if let Some(args) = args {
            self.stats
                .bytes_received
                .fetch_add(value_bytes(args), Ordering::Relaxed);
        }
    }

    /// The job for a `RunClosure` request, unary or streamed.
    pub fn run_job(&self, request: pb::RunClosureRequest) -> Result<JobRequest, Status> {
        let function = self.checked_function(&request.function_hash, request.args.as_ref())?;
        self.count_received(request.args.as_ref());
        Ok(JobRequest::Run {
            closure_id: request.closure_id,
            function,
            args: request.args,
            worker_index: request.worker_index,
            keep_result_id: request.keep_result_id,
        })
    }

    /// (Dataflow.) The value `session` kept here under `value_id`, encoded by the reader
    /// thread (never queued behind closures); counted as served. `NOT_FOUND` from the
    /// reader when the session holds no such value.
    pub async fn read_value(
        &self,
        session: &SessionId,
        value_id: u64,
    ) -> Result<pb::Value, Status> {
        let receiver = self.reads.push(session, value_id)?;
        let value = receiver.await.unwrap_or_else(|_| {
            Err(Status::internal(
                "the worker's reader stopped before answering this read",
            ))
        })?;
        self.stats.peer_reads_served.fetch_add(1, Ordering::Relaxed);
        self.stats
            .peer_bytes_sent
            .fetch_add(value_bytes(&value), Ordering::Relaxed);
        Ok(value)
    }

    /// The job for a `CreateResource` request.
    pub fn create_resource_job(
        &self,
        request: pb::CreateResourceRequest,
    ) -> Result<JobRequest, Status> {
        let function = self.checked_function(&request.function_hash, request.args.as_ref())?;
        self.count_received(request.args.as_ref());
        Ok(JobRequest::CreateResource {
            name: request.name,
            resource_id: request.resource_id,
            function,
            args: request.args,
            worker_index: request.worker_index,
        })
    }

    /// The function stored under `hash`; `NOT_FOUND` (counted) says how to recover, since
    /// a restarted worker has lost what was registered.
    fn lookup(&self, hash: &[u8; HASH_LEN]) -> Result<StoredFunction, Status> {
        self.store.get(hash).ok_or_else(|| {
            self.stats.reject(Status::not_found(format!(
                "worker {} holds no function with hash 0x{}; call RegisterFunction with its \
                 payload first (a restarted worker has lost its functions)",
                self.worker_index,
                hex(hash)
            )))
        })
    }

    /// Queues `request` of the anonymous session and waits for its answer.
    pub async fn submit(&self, request: JobRequest) -> Result<JobReply, Status> {
        self.submit_as(&SessionId::anonymous(), request).await
    }

    /// Refuses a response above the size limit before tonic tries to encode it.
    pub fn check_size<M: Message>(&self, message: &M, what: &str) -> Result<(), Status> {
        let size = message.encoded_len();
        if size > self.max_message_bytes {
            return Err(self
                .stats
                .reject(too_large("worker", what, size, self.max_message_bytes)));
        }
        Ok(())
    }
}
