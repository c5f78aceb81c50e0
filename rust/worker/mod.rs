//! The tonic server a worker process hosts.
//!
//! RPC handlers run on the shared tokio runtime; code runs on one executor thread that
//! takes [`Job`]s with [`WorkerServer::next_job`] (in a worker process that thread is
//! Python's, waiting with the GIL released). Closures arrive by unary `RunClosure` or on
//! `RunClosures` streams; both become jobs of the one queue, in arrival order. Auth runs
//! on every RPC before its body is decoded; requests are validated before any lookup; one
//! job runs at a time.
//!
//! # Modules
//!
//! Each file depends only on the ones listed after it, so there is no import cycle:
//!
//! - `service.rs`: the tonic `Worker` impl, nothing else; each handler calls the state.
//! - `reader.rs`: the task reading one `RunClosures` stream into jobs.
//! - `state.rs`: [`state::WorkerState`], the one state everything shares, and what a
//!   request goes through before it is a job (validation, lookup, size checks).
//! - `acks.rs`: what a draining worker still owes: answers not acknowledged, and the
//!   streams the drain waits on.
//! - `jobs.rs`: the job queue between handlers and the executor: jobs, answers and their
//!   counting, the shutdown protocol, and which streams are halted (under its own lock).
//! - `stream.rs`: a stream's reply sink and the response stream that batches its answers.
//! - `preemption.rs`: the preemption notice held, and telling the open streams of it.
//! - `reads.rs`, `peers.rs`: dataflow: `ReadValue` calls waiting for the reader thread,
//!   and this worker's pulls of kept values from its peers.
//! - `stats.rs`, `store.rs`, `validate.rs`: counters, the function store, request checks.
//!
//! Shutdown is two-phase: [`WorkerServer::begin_shutdown`] stops taking closures (new and
//! queued ones get `UNAVAILABLE`, so a coordinator retries them elsewhere; open streams
//! end once their answers are acknowledged) while the one in progress finishes;
//! [`WorkerServer::wait_acknowledged`] waits for those acknowledgements, up to the drain
//! deadline, and [`WorkerServer::release_streams`] names the answers that were not;
//! [`WorkerServer::stop_serving`] then closes the listener and lets in-flight RPCs
//! complete.

pub mod acks;
pub mod jobs;
mod outgoing;
pub mod peers;
pub mod preemption;
mod reader;
pub mod reads;
mod route;
pub mod service;
pub mod state;
pub mod stats;
pub mod store;
pub mod stream;
pub mod validate;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tonic::service::interceptor::InterceptedService;

pub use jobs::{Job, JobReply, JobRequest, Pop, Ran};

use crate::rpc::pb;
use crate::rpc::security::auth::{validate_token, AuthCheck};
use crate::rpc::server::connections::{ConnectionStats, ServerLimits};
use crate::rpc::server::serve::{self, BindError, Serving};
use crate::rpc::server::sessions::{Held, SessionRegistry, DEFAULT_TTL};
use crate::rpc::wire::limits::{
    validate_max_message_bytes, DEFAULT_MAX_MESSAGE_BYTES, MAX_FRAME_BYTES,
};
use crate::rpc::wire::session::SessionId;
use jobs::JobQueue;
use service::WorkerService;
use state::WorkerState;
use stats::Stats;
use store::FunctionStore;

