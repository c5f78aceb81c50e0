//! A job: one request for the executor thread, and the answering of it — to a unary call's
//! oneshot or on its `RunClosures` stream, counted in the worker's stats as it is answered,
//! halting a `halt_on_error` stream when it failed. A job dropped unanswered still answers
//! (`INTERNAL`), so no caller hangs. The queue that hands jobs out is `jobs.rs`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::oneshot;
use tonic::Status;

use super::JobQueue;
use crate::rpc::pb;
use crate::rpc::wire::session::SessionId;
use crate::worker::stats::{value_bytes, Stats};
use crate::worker::store::StoredFunction;
use crate::worker::stream::ClosureStream;

/// What a closure gave: its result or its error.
pub type Ran = pb::run_closure_response::Outcome;

/// What a job asks the executor to do.
#[derive(Debug, Clone)]
pub enum JobRequest {
    /// Run `function` on `args` and reply with its result or error.
    Run {
        /// The coordinator's closure id, echoed back.
        closure_id: u64,
        /// The registered function.
        function: StoredFunction,
        /// Pickled `(args, kwargs)`; `None` for no arguments.
        args: Option<pb::Value>,
        /// The coordinator's index for this worker, when it sent one.
        worker_index: Option<i64>,
        /// (Dataflow.) Keep the result here under this id of the job's session and answer
        /// with its `KeptInfo` instead of the value.
        keep_result_id: Option<u64>,
    },
    /// Run `function` on `args` and keep the result as resource `resource_id`.
    CreateResource {
        /// Id chosen by the coordinator.
        resource_id: u64,
        /// The registered function.
        function: StoredFunction,
        /// Pickled `(args, kwargs)`; `None` for no arguments.
        args: Option<pb::Value>,
        /// The coordinator's index for this worker, when it sent one.
        worker_index: Option<i64>,
        /// Named state: adopt a live value of this name instead of running `function`
        /// (empty: an ordinary resource).
        name: String,
    },
    /// Drop these resources.
    ReleaseResource {
        /// Ids to drop; unknown ones are ignored.
        resource_ids: Vec<u64>,
    },
    /// Drop every value of the job's session (it ended, or vanished `--state-ttl` ago).
    ReleaseSession,
}

impl JobRequest {
    /// Whether this job runs user code (and so is refused while draining).
    pub(super) fn runs_code(&self) -> bool {
        !matches!(self, Self::ReleaseResource { .. } | Self::ReleaseSession)
    }

    /// The closure id of a `Run` job.
    fn closure_id(&self) -> u64 {
        match self {
            Self::Run { closure_id, .. } => *closure_id,
            _ => 0,
        }
    }
}

/// The executor's answer to a job; the variant matches the request's.
#[derive(Debug, Clone)]
pub enum JobReply {
    /// Answer to [`JobRequest::Run`]: the closure's result or error, nothing else. The
    /// message its caller reads is built from it once, under the request's closure id, by
    /// whoever sends it: a `RunClosureResponse` for a unary call (`service.rs`), a
    /// `ClosureReply` for a stream ([`ClosureStream::prepare`]).
    Run(Ran),
    /// Answer to [`JobRequest::CreateResource`].
    CreateResource(pb::CreateResourceResponse),
    /// Answer to [`JobRequest::ReleaseResource`].
    ReleaseResource(pb::ReleaseResourceResponse),
}

pub(super) type ReplySender = oneshot::Sender<Result<JobReply, Status>>;

/// Where a job's answer goes.
pub(super) enum ReplyTo {
    /// A unary call awaiting its oneshot.
    Call(ReplySender),
    /// A closure of a `RunClosures` stream.
    Stream(Arc<ClosureStream>),
}

/// A request taken by the executor. Answer it with [`Job::reply`] or [`Job::reply_status`];
/// a job dropped unanswered replies `INTERNAL`, so its caller never hangs.
pub struct Job {
    pub(super) request: JobRequest,
    /// The session the request came from: what it creates or uses is that session's.
    pub(super) session: SessionId,
    pub(super) reply: Option<ReplyTo>,
    /// Set once popped: answering or dropping the job ends its inflight period.
    pub(super) queue: Option<Arc<JobQueue>>,
    /// When the executor took it, for the execution-time histogram.
    pub(super) started: Option<Instant>,
}

impl Job {
    /// What the job asks for.
    pub fn request(&self) -> &JobRequest {
        &self.request
    }

    /// The session the job belongs to.
    pub fn session(&self) -> &SessionId {
        &self.session
    }

    /// Answers the job; counts finished closures and created/released resources.
    pub fn reply(mut self, reply: JobReply) {
        if let Some(queue) = &self.queue {
            count_reply(&queue.stats, &reply);
            self.time_execution(&queue.stats);
        }
        self.send(Ok(reply));
    }

