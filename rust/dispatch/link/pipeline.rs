//! A link's pipeline: its `RunClosures` stream to its worker and the closures outstanding
//! on it ([`Pipeline`]), how many it may have, and letting them all go when the worker is
//! gone or the dispatcher stops. The rest of pipelining is in three files, by concern:
//!
//! - `stream.rs`: opening the stream and sending closures on it.
//! - `answers.rs`: reading the worker's answers and settling each closure by them.
//! - `top_up.rs`: taking work (idle, or more while busy) and reclaiming queued closures.
//!
//! Whether a busy link may pipeline, and how an idle link gets closures back from busy
//! ones, is the handshake of `balance.rs` (with the argument that keeps it
//! work-conserving); these files send, read answers and reclaim by its verdicts.
//!
//! # Depth
//!
//! `benches/cpu_breakdown.py`, 30,000 closures on two local workers (a shared 2-core
//! machine: rates swing about 20 % between runs), closures/s and CPU per closure over all
//! three processes, trivial / small-array:
//!
//! | depth | trivial | small-array |
//! |---|---|---|
//! | unary `RunClosure`, one at a time (before streams) | 5,700-7,600/s, 230-250 us | - |
//! | 0 (stream, no pipelining) | 14,800/s, 114 us | 10,800/s, 157 us |
//! | 2 | 44,000/s, 39 us | 15,800/s, 118 us |
//! | 8 | 61,000/s, 30 us | 18,700/s, 104 us |
//! | 16 | 72,000/s, 25 us | 29,000/s, 66 us |
//! | 64 | 68,000/s, 26 us | 26,000/s, 76 us |
//!
//! Past 8 the gain was within the noise on two workers, and 16 was the default until the
//! 1,000-worker bench (`benches/scale.rs`) showed what a deeper pipeline buys once messages
//! are the cost: each message carries more closures, and every connection is touched less
//! often. Depth 16 against 64, interleaved runs on one day:
//!
//! | bench | 16 | 64 |
//! |---|---|---|
//! | `scale`, 10 / 1,000 Rust echo workers | 214-301k / 161-166k per s | 331-386k / 283-308k per s |
//! | `coordinator_bench.py`, trivial, many in flight / sustained 3 s | 56-63k / 56-78k per s | 75-77k / 89-90k per s |
//! | `coordinator_bench.py`, small-array, many in flight | 23-26k per s | 26-30k per s |
//! | `wire_bench.py`, 64 KiB in and out | 9.5-11.7k per s | 10.5-12.6k per s |
//!
//! 64 is the default. A deep pipeline is for small closures; a link also stops pipelining
//! once the arguments it has outstanding reach `pipeline_bytes` (32 MiB by default), so 64
//! large arrays are never stacked on one worker (at depth 16, seventeen 16 MiB arguments
//! could be). Refilling only once half the pipeline has drained (bigger messages, fewer of
//! them) made no difference that the noise did not swamp, so a link refills after every
//! message of answers.
//!
//! # Failures
//!
//! Under `cancel_all` the stream is opened with `halt_on_error`: after a closure fails, the
//! worker starts none of the stream's queued closures but hands them back (and they are
//! cancelled, the error being pending), and a link that settles a failure asks every other
//! link to reclaim too, so no pipelined closure starts after a failure is known. The next
//! message after an error carries `resume`. A broken stream (the worker died) puts every
//! outstanding closure back: at least once, never lost. `closure_timeout` turns pipelining
//! off (an execution's clock must start when it starts, which only an idle worker
//! guarantees), and the link times the one closure outstanding itself.

use std::time::Instant;

use super::outstanding::Outstanding;
use super::Link;
use crate::dispatch::closure::Work;
use crate::dispatch::deaths;
use crate::dispatch::transport::WorkerTransport;
use crate::rpc::ClosureChannel;