/// How to start a worker server.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// `HOST:PORT` to bind; port 0 picks a free port.
    pub address: String,
    /// Token every request must carry; required unless every bound address is loopback.
    pub auth_token: Option<String>,
    /// This worker's index in its job, reported by `GetStatus`.
    pub worker_index: i64,
    /// Largest request or response, in bytes.
    pub max_message_bytes: usize,
    /// Reported by `ListDevices`.
    pub devices: Vec<pb::Device>,
    /// Reported by `GetStatus`.
    pub jax_version: String,
    /// Reported by `GetStatus`: the interpreter's `major.minor.micro` (empty: not known).
    pub python_version: String,
    /// Reported by `GetStatus` (`cpu`, `gpu`, `tpu`).
    pub platform: String,
    /// Reported by `GetStatus`: the devices' `device_kind` (e.g. `"TPU v5 lite"`).
    pub device_kind: String,
    /// Serve TLS with this certificate and key; plaintext when `None`.
    pub tls: Option<crate::rpc::security::tls::ServerTls>,
    /// Connections, streams per connection, and the time to authenticate.
    pub limits: ServerLimits,
    /// Bytes of registered function payloads kept (least recently used evicted first).
    pub max_function_bytes: usize,
    /// How the previous worker process on this address ended (reported by `GetStatus`);
    /// empty when unknown.
    pub previous_exit: String,
    /// The slice this worker is a host of, reported by `GetStatus`; `None` on its own.
    pub slice: Option<pb::SliceMembership>,
    /// How long the values of a session that vanished (its last connection closed
    /// without `EndSession`) are kept (`--state-ttl`; zero: released at once).
    pub state_ttl: Duration,
    /// (Dataflow.) TLS to verify peers with when pulling kept values from them; `None`:
    /// plaintext (a worker serving TLS needs its peers' CA here to pull from them).
    pub peer_tls: Option<crate::rpc::security::tls::ClientTls>,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            address: "127.0.0.1:0".to_owned(),
            auth_token: None,
            worker_index: 0,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            devices: Vec::new(),
            jax_version: String::new(),
            python_version: String::new(),
            platform: String::new(),
            device_kind: String::new(),
            tls: None,
            limits: ServerLimits::default(),
            max_function_bytes: store::DEFAULT_MAX_FUNCTION_BYTES,
            previous_exit: String::new(),
            slice: None,
            state_ttl: DEFAULT_TTL,
            peer_tls: None,
        }
    }
}

/// Why a worker server could not start or stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// A setting is invalid; the message says which and what is expected.
    #[error("{0}")]
    Config(String),
    /// The address could not be resolved or bound.
    #[error("could not bind worker address {address:?}: {source}")]
    Bind {
        /// The address as given.
        address: String,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The server stopped with an error.
    #[error("the worker's gRPC server failed: {0}")]
    Serve(String),
}

/// Bound on connecting to a peer holding a kept value: a holder that does not answer in
/// this time is reported gone (the coordinator re-makes the value).
const PEER_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A running worker server; dropping it stops serving.
pub struct WorkerServer {
    // Declared first so that, after `drop` has begun draining, serving stops before
    // anything else goes.
    serving: Serving,
    local_addr: SocketAddr,
    state: Arc<WorkerState>,
    /// The tasks logging that draining began and that a preemption notice arrived, so a
    /// shutdown can let them finish before the process exits (each needs the GIL, which
    /// the caller holds while the drain begins; a task not awaited can lose its line).
    pending_logs: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl From<BindError> for WorkerError {
    fn from(error: BindError) -> Self {
        match error {
            BindError::Failed { address, source } => Self::Bind { address, source },
            BindError::Insecure(message) => Self::Config(message),
        }
    }
}

impl WorkerServer {
    /// Binds, then serves on the current tokio runtime until [`WorkerServer::stop_serving`].
    pub async fn start(config: WorkerConfig) -> Result<Self, WorkerError> {
        let limit =
            validate_max_message_bytes(config.max_message_bytes).map_err(WorkerError::Config)?;
        if let Some(token) = &config.auth_token {
            validate_token(token).map_err(WorkerError::Config)?;
        }
        let limits = config.limits.validate().map_err(WorkerError::Config)?;
        if config.max_function_bytes == 0 {
            return Err(WorkerError::Config(
                "max_function_bytes=0 would refuse every function; expected a positive number \
                 of bytes (default 1 GiB)"
                    .to_owned(),
            ));
        }
        let exposes = "run code on this machine";
        let (listener, local_addr) =
            serve::bind(&config.address, config.auth_token.is_some(), exposes).await?;
        let counters = Arc::new(Stats::default());
        let connections = Arc::new(ConnectionStats::default());
        let queue = Arc::new(JobQueue::new(Arc::clone(&counters), config.worker_index));
        let sessions = Arc::new(session_registry(
            config.state_ttl,
            Arc::clone(&queue),
            config.worker_index,
        ));
        sessions.spawn_sweeper();
        let peers = peers::PeerPulls::new(
            peers::PeerSettings {
                auth_token: config.auth_token.clone(),
                tls: config.peer_tls,
                max_message_bytes: limit,
                connect_timeout: PEER_CONNECT_TIMEOUT,
            },
            Arc::clone(&counters),
        );
        let state = Arc::new(WorkerState {
            worker_index: config.worker_index,
            jax_version: config.jax_version,
            python_version: config.python_version,
            platform: config.platform,
            devices: config.devices,
            device_kind: config.device_kind,
            max_message_bytes: limit,
            store: FunctionStore::new(config.max_function_bytes),
            queue,
            sessions,
            stats: Arc::clone(&counters),
            started: Instant::now(),
            previous_exit: config.previous_exit,
            connections: Arc::clone(&connections),
            incarnation: crate::rpc::new_incarnation(),
            slice: config.slice,
            preemption: Arc::default(),
            farewells: acks::Farewells::default(),
            reads: reads::ReadQueue::default(),
            peers,
        });
        let service = pb::worker_server::WorkerServer::new(WorkerService::new(Arc::clone(&state)))
            .max_decoding_message_size(limit)
            .max_encoding_message_size(limit);
        let auth = AuthCheck::new(
            config.auth_token.as_deref(),
            Arc::clone(&counters.unauthenticated),
        );
        let router = serve::server(
            config.tls.as_ref(),
            Some(MAX_FRAME_BYTES),
            &limits,
            crate::rpc::wire::limits::rewrite_worker_status,
        )
        .map_err(|e| WorkerError::Config(e.to_string()))?
        .add_service(route::Routes::new(
            InterceptedService::new(service, auth.clone()),
            Arc::clone(&state),
            auth,
        ));
        Ok(Self {
            serving: Serving::spawn(router, listener, &limits, connections),
            local_addr,
            state,
            pending_logs: std::sync::Mutex::new(Vec::new()),
        })
    }