    /// Answers the job with an RPC error instead of a response.
    pub fn reply_status(mut self, status: Status) {
        if let (Some(queue), JobRequest::Run { .. }) = (&self.queue, &self.request) {
            queue.stats.closures_run.fetch_add(1, Ordering::Relaxed);
            queue.stats.closures_failed.fetch_add(1, Ordering::Relaxed);
            queue
                .stats
                .note_error(&format!("{:?}: {}", status.code(), status.message()));
            self.time_execution(&queue.stats);
        }
        self.send(Err(status));
    }

    /// Records how long a closure ran (from the executor taking it to its answer).
    fn time_execution(&self, stats: &Stats) {
        if let (JobRequest::Run { .. }, Some(started)) = (&self.request, self.started) {
            stats.execution.observe(started.elapsed());
        }
    }

    pub(super) fn send(&mut self, result: Result<JobReply, Status>) {
        match self.reply.take() {
            // The caller may have gone away (cancelled or timed out); nothing to do then.
            Some(ReplyTo::Call(sender)) => drop(sender.send(result)),
            Some(ReplyTo::Stream(stream)) => {
                self.answer_streamed(&stream, result);
                // Only now, with the answer owed in the stream's ledger (`acks.rs`): a
                // draining reader that sees nothing running and nothing owed may end the
                // stream. (The message carrying the answer may still name the closure as
                // running; the coordinator has settled it by then.)
                if self.queue.is_some() {
                    stream.lease().set_running(0);
                    stream.notify_answered();
                }
            }
            None => {}
        }
        if let Some(queue) = self.queue.take() {
            queue.finish_one();
        }
    }

    /// Sends a streamed closure's answer. An error halts a `halt_on_error` stream first
    /// (so the coordinator's `resume`, sent after it reads the error, finds the halt), and
    /// the closures the halt hands back are answered after the error.
    fn answer_streamed(&self, stream: &Arc<ClosureStream>, result: Result<JobReply, Status>) {
        let reply =
            match result {
                Ok(JobReply::Run(ran)) => stream
                    .prepare(self.request.closure_id(), ran)
                    .inspect_err(|_| {
                        if let Some(queue) = &self.queue {
                            queue.stats.rejected.fetch_add(1, Ordering::Relaxed);
                        }
                    }),
                Ok(_) => Err(Status::internal(
                    "the worker's executor answered a streamed closure with a reply of the wrong \
                 kind (a bug)",
                )),
                Err(status) => Err(status),
            };
        let failed = !matches!(&reply, Ok(answer) if answer.is_success());
        let halted = match &self.queue {
            Some(queue) if failed => queue.halt_stream(stream),
            _ => Vec::new(),
        };
        match reply {
            Ok(answer) => stream.send(answer),
            Err(status) => stream.refuse(self.request.closure_id(), &status),
        }
        hand_back(halted, HALT_REASON);
    }

    /// The stream this job answers on, if any.
    pub(super) fn stream(&self) -> Option<&Arc<ClosureStream>> {
        match &self.reply {
            Some(ReplyTo::Stream(stream)) => Some(stream),
            _ => None,
        }
    }

    /// Answers a queued streamed closure `returned`, unstarted.
    fn hand_back(mut self, reason: &str) {
        if let Some(ReplyTo::Stream(stream)) = self.reply.take() {
            stream.hand_back(self.request.closure_id(), reason);
        }
    }
}

/// Counts one answered job.
fn count_reply(stats: &Stats, reply: &JobReply) {
    match reply {
        JobReply::Run(ran) => {
            stats.closures_run.fetch_add(1, Ordering::Relaxed);
            match ran {
                Ran::Error(error) => {
                    stats.closures_failed.fetch_add(1, Ordering::Relaxed);
                    stats.note_error(&format!("{}: {}", error.type_name, error.message));
                }
                Ran::Result(value) => {
                    stats
                        .bytes_sent
                        .fetch_add(value_bytes(value), Ordering::Relaxed);
                }
            }
        }
        JobReply::CreateResource(response) => {
            if response.error.is_none() {
                stats.resources_created.fetch_add(1, Ordering::Relaxed);
            }
        }
        JobReply::ReleaseResource(response) => {
            stats
                .resources_released
                .fetch_add(u64::from(response.released), Ordering::Relaxed);
        }
    }
}

pub(super) const HALT_REASON: &str =
    "a closure sent before it on this stream failed, and the stream \
                           halts on errors (halt_on_error) until the coordinator resumes it";

/// Answers each of `jobs` `returned`, unstarted.
pub(super) fn hand_back(jobs: Vec<Job>, reason: &str) {
    for job in jobs {
        job.hand_back(reason);
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if self.reply.is_some() || self.queue.is_some() {
            self.send(Err(Status::internal(
                "the worker's executor dropped this request without answering it (a bug in \
                 the worker); it may or may not have run",
            )));
        }
    }
}