/// The stream and what is outstanding on it.
#[derive(Default)]
pub(super) struct Pipeline {
    pub channel: Option<ClosureChannel>,
    pub outstanding: Outstanding,
    /// The worker halted the stream after an error: the next message carries `resume`.
    pub resume: bool,
    /// The worker refused a closure with `UNAVAILABLE` (it is shutting down): send nothing
    /// more, collect the answers still due, then recover.
    pub going_away: Option<String>,
    /// When the worker was last heard from (or closures were sent to an idle worker).
    pub last_heard: Option<Instant>,
    /// When the link last pinged.
    pub last_ping: Option<Instant>,
    /// The highest heartbeat received, echoed in `heartbeat_ack`.
    pub ack: u64,
    /// The closure the worker's last message said it was running (0: none).
    pub running: u64,
    /// The worker just came up and has no stream yet: one is opened before the link waits
    /// for work ([`Link::watch_idle_worker`]).
    pub unwatched: bool,
}

impl Pipeline {
    /// Forgets the stream (dropping it cancels it), keeping what is outstanding. Its
    /// heartbeat acknowledgement goes with it: heartbeats count from each stream's opening,
    /// so one echoed on the next stream would grant that stream a lease nothing vouches for.
    pub fn drop_stream(&mut self) {
        self.channel = None;
        self.resume = false;
        self.ack = 0;
        self.running = 0;
    }
}

/// What an idle link's wait for work ended with.
pub(super) enum Idle {
    Work(Work),
    /// The queue was stopped.
    Stopped,
    /// The worker was found gone; the link is recovering.
    Lost,
}

impl<T: WorkerTransport> Link<T> {
    /// Closures this link may have outstanding: one running, plus the pipeline depth
    /// (none under `closure_timeout`).
    pub(super) fn capacity(&self) -> usize {
        let config = &self.shared.config;
        1 + if config.closure_timeout.is_some() {
            0
        } else {
            config.pipeline_depth
        }
    }

    /// Publishes how many closures this link has outstanding, plus `extra` taken and not
    /// sent yet (read by idle links, see `balance.rs`).
    pub(super) fn publish(&self, extra: usize) {
        let count = self.pipeline.outstanding.len() + extra;
        self.slot.publish(count);
        self.status
            .counters
            .outstanding
            .store(count as u64, std::sync::atomic::Ordering::Relaxed);
    }

    /// Puts every closure outstanding or held back in the queue and drops the stream (the
    /// worker is gone). Returns how many closures went back (a closure out of retries is
    /// held for its post-mortem instead, see `liveness.rs`).
    pub(super) fn forget_pipeline(&mut self) -> usize {
        let limit = self.shared.config.max_closure_retries;
        let mut put_back = 0;
        for sent in self.pipeline.outstanding.take() {
            if deaths::exhausted(&sent.closure, limit) {
                // Failed once its post-mortem is in (`liveness.rs`).
                self.doomed.push(sent.closure);
            } else {
                self.put_back(sent.closure);
                put_back += 1;
            }
        }
        self.publish(0);
        match self.held.take() {
            Some(Work::Closure(closure)) => {
                self.requeue(closure);
                put_back += 1;
            }
            // Built again with every live resource once the worker answers (`reconnected`).
            Some(Work::CreateResource { .. }) | None => {}
            // Still owed once the worker answers: served first then. A release dropped
            // here left the resource allocated on a worker that came back as the same
            // process.
            other => self.held = other,
        }
        self.pipeline = Pipeline::default();
        put_back
    }

    /// The dispatcher is stopping: everything outstanding or held is put back (so
    /// cancelled, the queue being stopped).
    pub(super) fn abandon(&mut self) {
        for sent in self.pipeline.outstanding.take() {
            self.put_back(sent.closure);
        }
        for closure in std::mem::take(&mut self.doomed) {
            self.put_back(closure);
        }
        self.publish(0);
        match self.held.take() {
            Some(Work::Closure(closure)) => self.give_back(closure),
            Some(other) => crate::queue::Cancel::cancel(other),
            None => {}
        }
        self.pipeline = Pipeline::default();
    }
}
