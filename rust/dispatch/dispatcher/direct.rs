//! Calls the dispatcher makes to one worker itself, beside its link: `GetStatus` to
//! refresh a stale status ([`Dispatcher::refresh_statuses`]) and `ReadValue` to fetch a
//! kept value to the coordinator ([`Dispatcher::read_value`]).
//!
//! Both go through the link's own transport, so they carry the coordinator's token, TLS
//! settings and session id, and need no connection of their own.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::Dispatcher;
use crate::dispatch::result_cell::EncodedValue;
use crate::dispatch::transport::WorkerTransport;
use crate::rpc::{pb, RpcError};

/// A boxed call to one worker, so the dispatcher can hold its links' transports without
/// knowing their type.
type Call<'a, T> = Pin<Box<dyn Future<Output = Result<T, RpcError>> + Send + 'a>>;

/// The calls of this file, object-safe (a [`WorkerTransport`]'s methods return
/// `impl Future`, so it cannot be a trait object itself).
pub(super) trait DirectCalls: Send + Sync {
    /// `GetStatus`, bounded by `timeout`.
    fn probe(&self, timeout: Duration) -> Call<'_, pb::GetStatusResponse>;
    /// `ReadValue` of `value_id`, bounded by `timeout` when given.
    fn read(&self, value_id: u64, timeout: Option<Duration>) -> Call<'_, pb::Value>;
}

impl<T: WorkerTransport> DirectCalls for T {
    fn probe(&self, timeout: Duration) -> Call<'_, pb::GetStatusResponse> {
        Box::pin(self.get_status(Some(timeout)))
    }

    fn read(&self, value_id: u64, timeout: Option<Duration>) -> Call<'_, pb::Value> {
        Box::pin(self.read_value(value_id, timeout))
    }
}

impl Dispatcher {
    /// Reads kept value `value_id` from worker `worker` with `ReadValue` (chunked, in this
    /// dispatcher's session, with its token and TLS settings), and counts it and its bytes
    /// in [`MetricsSnapshot::kept_bytes_fetched`](super::MetricsSnapshot). This is a kept
    /// value's `fetch()`: the bytes come to the coordinator once, not through a closure.
    ///
    /// The future runs on the shared runtime (the transport's connection lives there).
    /// Fails `NOT_FOUND` when the worker does not hold the value (released, or the worker
    /// restarted), `UNAVAILABLE` when it cannot be reached, `INVALID_ARGUMENT` for an index
    /// out of range: whether to re-make the value is the caller's decision.
    pub fn read_value(
        &self,
        worker: usize,
        value_id: u64,
        timeout: Option<Duration>,
    ) -> impl Future<Output = Result<EncodedValue, RpcError>> + Send + 'static {
        let direct = self.lock_direct().get(worker).map(Arc::clone);
        let shared = Arc::clone(&self.shared);
        let workers = self.num_workers();
        async move {
            let Some(direct) = direct else {
                return Err(RpcError::InvalidArgument(format!(
                    "there is no worker {worker} to read kept value {value_id} from; the \
                     indices are 0 to {}",
                    workers.saturating_sub(1)
                )));
            };
            let value = direct.read(value_id, timeout).await?;
            let value = EncodedValue {
                pickle: value.pickle,
                buffers: value.buffers,
            };
            let counters = &shared.counters;
            counters.kept_values_fetched.fetch_add(1, Ordering::Relaxed);
            counters
                .kept_bytes_fetched
                .fetch_add(value.byte_len() as u64, Ordering::Relaxed);
            Ok(value)
        }
    }
}
