//! The dispatcher's view of one worker: the [`WorkerTransport`] trait, implemented for real
//! by the tonic [`WorkerClient`] and in memory by `super::fake` (tests and benches only).
//!
//! Messages are the protocol's own (`crate::rpc::pb`) and errors are [`RpcError`], so the
//! real implementation is a straight delegation and the fake speaks exactly what a worker
//! would: the link's state machine cannot tell them apart.

use std::future::Future;
use std::time::Duration;

use crate::rpc::{pb, ClosureChannel, RpcError, WorkerClient};

/// The calls a link makes to its worker. Every call takes an optional timeout; on expiry
/// it fails with [`RpcError::DeadlineExceeded`].
///
/// A worker that cannot be reached, or is shutting down, answers
/// [`RpcError::Unavailable`]; a closure that ran and raised is not an error here but an
/// answer carrying `outcome = Error`. Closures travel on `RunClosures` streams only: the
/// unary `RunClosure` stays in the protocol for other clients (e.g. `grpcio`).
pub trait WorkerTransport: Send + Sync + 'static {
    /// The worker's address, as configured (used in messages and metrics).
    fn address(&self) -> &str;

    /// Health, identity and counters.
    fn get_status(
        &self,
        timeout: Option<Duration>,
    ) -> impl Future<Output = Result<pb::GetStatusResponse, RpcError>> + Send;

    /// Stores a function payload under its content hash.
    fn register_function(
        &self,
        request: pb::RegisterFunctionRequest,
        timeout: Option<Duration>,
    ) -> impl Future<Output = Result<pb::RegisterFunctionResponse, RpcError>> + Send;

    /// The largest message the worker accepts, in bytes: a closure whose request is larger
    /// cannot be sent.
    fn max_message_bytes(&self) -> usize;

    /// Opens a `RunClosures` stream whose first message is `first`. Resolves once the
    /// worker accepted the call; a refused call (e.g. `UNAUTHENTICATED`) queued nothing.
    fn run_closures(
        &self,
        first: pb::RunClosuresRequest,
    ) -> impl Future<Output = Result<ClosureChannel, RpcError>> + Send;

    /// Runs a registered function and keeps its result on the worker as a resource.
    fn create_resource(
        &self,
        request: pb::CreateResourceRequest,
        timeout: Option<Duration>,
    ) -> impl Future<Output = Result<pb::CreateResourceResponse, RpcError>> + Send;

    /// Drops resources; returns how many the worker held.
    fn release_resource(
        &self,
        resource_ids: Vec<u64>,
        timeout: Option<Duration>,
    ) -> impl Future<Output = Result<u32, RpcError>> + Send;

    /// Reads kept value `value_id` of the session (`ReadValue`, dataflow): a kept value's
    /// `fetch()` on the coordinator. `NOT_FOUND` when the worker does not hold it.
    fn read_value(
        &self,
        value_id: u64,
        timeout: Option<Duration>,
    ) -> impl Future<Output = Result<pb::Value, RpcError>> + Send;
}

impl WorkerTransport for WorkerClient {
    fn address(&self) -> &str {
        WorkerClient::address(self)
    }

    fn get_status(
        &self,
        timeout: Option<Duration>,
    ) -> impl Future<Output = Result<pb::GetStatusResponse, RpcError>> + Send {
        WorkerClient::get_status(self, timeout)
    }

    fn register_function(
        &self,
        request: pb::RegisterFunctionRequest,
        timeout: Option<Duration>,
    ) -> impl Future<Output = Result<pb::RegisterFunctionResponse, RpcError>> + Send {
        WorkerClient::register_function(self, request, timeout)
    }

    fn max_message_bytes(&self) -> usize {
        WorkerClient::max_message_bytes(self)
    }

    fn run_closures(
        &self,
        first: pb::RunClosuresRequest,
    ) -> impl Future<Output = Result<ClosureChannel, RpcError>> + Send {
        WorkerClient::run_closures(self, first)
    }

    fn create_resource(
        &self,
        request: pb::CreateResourceRequest,
        timeout: Option<Duration>,
    ) -> impl Future<Output = Result<pb::CreateResourceResponse, RpcError>> + Send {
        WorkerClient::create_resource(self, request, timeout)
    }

    fn release_resource(
        &self,
        resource_ids: Vec<u64>,
        timeout: Option<Duration>,
    ) -> impl Future<Output = Result<u32, RpcError>> + Send {
        WorkerClient::release_resource(self, resource_ids, timeout)
    }

    fn read_value(
        &self,
        value_id: u64,
        timeout: Option<Duration>,
    ) -> impl Future<Output = Result<pb::Value, RpcError>> + Send {
        WorkerClient::read_value(self, value_id, timeout)
    }
}
