//! The coordinator's dispatcher: moves closures from the [`ClosureQueue`] to workers, with
//! no Python anywhere on that path.
//!
//! # Pieces
//!
//! - [`Dispatcher`] (its `impl` split by concern in `dispatcher/`: the shared state and its
//!   views, membership, scheduling, per-worker work, metrics) owns the queue (`Work` items: closures, untagged; per-worker resource
//!   work, tagged with the worker index) and one **link** per worker (the `worker` job's
//!   addresses, in order: index = worker index).
//! - A link feeds its worker closures over one `RunClosures` stream. An idle link (nothing
//!   outstanding) blocks on the queue and sends what it gets; a busy link may queue up to
//!   `pipeline_depth` more on its worker (while their arguments hold less than
//!   `pipeline_bytes`), several per message, only while **no link is idle** — the
//!   contract's bounded pipelining — and takes them back (`return_queued`) when a link
//!   goes idle and finds the queue empty, so dispatch stays work-conserving as TF's: a
//!   closure never waits behind another on a busy worker while a worker is idle.
//!   A link is one state machine, its parts together in `link/`: the rule and its
//!   memory-ordering argument in `link/balance.rs`, the stream, the reclaiming and the
//!   measurements behind the depth in `link/pipeline.rs`, recovery in `link/recovery.rs`.
//!   Per-worker resource work (tagged items, served first) goes one item at a time, when
//!   nothing is outstanding.
//! - Outcomes land in [`ResultCell`]s; failures are [`ClosureFailure`]s; per-worker values
//!   are [`PerWorkerResource`]s; everything a worker is asked goes through the
//!   [`WorkerTransport`] trait (the tonic client for real, `fake` in tests and benches).
//!
//! # Threads, runtime and ownership
//!
//! Each link is a task on the process-wide runtime ([`crate::runtime`]): while idle it
//! awaits the queue (`ClosureQueue::get_async`, woken by a `tokio` `Notify` beside the
//! condvars Python's callers block on), while busy it awaits its stream's next message (or
//! a reclaim request, or the closure timeout). A link's state machine is still
//! straight-line code, as `async fn`s. Tasks, not threads: a coordinator of 1,000 workers
//! runs on the runtime's few threads, and an answer wakes a task on the thread that read it
//! instead of a parked thread per worker (measured with `cargo bench --bench scale`: at
//! 1,000 workers a thread per link cost 92 µs of coordinator CPU per closure, mostly futex
//! wake-ups; tasks cost 12 µs, and 2.5 µs at 10 and 100 workers). A link holds no
//! reference to itself across an await that another task could see (a link is `Send`, not
//! `Sync`), and takes no lock across one.
//!
//! The `Dispatcher` owns its links' join handles; links share an `Arc` of the dispatcher's
//! state (queue, registries, counters, link statuses). Closures own their arguments and
//! result cell and never refer back to the dispatcher, and resources refer to it weakly, so
//! nothing keeps a shut-down dispatcher alive. `shutdown()` (idempotent, also run on drop)
//! raises a stop signal that cancels every in-flight RPC and sleep, stops the queue (queued
//! closures are cancelled: their cells become aborted), and waits for the link tasks, which
//! put back (so cancel) whatever they held. The runtime itself is never dropped (see
//! [`crate::runtime`] for its fork rule).
//!
//! # Failures
//!
//! A user error settles the cell with the error; under `cancel_all` the queue also gets
//! `mark_failed` (raised by the next `schedule`/`join`/`done`, cancelling what is queued),
//! the worker halts the stream (`halt_on_error`: what it had queued comes back unstarted,
//! hence cancelled) and every other link takes back what its worker had queued.
//! A worker failure (unreachable, shutting down, or restarted, as `GetStatus` tells; a
//! broken stream) puts every closure outstanding on it back for another worker (at least
//! once) and sends the link `recovering`: its resources are
//! aborted, it probes with exponential backoff capped at 10 s, and when the worker answers
//! it forgets which functions the worker held and rebuilds every live resource before
//! serving again. After the recovery bound it is `given_up`; once every link has given up,
//! whatever remains or is scheduled later fails with `UNAVAILABLE` instead of hanging.
//!
//! A closure that failed because a **parameter server** was unreachable (the worker
//! reports the ps task in `ClosureError.ps_task`) is neither: TF's transient-ps-failure
//! rule (`ps_failures.rs`) puts it back while its ps task has fewer than
//! `TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES` (default 3) reports, and from then on
//! settles it with its `PSUnavailableError`.
//!
//! # Where this differs from the design contract, and why
//!
//! - Under `cancel_all`, once a closure failed no link *starts* another closure until the
//!   error is raised: a closure taken meanwhile is handed back, which cancels it, and the
//!   closures pipelined on workers are taken back and cancelled too. The one window left
//!   is the one an unpipelined dispatch also has: a closure already on its way to a worker
//!   (or queued there, if the closure ahead of it ends before the worker hears of the
//!   failure, a one-way trip later) still runs. TF's
//!   workers may still start queued closures in that window; here every closure queued when
//!   the failure happened ends cancelled, as SPEC §6 states, and none runs for nothing.
//! - The queue holds `Work`, not bare closures: per-worker resource builds and releases
//!   must travel as tagged items of the same queue, so they are served before that
//!   worker's next closure and wake its blocked link.
//! - A `RunClosure` that ends in an RPC error other than `UNAVAILABLE` (e.g. `INTERNAL`
//!   from a connection reset) is a worker failure only if a `GetStatus` probe finds the
//!   worker gone or restarted (a different `pid`); otherwise it is the closure's error. A
//!   `NOT_FOUND` function or a missing resource triggers the same probe, so a worker that
//!   restarted between two closures is rebuilt rather than failing them.
//! - A worker-reported `ERROR_KIND_INFRASTRUCTURE` puts the closure back up to three times,
//!   then fails it as `infra:INTERNAL`, so a deterministic executor bug cannot loop
//!   forever. `ERROR_KIND_FUNCTION_LOAD` counts as a user error: the user's own exception
//!   (e.g. `ModuleNotFoundError` on the worker) says the most.
//! - After a `closure_timeout` the closure goes back to the queue while its worker is
//!   polled until idle, so another idle worker takes it; with a single worker the retry
//!   runs there once it is idle. With a `closure_timeout` there is no pipelining (an
//!   execution's clock starts when it is sent, which is when it starts only on an idle
//!   worker), and the link times it: the stream carries no deadline.
//! - A closure whose worker died under it runs again at most `max_closure_retries` times
//!   (default 3, as Ray's `max_retries`; `None` is TF's unbounded retry), then fails with
//!   `WorkerCrashedError` naming each death (`deaths.rs`). A worker that dies between
//!   closures costs no closure anything.
//! - A worker running closures that sends nothing (not even a heartbeat) for
//!   `heartbeat_timeout` (5 s) is declared failed; TF relies on its RPC layer, which here
//!   would take the HTTP/2 keepalive's 35-40 s. Its queued closures run elsewhere and the
//!   worker's lease on them has expired, so it never starts them (`worker/stream.rs`).
//! - When no worker at all has answered `connect_timeout` (60 s) after the dispatcher
//!   started, scheduling fails with `UnavailableError` naming every address and its last
//!   error, instead of waiting out the recovery bound (TF's 3600 s) in silence; the links
//!   keep trying, and the first worker to answer ends that state.
//! - Closures travel on `RunClosures` streams only; unary `RunClosure` stays in the
//!   protocol for other clients (e.g. `grpcio`), and for workers of protocol revision 1
//!   (before `RunClosures`): the client emulates the stream over unary calls for them
//!   (`rpc::client::emulated`), one closure per round trip, without pipelining's gain.
//! - A closure handed back unstarted (reclaimed, or halted by another's failure) is not a
//!   retry: `retried` counts executions that started (or may have) and must run again.
//! - Scheduling with a released per-worker resource is refused at once (`InvalidArgument`)
//!   instead of failing when the closure runs; a release racing a queued closure still
//!   fails that closure with an input error.
//! - The staggered-start aliases are `JAXCLUSTER_COORDINATOR_SCHEDULE_START_DELAY(_MAX)`;
//!   they win over the `TF_` names, and fractional seconds are accepted.

