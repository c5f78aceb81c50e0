//! The hand-off between async RPC handlers and the (Python) executor thread.
//!
//! Unary handlers push a [`Job`] and await its reply on a oneshot channel; closures of a
//! `RunClosures` stream are pushed by the stream's reader (`reader.rs`) with their stream
//! as the reply target (`stream.rs`). One executor thread pops jobs in arrival order,
//! blocking on a condition variable (so the Python side can wait with the GIL released),
//! and runs them one at a time. The queue also owns the shutdown protocol: once draining, new jobs are refused
//! with `UNAVAILABLE`, queued ones are handed back the same way, and
//! [`JobQueue::wait_idle`] returns when the job in progress has been answered.
//!
//! Halting (`halt_on_error`) and hand-backs (`return_queued`) happen under the queue's
//! lock, and the halted set lives in the queue's state, so they are atomic with respect to
//! the executor popping its next job: a closure is either started or handed back, never
//! both. A halt is recorded *before* the error that caused it is sent, so the
//! coordinator's `resume`, which it sends only after reading that error, always finds the
//! halt in place.
//!
//! Answering a job is also where it is counted (closures run and failed, resources created
//! and released): the counters in `stats.rs` are only counters.
//!
//! A notify on a futex condition variable is a system call even with nobody asleep, so
//! sleepers are counted and producers notify only when there is one.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tonic::Status;

use super::stats::Stats;
use super::stream::ClosureStream;
use crate::rpc::wire::session::SessionId;
use crate::spin::Spin;

mod job;

use job::{hand_back, ReplyTo, HALT_REASON};
pub use job::{Job, JobReply, JobRequest, Ran};

/// What [`JobQueue::pop`] found.
// A job is moved once per pop; boxing it would add an allocation per closure.
#[allow(clippy::large_enum_variant)]
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
    /// The streams being read, by [`ClosureStream::id`], each with whether it is halted
    /// (after an error on a `halt_on_error` stream, until the coordinator resumes it). A
    /// stream is listed from when its reader starts until it stops: only a reader queues
    /// closures, so a halt after that has nothing more to hold back.
    halted: HashMap<u64, bool>,
    draining: bool,
    inflight: usize,
    /// Threads waiting on `changed`.
    sleepers: usize,
}

/// FIFO of jobs between RPC handlers and the single executor thread.
pub struct JobQueue {
    state: Mutex<State>,
    changed: Condvar,
    stats: Arc<Stats>,
    worker_index: i64,
    /// Counts the changes that wake the executor, readable without the lock: what the
    /// executor spins on before it parks.
    changes: AtomicU64,
    /// Where the executor spins for its next job before it parks: the queue's own, so its
    /// budget learns this worker's round trips.
    spin: Spin,
    /// Turns `true` when draining begins, for async readers (the streams' request
    /// readers stop reading then, so open streams end and shutdown can complete).
    drain_signal: tokio::sync::watch::Sender<bool>,
}

impl JobQueue {
    /// An empty queue counting into `stats`; `worker_index` appears in refusals.
    pub fn new(stats: Arc<Stats>, worker_index: i64) -> Self {
        Self {
            state: Mutex::default(),
            changed: Condvar::new(),
            stats,
            worker_index,
            changes: AtomicU64::new(0),
            // Read now, not on first use: the first use is under this queue's lock, and a
            // refused setting is logged, which takes the GIL (`crate::setting`).
            spin: Spin::with_budget(crate::spin::configured_budget())
                .reporting(&crate::spin::report::EXECUTOR)
                .driving(),
            drain_signal: tokio::sync::watch::Sender::new(false),
        }
    }

    /// This queue with its executor spinning up to `budget` before it parks (tests).
    #[cfg(test)]
    pub(crate) fn with_spin(mut self, budget: Duration) -> Self {
        self.spin = Spin::with_budget(budget);
        self
    }

