//! Counters a worker reports through `GetStatus`.
//!
//! Counters only: what counts as a finished closure or a created resource is decided where
//! jobs are answered (`jobs.rs`), so this file depends on nothing else in the worker.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

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
    /// Bytes of closure and resource arguments received (pickle plus buffers).
    pub bytes_received: AtomicU64,
    /// Bytes of closure results sent (pickle plus buffers).
    pub bytes_sent: AtomicU64,
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
}
