//! What a draining worker still owes: answers its coordinators have not acknowledged.
//!
//! Drain promises to finish the running closure *and answer it*. An answer written to the
//! socket is not yet an answer received: a worker that exits right after writing it can
//! lose it (the process ends before the bytes leave, or the coordinator, hearing nothing
//! else, declares the worker silent first), and the coordinator then runs the closure
//! again elsewhere although it ran here. So a leased stream (protocol revision 4) keeps a
//! [`Ledger`] of the answers it sent and the heartbeat of the message that carried each;
//! the coordinator's `heartbeat_ack` (the highest heartbeat it has *received*) clears what
//! it covers. While draining, every message asks for an acknowledgement at once
//! (`wants_ack`), and the stream's reader keeps reading (acknowledgements and pings; new
//! closures are refused `UNAVAILABLE`) until its ledger is empty and nothing of it runs.
//!
//! [`Farewells`] lists the streams still being read, so the server's shutdown can wait
//! until every one has been acknowledged, up to its drain deadline, and then say which
//! closures' answers were not (and release the readers, so the server can stop).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::stream::Lease;

/// The answers of one stream not yet acknowledged, oldest first.
#[derive(Debug, Default)]
pub struct Ledger {
    entries: Mutex<Entries>,
}

#[derive(Debug, Default)]
struct Entries {
    /// Closure ids of answers handed to the response and not yet in a message.
    unsent: VecDeque<u64>,
    /// `(heartbeat of the message that carried it, closure id)`, in sending order.
    sent: VecDeque<(u64, u64)>,
}

impl Ledger {
    fn lock(&self) -> MutexGuard<'_, Entries> {
        // Every update is one push or pop: a panic elsewhere leaves it consistent.
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// An answer to `closure_id` goes to the response (before it enters the channel, so
    /// the messages take them in this order).
    pub(super) fn owe(&self, closure_id: u64) {
        self.lock().unsent.push_back(closure_id);
    }

    /// The next `count` answers left in a message stamped `heartbeat`.
    pub(super) fn sent(&self, count: usize, heartbeat: u64) {
        let mut entries = self.lock();
        for _ in 0..count {
            let Some(closure_id) = entries.unsent.pop_front() else {
                break;
            };
            entries.sent.push_back((heartbeat, closure_id));
        }
    }

    /// The coordinator received every message stamped up to `ack`.
    pub(super) fn acknowledged(&self, ack: u64) {
        let mut entries = self.lock();
        while entries.sent.front().is_some_and(|&(stamp, _)| stamp <= ack) {
            entries.sent.pop_front();
        }
    }

    /// Whether every answer sent was acknowledged.
    pub(super) fn is_settled(&self) -> bool {
        let entries = self.lock();
        entries.unsent.is_empty() && entries.sent.is_empty()
    }

    /// The closures whose answers are not acknowledged, oldest first.
    pub(super) fn unacknowledged(&self) -> Vec<u64> {
        let entries = self.lock();
        entries
            .sent
            .iter()
            .map(|&(_, id)| id)
            .chain(entries.unsent.iter().copied())
            .collect()
    }
}

/// The `RunClosures` streams still being read, by stream id, each with its lease (which
/// holds its ledger); and the signal that stops a draining worker's readers waiting for
/// acknowledgements.
#[derive(Debug)]
pub struct Farewells {
    open: Mutex<HashMap<u64, Arc<Lease>>>,
    closed: Condvar,
    released: watch::Sender<bool>,
}

impl Default for Farewells {
    fn default() -> Self {
        Self {
            open: Mutex::default(),
            closed: Condvar::new(),
            released: watch::Sender::new(false),
        }
    }
}

impl Farewells {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Arc<Lease>>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Lists stream `id`, read from now on.
    pub(super) fn open(&self, id: u64, lease: Arc<Lease>) {
        self.lock().insert(id, lease);
    }

    /// Stream `id` is no longer read.
    pub(super) fn close(&self, id: u64) {
        self.lock().remove(&id);
        self.closed.notify_all();
    }

    /// Resolves once the shutdown stopped waiting for acknowledgements.
    pub(super) async fn released(&self) {
        let mut signal = self.released.subscribe();
        let _ = signal.wait_for(|released| *released).await;
    }

    /// Waits up to `timeout` until no stream is read any more (each was acknowledged, or
    /// ended by its client); returns whether that happened. Call once draining has begun.
    pub fn wait_closed(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut open = self.lock();
        loop {
            if open.is_empty() {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            open = self
                .closed
                .wait_timeout(open, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Stops the readers still waiting for acknowledgements (the drain deadline passed);
    /// returns the closures whose answers were not acknowledged, oldest first per stream
    /// (empty: all were).
    pub fn release(&self) -> Vec<u64> {
        let unacknowledged = self
            .lock()
            .values()
            .flat_map(|lease| lease.unacknowledged())
            .collect();
        self.released.send_replace(true);
        unacknowledged
    }
}

#[cfg(test)]
mod tests {
    use super::Ledger;

    #[test]
    fn an_acknowledgement_clears_the_answers_of_the_messages_it_covers() {
        let ledger = Ledger::default();
        for id in [1, 2, 3] {
            ledger.owe(id);
        }
        ledger.sent(2, 10);
        ledger.sent(1, 20);
        assert_eq!(ledger.unacknowledged(), vec![1, 2, 3]);
        ledger.acknowledged(15);
        assert_eq!(ledger.unacknowledged(), vec![3]);
        assert!(!ledger.is_settled());
        ledger.acknowledged(20);
        assert!(ledger.is_settled());
    }

    #[test]
    fn answers_not_yet_in_a_message_stay_owed() {
        let ledger = Ledger::default();
        ledger.owe(7);
        ledger.acknowledged(u64::MAX);
        assert_eq!(ledger.unacknowledged(), vec![7]);
    }
}
