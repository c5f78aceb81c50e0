//! What a link has outstanding on its worker: the closures sent on the stream and not
//! answered yet, in the order sent, and the bytes of their arguments (what the pipelining
//! budget, `pipeline_bytes`, counts).

use std::collections::VecDeque;
use std::time::Instant;

use crate::dispatch::closure::Closure;

/// A closure sent on the stream and not answered yet.
pub(super) struct Sent {
    pub closure: Closure,
    /// When it was sent (its execution clock under `closure_timeout`, nothing being
    /// queued before it then).
    pub since: Instant,
    /// Its function was registered again after a `NOT_FOUND` (done at most once).
    pub registered_again: bool,
}

/// The closures sent on a stream and not answered yet, in the order sent, with the bytes of
/// their arguments counted as they come and go (the pipelining budget reads it once per
/// top-up; summing it there walked every closure's arguments, 1 % of the coordinator's CPU
/// at 1,000 workers).
#[derive(Default)]
pub(super) struct Outstanding {
    sent: VecDeque<Sent>,
    bytes: usize,
}

impl Outstanding {
    pub fn len(&self) -> usize {
        self.sent.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sent.is_empty()
    }

    /// Argument bytes (pickles and buffers) of what is outstanding.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn iter(&self) -> std::collections::vec_deque::Iter<'_, Sent> {
        self.sent.iter()
    }

    pub fn front(&self) -> Option<&Sent> {
        self.sent.front()
    }

    pub fn front_mut(&mut self) -> Option<&mut Sent> {
        self.sent.front_mut()
    }

    pub fn push_back(&mut self, sent: Sent) {
        self.bytes += sent.closure.args.byte_len();
        self.sent.push_back(sent);
    }

    pub fn pop_front(&mut self) -> Option<Sent> {
        let sent = self.sent.pop_front()?;
        self.bytes -= sent.closure.args.byte_len();
        Some(sent)
    }

    pub fn remove(&mut self, index: usize) -> Option<Sent> {
        let sent = self.sent.remove(index)?;
        self.bytes -= sent.closure.args.byte_len();
        Some(sent)
    }

    /// Everything outstanding, leaving nothing.
    pub fn take(&mut self) -> VecDeque<Sent> {
        self.bytes = 0;
        std::mem::take(&mut self.sent)
    }
}