    /// The address actually bound (with the real port when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Blocks up to `timeout` for the next job. For the executor thread only.
    pub fn next_job(&self, timeout: Duration) -> Pop {
        self.state.queue.pop(timeout)
    }

    /// As [`Self::next_job`], but waits even while draining: a preempted worker's
    /// executor awaiting its coordinators' preemption saves (`preemption_save` reads).
    pub fn next_job_while_draining(&self, timeout: Duration) -> Pop {
        self.state.queue.pop_while_draining(timeout)
    }

    /// The next job if one is queued (and none is running); never waits.
    pub fn try_next_job(&self) -> Pop {
        self.state.queue.try_pop()
    }

    /// Stops taking closures; queued ones are answered `UNAVAILABLE`. Returns `false` if
    /// shutdown had already begun.
    pub fn begin_shutdown(&self) -> bool {
        let (queued, inflight) = self.state.queue.depth();
        if !self.state.queue.begin_drain() {
            return false;
        }
        let index = self.state.worker_index;
        let address = self.local_addr;
        self.log_from_runtime(move || {
            tracing::info!(
                target: crate::log_target::WORKER,
                "worker {index} on {address} is draining: new closures are refused \
                 (coordinators run them elsewhere), {queued} queued closure(s) handed \
                 back, {inflight} running to finish",
            );
        });
        true
    }

    /// A preemption notice arrived (`source`: `"gce"`, `"aws"`, `"signal"`; `deadline`:
    /// seconds since the Unix epoch, 0 if unknown): records it, so `GetStatus` and every
    /// stream report `preempting` (each open stream is told at once), logs it, and
    /// begins the drain, so queued closures go back to their coordinators unrun and the
    /// running one finishes. Returns `false` if a notice had arrived already (the drain
    /// still begins). Safe in a signal handler: nothing here logs from the caller.
    pub fn preempt(&self, source: &str, deadline: f64, detail: &str) -> bool {
        let notice = pb::PreemptionNotice {
            source: source.to_owned(),
            deadline_unix_seconds: deadline,
            detail: detail.to_owned(),
        };
        let first = self.state.preemption.announce(notice);
        if first {
            let index = self.state.worker_index;
            let address = self.local_addr;
            let (source, detail) = (source.to_owned(), detail.to_owned());
            let when = crate::rpc::describe_deadline(deadline);
            // INFO, as the drain's own line: the coordinators warn (naming the worker), and
            // a LocalCluster stopping its workers with SIGTERM stays quiet.
            self.log_from_runtime(move || {
                tracing::info!(
                    target: crate::log_target::WORKER,
                    source = source.as_str(),
                    "a preemption notice reached worker {index} on {address} ({source}: \
                     {detail}); {}; it takes no new closures and hands queued ones back",
                    when,
                );
            });
        }
        self.begin_shutdown();
        first
    }

    /// The preemption notice, if one arrived.
    pub fn preemption(&self) -> Option<pb::PreemptionNotice> {
        self.state.preemption.notice().cloned()
    }

    /// The tasks logging the drain and the preemption notice (see [`Self::begin_shutdown`],
    /// [`Self::preempt`]), once: await them without the GIL before the process may exit,
    /// or a line can be lost.
    pub fn take_pending_logs(&self) -> Vec<tokio::task::JoinHandle<()>> {
        std::mem::take(&mut *self.lock_logs())
    }

