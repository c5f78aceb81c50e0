//! The hand-off between async RPC handlers and the (Python) executor thread.
//!
//! Handlers push a [`Job`] and await its reply on a oneshot channel; one executor thread
//! pops jobs in arrival order, blocking on a condition variable (so the Python side can
//! wait with the GIL released), and runs them one at a time. The queue also owns the
//! shutdown protocol: once draining, new jobs are refused with `UNAVAILABLE`, queued ones
//! are handed back the same way, and [`JobQueue::wait_idle`] returns when the job in
//! progress has been answered.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tonic::Status;

use super::stats::Stats;
use super::store::StoredFunction;
use crate::rpc::pb;

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
    },
    /// Run `function` on `args` and keep the result as resource `resource_id`.
    CreateResource {
        /// Id chosen by the coordinator.
        resource_id: u64,
        /// The registered function.
        function: StoredFunction,
        /// Pickled `(args, kwargs)`; `None` for no arguments.
        args: Option<pb::Value>,
    },
    /// Drop these resources.
    ReleaseResource {
        /// Ids to drop; unknown ones are ignored.
        resource_ids: Vec<u64>,
    },
}

impl JobRequest {
    /// Whether this job runs user code (and so is refused while draining).
    fn runs_code(&self) -> bool {
        !matches!(self, Self::ReleaseResource { .. })
    }
}

/// The executor's answer to a job; the variant matches the request's.
#[derive(Debug, Clone)]
pub enum JobReply {
    /// Answer to [`JobRequest::Run`].
    Run(pb::RunClosureResponse),
    /// Answer to [`JobRequest::CreateResource`].
    CreateResource(pb::CreateResourceResponse),
    /// Answer to [`JobRequest::ReleaseResource`].
    ReleaseResource(pb::ReleaseResourceResponse),
}

type ReplySender = oneshot::Sender<Result<JobReply, Status>>;

/// A request taken by the executor. Answer it with [`Job::reply`] or [`Job::reply_status`];
/// a job dropped unanswered replies `INTERNAL`, so its caller never hangs.
pub struct Job {
    request: JobRequest,
    reply: Option<ReplySender>,
    /// Set once popped: answering or dropping the job ends its inflight period.
    queue: Option<Arc<JobQueue>>,
}

impl Job {
    /// What the job asks for.
    pub fn request(&self) -> &JobRequest {
        &self.request
    }

    /// Answers the job; counts finished closures and created/released resources.
    pub fn reply(mut self, reply: JobReply) {
        let stats = self.queue.as_ref().map(|q| &q.stats);
        if let Some(stats) = stats {
            stats.record_reply(&reply);
        }
        self.send(Ok(reply));
    }

    /// Answers the job with an RPC error instead of a response.
    pub fn reply_status(mut self, status: Status) {
        if let (Some(queue), JobRequest::Run { .. }) = (&self.queue, &self.request) {
            queue.stats.closures_run.fetch_add(1, Ordering::Relaxed);
            queue.stats.closures_failed.fetch_add(1, Ordering::Relaxed);
        }
        self.send(Err(status));
    }

