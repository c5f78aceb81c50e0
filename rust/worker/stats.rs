//! Counters a worker reports through `GetStatus`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::jobs::JobReply;
use crate::rpc::pb;

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
}

impl Stats {
    /// Counts one answered job.
    pub fn record_reply(&self, reply: &JobReply) {
        match reply {
            JobReply::Run(response) => {
                self.closures_run.fetch_add(1, Ordering::Relaxed);
                if matches!(
                    response.outcome,
                    Some(pb::run_closure_response::Outcome::Error(_)) | None
                ) {
                    self.closures_failed.fetch_add(1, Ordering::Relaxed);
                }
            }
            JobReply::CreateResource(response) => {
                if response.error.is_none() {
                    self.resources_created.fetch_add(1, Ordering::Relaxed);
                }
            }
            JobReply::ReleaseResource(response) => {
                self.resources_released
                    .fetch_add(u64::from(response.released), Ordering::Relaxed);
            }
        }
    }

    /// Counts one refused request and passes its status through.
    pub fn reject(&self, status: tonic::Status) -> tonic::Status {
        self.rejected.fetch_add(1, Ordering::Relaxed);
        status
    }
}