mod cell_watch;
mod closure;
pub mod config;
pub(crate) mod deaths;
mod dispatcher;
pub mod failure;
/// Built only for tests and benches (`cfg(test)`, or the `testing` feature that the
/// crate's dev-dependency on itself turns on), never into the wheel.
#[cfg(any(test, feature = "testing"))]
pub mod fake;
pub mod functions;
mod link;
pub mod metrics;
mod ps_failures;
pub mod resources;
pub mod result_cell;
mod slices;
mod status;
pub mod transport;
pub mod versions;

#[cfg(test)]
mod tests;

use std::sync::Arc;

pub use cell_watch::CellWatch;
pub use closure::Closure;
pub use config::{BackoffConfig, DispatcherConfig, ErrorPolicy, StartDelay};
pub use dispatcher::{Dispatcher, MetricsSnapshot, Removal};
pub use failure::{ClosureFailure, FailureKind};
pub use functions::{FunctionHash, FunctionKind};
pub use metrics::LatencySnapshot;
pub use resources::{PerWorkerResource, ResourceState, ResourceStatus};
pub use result_cell::{CellStatus, EncodedValue, Interrupted, Outcome, ResultCell};
pub use status::{LinkState, WorkerSnapshot};
pub use transport::WorkerTransport;
pub use versions::Versions;

pub(crate) use dispatcher::Shared;

/// Why a dispatcher call did not do what was asked.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DispatchError {
    /// A bad argument or setting; the message says what was seen and what is expected.
    #[error("{0}")]
    InvalidArgument(String),
    /// A closure failed (`error_policy = cancel_all`): raised once, after every queued
    /// closure was cancelled and nothing is running any more.
    #[error("a closure failed: {0}")]
    ClosureFailed(Arc<ClosureFailure>),
    /// No worker could be reached within `connect_timeout` of the dispatcher's start; the
    /// message names every worker and its last error.
    #[error("{0}")]
    Unavailable(String),
    /// The dispatcher was shut down; a closure given to the failing call was cancelled.
    #[error("the dispatcher was shut down")]
    Stopped,
    /// The caller's deadline passed first.
    #[error("the deadline passed before the dispatcher call completed")]
    TimedOut,
    /// The caller's interrupt check asked to stop waiting (Ctrl-C in Python).
    #[error("interrupted while waiting")]
    Interrupted,
    /// The shared async runtime cannot be used (e.g. in a forked child).
    #[error(transparent)]
    Runtime(#[from] crate::runtime::RuntimeError),
    /// A broken invariant inside the dispatcher.
    #[error("internal dispatcher error: {0}")]
    Internal(String),
}