    /// Runs `log` on a task of the runtime, not on the caller (often a signal handler,
    /// where Python's logging must not run), and keeps the task for
    /// [`Self::take_pending_logs`].
    fn log_from_runtime(&self, log: impl FnOnce() + Send + 'static) {
        if let Ok(runtime) = crate::runtime::runtime() {
            let task = runtime.spawn(async move { log() });
            self.lock_logs().push(task);
        }
    }

    fn lock_logs(&self) -> std::sync::MutexGuard<'_, Vec<tokio::task::JoinHandle<()>>> {
        self.pending_logs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether shutdown has begun.
    pub fn is_draining(&self) -> bool {
        self.state.queue.is_draining()
    }

    /// Blocks up to `timeout` until shutdown has begun and no job is queued or running.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        self.state.queue.wait_idle(timeout)
    }

    /// Blocks up to `timeout` until every open stream has had its answers acknowledged by
    /// its coordinator (or was ended by it); call after [`WorkerServer::wait_idle`].
    pub fn wait_acknowledged(&self, timeout: Duration) -> bool {
        self.state.farewells.wait_closed(timeout)
    }

    /// Ends the streams still waiting for acknowledgements (the drain deadline passed);
    /// returns the closures whose answers were not acknowledged (empty: none).
    pub fn release_streams(&self) -> Vec<u64> {
        self.state.farewells.release()
    }

    /// The `GetStatus` answer right now.
    pub fn status(&self) -> pb::GetStatusResponse {
        self.state.status()
    }

    /// Records what `session` holds, as the executor counts it (shown by `GetStatus`).
    pub fn set_session_held(&self, session: &SessionId, held: Held) {
        self.state.sessions.set_held(session, held);
    }

    /// How long closures ran here (executor taking one to its answer), for metrics.
    pub fn execution_times(&self) -> crate::histogram::LatencySnapshot {
        self.state.stats.execution.snapshot()
    }

    /// Closes the listener and returns the serving task, which ends once in-flight RPCs
    /// have completed; `None` if already stopped. Call after [`WorkerServer::wait_idle`].
    pub fn stop_serving(&self) -> Option<JoinHandle<Result<(), tonic::transport::Error>>> {
        self.state.reads.close();
        self.serving.stop()
    }

    /// (Dataflow.) Blocks up to `timeout` for the next `ReadValue` call. For the reader
    /// thread only (see `reads.rs`).
    pub fn next_read(&self, timeout: Duration) -> reads::ReadPop {
        self.state.reads.pop(timeout)
    }

    /// (Dataflow.) Reads kept value `value_id` of `session` from the worker at `holder`
    /// (`host:port`), counted as a pull (see `peers.rs`). Must be awaited on the shared
    /// runtime.
    pub async fn pull_value(
        &self,
        holder: &str,
        session: &SessionId,
        value_id: u64,
        timeout: Option<Duration>,
    ) -> Result<pb::Value, crate::rpc::RpcError> {
        let client = self.state.peers.client(holder, session)?;
        self.state.peers.pull(client, value_id, timeout).await
    }

    /// Whether the server stopped serving reads (its reader thread can stop).
    pub fn reads_closed(&self) -> bool {
        self.state.reads.is_closed()
    }

    /// Whether pulls from peers verify them with TLS.
    pub fn pulls_use_tls(&self) -> bool {
        self.state.peers.uses_tls()
    }
}

/// The worker's sessions: a released session's values are dropped by the executor, as a
/// `ReleaseSession` job queued behind what the session sent before.
fn session_registry(ttl: Duration, queue: Arc<JobQueue>, worker_index: i64) -> SessionRegistry {
    SessionRegistry::new(ttl, move |session, why| {
        tracing::info!(
            target: crate::log_target::WORKER,
            "worker {worker_index}: releasing session {session} ({})",
            why.label()
        );
        // Nobody awaits the answer; a draining worker is dropping everything anyway.
        let _ = queue.push_as(session, JobRequest::ReleaseSession);
    })
}

impl Drop for WorkerServer {
    fn drop(&mut self) {
        // Queued closures are answered `UNAVAILABLE` before the serving task (a field,
        // dropped after this) is stopped and aborted; no stream waits for
        // acknowledgements any more.
        self.state.queue.begin_drain();
        self.state.farewells.release();
        self.state.reads.close();
    }
}

#[cfg(test)]
mod tests;
