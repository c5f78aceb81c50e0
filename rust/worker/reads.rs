//! Reads of kept values (`ReadValue`, dataflow): the queue between the RPC handler and the
//! worker's *reader* thread, a second Python thread beside the executor.
//!
//! Why a queue of its own and not a job: a kept value is a live Python object (a JAX array
//! stays on its device until someone reads it), so Python must encode it, and the executor
//! may be running a long closure. Reads wait for nothing the executor does: the reader
//! thread takes them with the GIL released ([`ReadQueue::pop`]) and holds the GIL only to
//! look the value up and pickle it (out-of-band buffers borrowed, not copied, for host
//! memory). The executor's order is untouched, and a draining or preempting worker still
//! serves reads (nothing here looks at the drain) until its listener closes
//! ([`ReadQueue::close`]).

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tonic::Status;

use crate::rpc::pb;
use crate::rpc::wire::session::SessionId;

type ReadSender = oneshot::Sender<Result<pb::Value, Status>>;

/// One `ReadValue` call waiting for the reader thread. Answer it with [`ValueRead::reply`];
/// dropped unanswered it answers `INTERNAL`, so no caller hangs.
pub struct ValueRead {
    /// The session the call came from: only its values are visible to it.
    pub session: SessionId,
    /// The kept value asked for.
    pub value_id: u64,
    reply: Option<ReadSender>,
}

impl ValueRead {
    /// Answers the read with the encoded value or a status (e.g. `NOT_FOUND`).
    pub fn reply(mut self, answer: Result<pb::Value, Status>) {
        if let Some(sender) = self.reply.take() {
            // The caller may have gone away (cancelled or timed out); nothing to do then.
            drop(sender.send(answer));
        }
    }
}

impl Drop for ValueRead {
    fn drop(&mut self) {
        if let Some(sender) = self.reply.take() {
            drop(sender.send(Err(Status::internal(
                "the worker's reader dropped this read without answering it (a bug in the \
                 worker)",
            ))));
        }
    }
}

/// What [`ReadQueue::pop`] found.
pub enum ReadPop {
    /// A read to answer.
    Read(ValueRead),
    /// Nothing arrived within the timeout.
    Empty,
    /// The server stopped serving: no read will come any more.
    Closed,
}

#[derive(Default)]
struct State {
    reads: VecDeque<ValueRead>,
    closed: bool,
}

/// FIFO of reads between `ReadValue` handlers and the reader thread.
#[derive(Default)]
pub struct ReadQueue {
    state: Mutex<State>,
    changed: Condvar,
}

impl ReadQueue {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update is one push, pop or flag: a poisoned lock is still consistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues a read of `value_id` for `session`; the receiver yields the reader's answer.
    /// `UNAVAILABLE` once the server stopped serving.
    pub fn push(
        &self,
        session: &SessionId,
        value_id: u64,
    ) -> Result<oneshot::Receiver<Result<pb::Value, Status>>, Status> {
        let (sender, receiver) = oneshot::channel();
        let mut state = self.lock();
        if state.closed {
            return Err(Status::unavailable(
                "the worker stopped serving; its kept values are gone",
            ));
        }
        state.reads.push_back(ValueRead {
            session: session.clone(),
            value_id,
            reply: Some(sender),
        });
        drop(state);
        self.changed.notify_one();
        Ok(receiver)
    }

    /// Takes the next read whose caller still waits, waiting up to `timeout` for one.
    pub fn pop(&self, timeout: Duration) -> ReadPop {
        let deadline = Instant::now() + timeout;
        let mut state = self.lock();
        loop {
            while let Some(read) = state.reads.pop_front() {
                if read.reply.as_ref().is_some_and(|s| !s.is_closed()) {
                    return ReadPop::Read(read);
                }
            }
            if state.closed {
                return ReadPop::Closed;
            }
            let now = Instant::now();
            if now >= deadline {
                return ReadPop::Empty;
            }
            state = self
                .changed
                .wait_timeout(state, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Whether [`Self::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// Refuses every queued and later read (`UNAVAILABLE`) and wakes the reader, whose
    /// next pop says `Closed`.
    pub fn close(&self) {
        let queued: Vec<ValueRead> = {
            let mut state = self.lock();
            state.closed = true;
            state.reads.drain(..).collect()
        };
        self.changed.notify_all();
        for read in queued {
            read.reply(Err(Status::unavailable(
                "the worker stopped serving before it read this value",
            )));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_is_answered_once_and_a_closed_queue_refuses_and_says_so() {
        let queue = ReadQueue::default();
        let session = SessionId::anonymous();
        let mut receiver = queue.push(&session, 7).unwrap();
        let ReadPop::Read(read) = queue.pop(Duration::from_millis(10)) else {
            panic!("expected the queued read");
        };
        assert_eq!(read.value_id, 7);
        read.reply(Ok(pb::Value::default()));
        assert!(receiver.try_recv().unwrap().is_ok());
        assert!(matches!(
            queue.pop(Duration::from_millis(1)),
            ReadPop::Empty
        ));

        let mut dropped = queue.push(&session, 8).unwrap();
        let ReadPop::Read(read) = queue.pop(Duration::ZERO) else {
            panic!("expected the queued read");
        };
        drop(read);
        let status = dropped.try_recv().unwrap().unwrap_err();
        assert_eq!(status.code(), tonic::Code::Internal);

        let mut waiting = queue.push(&session, 9).unwrap();
        queue.close();
        let status = waiting.try_recv().unwrap().unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert!(matches!(queue.pop(Duration::ZERO), ReadPop::Closed));
        assert_eq!(
            queue.push(&session, 10).unwrap_err().code(),
            tonic::Code::Unavailable
        );
    }

    #[test]
    fn a_read_whose_caller_left_is_skipped() {
        let queue = ReadQueue::default();
        let session = SessionId::anonymous();
        drop(queue.push(&session, 1).unwrap());
        let _kept = queue.push(&session, 2).unwrap();
        let ReadPop::Read(read) = queue.pop(Duration::ZERO) else {
            panic!("expected the second read");
        };
        assert_eq!(read.value_id, 2);
        read.reply(Ok(pb::Value::default()));
    }
}