    /// Resolves once draining has begun.
    pub(super) async fn drained(&self) {
        let mut signal = self.drain_signal.subscribe();
        let _ = signal.wait_for(|draining| *draining).await;
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
        self.push_as(&SessionId::anonymous(), request)
    }

    /// Queues `request` of `session` (its values are that session's); as [`Self::push`].
    pub fn push_as(
        &self,
        session: &SessionId,
        request: JobRequest,
    ) -> Result<oneshot::Receiver<Result<JobReply, Status>>, Status> {
        self.push_unless_draining(session, request, true)
    }

    /// Queues a preemption save of `session` (a read of its own device state) even while
    /// draining: a worker being preempted refuses every other job, but its coordinators
    /// still copy their `on_preemption="save"` state off it before the deadline. The
    /// executor takes it with [`Self::pop_while_draining`].
    pub fn push_preemption_save(
        &self,
        session: &SessionId,
        request: JobRequest,
    ) -> Result<oneshot::Receiver<Result<JobReply, Status>>, Status> {
        self.push_unless_draining(session, request, false)
    }

    fn push_unless_draining(
        &self,
        session: &SessionId,
        request: JobRequest,
        refuse_if_draining: bool,
    ) -> Result<oneshot::Receiver<Result<JobReply, Status>>, Status> {
        let (sender, receiver) = oneshot::channel();
        let mut state = self.lock();
        if state.draining && refuse_if_draining {
            return Err(self.draining_status());
        }
        state.jobs.push_back(Job {
            request,
            session: session.clone(),
            reply: Some(ReplyTo::Call(sender)),
            queue: None,
            started: None,
        });
        self.wake(state);
        Ok(receiver)
    }

    /// Queues closures of `stream`, in order, answering each on the stream. While draining
    /// they are refused `UNAVAILABLE`; while the stream is halted they are handed back.
    pub(super) fn push_streamed(
        &self,
        jobs: Vec<(u64, JobRequest)>,
        stream: &Arc<ClosureStream>,
        session: &SessionId,
    ) {
        if jobs.is_empty() {
            return;
        }
        let mut state = self.lock();
        let halted = state.halted.get(&stream.id()).copied().unwrap_or(false);
        if state.draining || halted {
            let draining = state.draining;
            drop(state);
            let status = self.draining_status();
            for (closure_id, _) in jobs {
                if draining {
                    stream.refuse(closure_id, &status);
                } else {
                    stream.hand_back(closure_id, HALT_REASON);
                }
            }
            return;
        }
        state.jobs.extend(jobs.into_iter().map(|(_, request)| Job {
            request,
            session: session.clone(),
            reply: Some(ReplyTo::Stream(Arc::clone(stream))),
            queue: None,
            started: None,
        }));
        self.wake(state);
    }

    /// Refuses a streamed closure that failed its checks, halting the stream first if it
    /// halts on errors.
    pub(super) fn refuse_streamed(
        &self,
        stream: &Arc<ClosureStream>,
        closure_id: u64,
        status: &Status,
    ) {
        let halted = self.halt_stream(stream);
        stream.refuse(closure_id, status);
        hand_back(halted, HALT_REASON);
    }

    /// Lists `stream` as being read (not halted); its reader calls this before queueing
    /// anything.
    pub(super) fn open_stream(&self, stream: &ClosureStream) {
        self.lock().halted.insert(stream.id(), false);
    }

    /// Forgets `stream`'s halted state; its reader calls this when it stops reading.
    pub(super) fn close_stream(&self, stream: &ClosureStream) {
        self.lock().halted.remove(&stream.id());
    }

    /// Halts `stream` if it halts on errors; returns its queued jobs, for the caller to
    /// hand back once it has sent the error.
    pub(super) fn halt_stream(&self, stream: &ClosureStream) -> Vec<Job> {
        if !stream.halts_on_error() {
            return Vec::new();
        }
        let mut state = self.lock();
        if let Some(halted) = state.halted.get_mut(&stream.id()) {
            *halted = true;
        }
        take_jobs_of(&mut state, stream)
    }

