//! Counters a worker reports through `GetStatus`.
//!
//! Counters only: what counts as a finished closure or a created resource is decided where
//! jobs are answered (`jobs.rs`), so this file depends on nothing else in the worker.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::histogram::Histogram;

/// Longest `last_error` kept, in characters.
const LAST_ERROR_CHARS: usize = 200;

/// Monotonic counters, updated without locks from handlers and the executor.
#[derive(Debug, Default)]
pub struct Stats {
    /// Closures answered, whatever the outcome.
    pub closures_run: AtomicU64,
    /// Of those, closures answered with an error or an RPC error.
    pub closures_failed: AtomicU64,
    /// Resources created successfully.
    pub resources_created: AtomicU64,
    /// Resources released that the worker held.
    pub resources_released: AtomicU64,
    /// Requests refused for a missing or wrong token (shared with the auth check).
    pub unauthenticated: Arc<AtomicU64>,
    /// Requests refused as malformed, unknown or oversized.
    pub rejected: AtomicU64,
    /// How long closures ran, from the executor taking one to its answer.
    pub execution: Histogram,
    /// The last closure error answered, `Type: message` (first line, shortened).
    last_error: Mutex<String>,
    /// Bytes of closure and resource arguments received (pickle plus buffers).
    pub bytes_received: AtomicU64,
    /// Bytes of closure results sent (pickle plus buffers).
    pub bytes_sent: AtomicU64,
    /// (Dataflow.) Kept values read by peers (`ReadValue` answered), and their bytes.
    pub peer_reads_served: AtomicU64,
    /// Bytes of the encoded values `ReadValue` answered.
    pub peer_bytes_sent: AtomicU64,
    /// (Dataflow.) Kept values this worker pulled from peers, and their bytes.
    pub peer_pulls: AtomicU64,
    /// Bytes of the encoded values pulled.
    pub peer_bytes_received: AtomicU64,
}

/// The bytes a value carries: its pickle and its out-of-band buffers.
pub fn value_bytes(value: &crate::rpc::pb::Value) -> u64 {
    let buffers: usize = value.buffers.iter().map(bytes::Bytes::len).sum();
    (value.pickle.len() + buffers) as u64
}

impl Stats {
    /// Counts one refused request and passes its status through, so a refusal is counted
    /// where it is made.
    pub fn reject(&self, status: tonic::Status) -> tonic::Status {
        self.rejected.fetch_add(1, Ordering::Relaxed);
        status
    }

    /// Remembers `error` as the last closure error (its first line, at most
    /// `LAST_ERROR_CHARS` characters: enough to say what failed, bounded per failure).
    pub fn note_error(&self, error: &str) {
        let first_line = error.lines().next().unwrap_or_default();
        let mut shortened: String = first_line.chars().take(LAST_ERROR_CHARS).collect();
        if shortened.len() < first_line.len() {
            shortened.push('…');
        }
        *self
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = shortened;
    }

    /// The last closure error, empty if none.
    pub fn last_error(&self) -> String {
        self.last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}