    fn send(&mut self, result: Result<JobReply, Status>) {
        if let Some(sender) = self.reply.take() {
            // The caller may have gone away (cancelled or timed out); nothing to do then.
            let _ = sender.send(result);
        }
        if let Some(queue) = self.queue.take() {
            queue.finish_one();
        }
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

/// What [`JobQueue::pop`] found.
pub enum Pop {
    /// A job to run now.
    Job(Job),
    /// Nothing arrived within the timeout.
    Empty,
    /// The queue is draining and holds nothing more: the executor can stop.
    Drained,
    /// The previous job has not been answered yet; a worker runs one job at a time.
    Busy,
}

#[derive(Default)]
struct State {
    jobs: VecDeque<Job>,
    draining: bool,
    inflight: usize,
}

/// FIFO of jobs between RPC handlers and the single executor thread.
pub struct JobQueue {
    state: Mutex<State>,
    changed: Condvar,
    stats: Arc<Stats>,
    worker_index: i64,
}

impl JobQueue {
    /// An empty queue counting into `stats`; `worker_index` appears in refusals.
    pub fn new(stats: Arc<Stats>, worker_index: i64) -> Self {
        Self {
            state: Mutex::default(),
            changed: Condvar::new(),
            stats,
            worker_index,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere cannot leave State half-updated (every update is a single
        // push/pop or counter change), so a poisoned lock is still consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn draining_status(&self) -> Status {
        Status::unavailable(format!(
            "worker {} is shutting down and did not run this request; retry it on another \
             worker",
            self.worker_index
        ))
    }

    /// Queues `request`; the receiver yields the executor's answer. Refused with
    /// `UNAVAILABLE` while draining.
    pub fn push(
        &self,
        request: JobRequest,
    ) -> Result<oneshot::Receiver<Result<JobReply, Status>>, Status> {
        let (sender, receiver) = oneshot::channel();
        let mut state = self.lock();
        if state.draining {
            return Err(self.draining_status());
        }
        state.jobs.push_back(Job {
            request,
            reply: Some(sender),
            queue: None,
        });
        drop(state);
        self.changed.notify_all();
        Ok(receiver)
    }

    /// Takes the next job, waiting up to `timeout` for one.
    pub fn pop(self: &Arc<Self>, timeout: Duration) -> Pop {
        let deadline = Instant::now() + timeout;
        let mut state = self.lock();
        loop {
            if state.inflight > 0 {
                return Pop::Busy;
            }
            if let Some(mut job) = state.jobs.pop_front() {
                state.inflight += 1;
                job.queue = Some(Arc::clone(self));
                return Pop::Job(job);
            }
            if state.draining {
                return Pop::Drained;
            }
            let now = Instant::now();
            if now >= deadline {
                return Pop::Empty;
            }
            state = self
                .changed
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    fn finish_one(&self) {
        let mut state = self.lock();
        state.inflight = state.inflight.saturating_sub(1);
        drop(state);
        self.changed.notify_all();
    }

    /// Stops taking jobs that run code and hands queued ones back with `UNAVAILABLE`.
    /// Returns `false` if the queue was already draining.
    pub fn begin_drain(&self) -> bool {
        let mut state = self.lock();
        if state.draining {
            return false;
        }
        state.draining = true;
        let (refused, kept): (Vec<Job>, Vec<Job>) = state
            .jobs
            .drain(..)
            .partition(|job| job.request.runs_code());
        state.jobs.extend(kept);
        drop(state);
        self.changed.notify_all();
        for job in refused {
            let status = self.draining_status();
            let mut job = job;
            job.send(Err(status));
        }
        true
    }

    /// Whether [`JobQueue::begin_drain`] has been called.
    pub fn is_draining(&self) -> bool {
        self.lock().draining
    }

    /// Waits up to `timeout` until the queue is draining, empty and nothing is in
    /// progress; returns whether that happened.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut state = self.lock();
        loop {
            if state.draining && state.jobs.is_empty() && state.inflight == 0 {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            state = self
                .changed
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// `(queued, inflight)` right now.
    pub fn depth(&self) -> (usize, usize) {
        let state = self.lock();
        (state.jobs.len(), state.inflight)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::pb::FunctionKind;

    fn run_request(closure_id: u64) -> JobRequest {
        JobRequest::Run {
            closure_id,
            function: StoredFunction {
                hash: [0; 32],
                kind: FunctionKind::Cloudpickle,
                payload: bytes::Bytes::new(),
            },
            args: None,
        }
    }

    fn queue() -> Arc<JobQueue> {
        Arc::new(JobQueue::new(Arc::default(), 0))
    }

    #[test]
    fn jobs_come_out_in_order_one_at_a_time() {
        let q = queue();
        let _a = q.push(run_request(1)).unwrap();
        let _b = q.push(run_request(2)).unwrap();
        let Pop::Job(first) = q.pop(Duration::ZERO) else {
            panic!("expected a job")
        };
        assert!(matches!(
            first.request(),
            JobRequest::Run { closure_id: 1, .. }
        ));
        assert!(matches!(q.pop(Duration::ZERO), Pop::Busy));
        first.reply_status(Status::internal("done"));
        let Pop::Job(second) = q.pop(Duration::ZERO) else {
            panic!("expected a job")
        };
        assert!(matches!(
            second.request(),
            JobRequest::Run { closure_id: 2, .. }
        ));
        drop(second);
        assert!(matches!(q.pop(Duration::from_millis(1)), Pop::Empty));
    }

    #[test]
    fn a_dropped_job_answers_internal_and_frees_the_executor() {
        let q = queue();
        let mut reply = q.push(run_request(1)).unwrap();
        let Pop::Job(job) = q.pop(Duration::ZERO) else {
            panic!("expected a job")
        };
        drop(job);
        let status = reply.try_recv().unwrap().unwrap_err();
        assert_eq!(status.code(), tonic::Code::Internal);
        assert!(status.message().contains("without answering"));
        assert_eq!(q.depth(), (0, 0));
    }

    #[test]
    fn draining_hands_back_queued_closures_but_keeps_releases() {
        let q = queue();
        let mut run = q.push(run_request(1)).unwrap();
        let mut release = q
            .push(JobRequest::ReleaseResource {
                resource_ids: vec![1],
            })
            .unwrap();
        assert!(q.begin_drain());
        assert!(!q.begin_drain());
        let refused = run.try_recv().unwrap().unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unavailable);
        assert!(q.push(run_request(2)).is_err());

        let Pop::Job(job) = q.pop(Duration::ZERO) else {
            panic!("the release should still be served")
        };
        assert!(!q.wait_idle(Duration::ZERO));
        job.reply(JobReply::ReleaseResource(pb::ReleaseResourceResponse {
            released: 1,
        }));
        assert!(release.try_recv().unwrap().is_ok());
        assert!(matches!(q.pop(Duration::ZERO), Pop::Drained));
        assert!(q.wait_idle(Duration::ZERO));
    }
}