    /// Ends a halt of `stream`.
    pub(super) fn resume_stream(&self, stream: &ClosureStream) {
        if let Some(halted) = self.lock().halted.get_mut(&stream.id()) {
            *halted = false;
        }
    }

    /// Hands back, unstarted, every queued job of `stream`.
    pub(super) fn hand_back_stream(&self, stream: &ClosureStream, reason: &str) {
        let taken = take_jobs_of(&mut self.lock(), stream);
        hand_back(taken, reason);
    }

    /// Releases `state` and wakes the executor if it sleeps.
    fn wake(&self, state: MutexGuard<'_, State>) {
        self.changes.fetch_add(1, Ordering::Release);
        let sleeping = state.sleepers > 0;
        drop(state);
        if sleeping {
            self.changed.notify_all();
        }
    }

    /// Waits on `changed` until notified or `timeout` passes.
    fn sleep<'a>(
        &self,
        mut state: MutexGuard<'a, State>,
        timeout: Duration,
    ) -> MutexGuard<'a, State> {
        // The runtime's driver thread reads the next closure while this one sleeps.
        crate::runtime::lend::nudge();
        state.sleepers += 1;
        let mut state = self
            .changed
            .wait_timeout(state, timeout)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
        state.sleepers -= 1;
        state
    }

    /// Takes the next job if one is queued and none is running; never waits.
    pub fn try_pop(self: &Arc<Self>) -> Pop {
        let mut state = self.lock();
        self.take_next(&mut state).unwrap_or(if state.draining {
            Pop::Drained
        } else {
            Pop::Empty
        })
    }

    /// Takes the next job, waiting up to `timeout` for one.
    pub fn pop(self: &Arc<Self>, timeout: Duration) -> Pop {
        self.pop_waiting(timeout, false)
    }

    /// As [`Self::pop`], but a draining queue with nothing queued still waits up to
    /// `timeout` (`Empty`, never `Drained`): a preempted worker's executor awaiting the
    /// preemption saves its coordinators send ([`Self::push_preemption_save`]).
    pub fn pop_while_draining(self: &Arc<Self>, timeout: Duration) -> Pop {
        self.pop_waiting(timeout, true)
    }

    fn pop_waiting(self: &Arc<Self>, timeout: Duration, while_draining: bool) -> Pop {
        let deadline = Instant::now() + timeout;
        let mut state = self.lock();
        // What this wait's spin saw, once it spun (the whole wait is reported once a job
        // comes: it tells the spin what budget would have done).
        let mut spun = None;
        loop {
            if let Some(pop) = self.take_next(&mut state) {
                if let (Pop::Job(_), Some(spun)) = (&pop, spun) {
                    self.spin.wait_ended(spun);
                }
                return pop;
            }
            if state.draining && !while_draining {
                return Pop::Drained;
            }
            let now = Instant::now();
            if now >= deadline {
                return Pop::Empty;
            }
            if spun.is_none() && !self.spin.is_off() {
                // The next closure of a serial loop comes one round trip after the last
                // answer: caught spinning, it saves the executor's wake-up. Only a change
                // makes it look again, as only a change wakes a sleeper (a look costs a
                // lease's acknowledgement request while none is valid).
                let seen = self.changes.load(Ordering::Acquire);
                drop(state);
                spun = Some(self.spin.until(Some(deadline), || {
                    self.changes.load(Ordering::Acquire) != seen
                }));
                state = self.lock();
                // Changes are counted under the lock: none slips between this look and
                // the sleep.
                if self.changes.load(Ordering::Acquire) != seen {
                    continue;
                }
            }
            // Past the deadline after a spin: a zero sleep, then one more look.
            state = self.sleep(state, deadline.saturating_duration_since(Instant::now()));
        }
    }

    /// `Busy`, the next job that may start, or `None` when none may. Drops closures nobody
    /// would read the answers of; leaves a leased stream's closures queued while its lease
    /// is not valid.
    fn take_next(self: &Arc<Self>, state: &mut State) -> Option<Pop> {
        if state.inflight > 0 {
            return Some(Pop::Busy);
        }
        let now = Instant::now();
        let mut index = 0;
        while let Some(job) = state.jobs.get(index) {
            if nobody_waits(job) {
                if let Some(mut dropped) = state.jobs.remove(index) {
                    dropped.reply = None;
                }
                continue;
            }
            // A leased stream's closures wait for its lease (see stream.rs); its other
            // closures wait with them, so the stream's order is kept.
            let allowed = match &job.reply {
                Some(ReplyTo::Stream(stream)) => {
                    let (allowed, ask) = stream.lease().allows_start(now);
                    if ask {
                        stream.heartbeat();
                    }
                    allowed
                }
                _ => true,
            };
            if !allowed {
                index += 1;
                continue;
            }
            let mut job = state.jobs.remove(index)?;
            state.inflight += 1;
            job.queue = Some(Arc::clone(self));
            job.started = Some(now);
            if let (Some(stream), JobRequest::Run { closure_id, .. }) = (job.stream(), &job.request)
            {
                stream.lease().set_running(*closure_id);
            }
            return Some(Pop::Job(job));
        }
        None
    }

    /// Wakes the executor if it sleeps (e.g. a lease was renewed, so waiting closures may
    /// start now).
    pub(super) fn notify(&self) {
        let state = self.lock();
        self.wake(state);
    }

    fn finish_one(&self) {
        let mut state = self.lock();
        state.inflight = state.inflight.saturating_sub(1);
        self.wake(state);
    }

    /// Stops taking jobs that run code and hands queued ones back with `UNAVAILABLE`.
    /// Returns `false` if the queue was already draining.
    pub fn begin_drain(&self) -> bool {
        let mut state = self.lock();
        if state.draining {
            return false;
        }
        state.draining = true;
        self.drain_signal.send_replace(true);
        // Closures are refused (the coordinator runs them elsewhere). A session's release is
        // dropped too: the process is going, and with it every session's values, and a
        // release waiting for an executor that is not taking jobs any more (or never ran,
        // as for an in-process server) would hold the drain forever. A resource's release
        // is kept: its coordinator waits for the answer.
        let (refused, kept): (Vec<Job>, Vec<Job>) = state.jobs.drain(..).partition(|job| {
            job.request.runs_code() || matches!(job.request, JobRequest::ReleaseSession)
        });
        state.jobs.extend(kept);
        self.wake(state);
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
            state = self.sleep(state, deadline - now);
        }
    }

    /// `(queued, inflight)` right now; a queued job whose caller went away is not counted
    /// (it will never start: [`nobody_waits`]), so a caller that cancelled a call sees it
    /// leave the queue as soon as the worker learns of the cancellation.
    pub fn depth(&self) -> (usize, usize) {
        let state = self.lock();
        let queued = state.jobs.iter().filter(|job| !nobody_waits(job)).count();
        (queued, state.inflight)
    }
}

/// Whether nobody would read `job`'s answer, so it is dropped instead of started: a stream
/// whose client went away, or a unary call cancelled (or timed out) by its client while
/// queued. A release still runs: a session's release is queued with nobody waiting
/// (`mod.rs`), and a value left behind would hold its memory for good.
fn nobody_waits(job: &Job) -> bool {
    match &job.reply {
        Some(ReplyTo::Stream(stream)) => stream.is_abandoned(),
        Some(ReplyTo::Call(sender)) => sender.is_closed() && job.request.runs_code(),
        None => false,
    }
}

/// Removes the queued jobs of `stream` from `state`, in order.
fn take_jobs_of(state: &mut State, stream: &ClosureStream) -> Vec<Job> {
    let (taken, kept): (Vec<Job>, Vec<Job>) = std::mem::take(&mut state.jobs)
        .into_iter()
        .partition(|job| job.stream().is_some_and(|own| own.is(stream)));
    state.jobs = kept.into();
    taken
}

#[cfg(test)]
mod tests;
