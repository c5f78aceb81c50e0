//! Dispatcher tests: every outcome path against the in-memory fake cluster, a seeded
//! stress test with crashing workers, and end-to-end runs against real tonic workers.
//! Every wait has a deadline; nothing sleeps to let things settle.

mod deaths;
mod elastic;
mod observe;
mod outcomes;
mod pipelining;
mod ps_failures;
mod real_worker;
mod recovery;
mod resources;
mod schedule_on;
mod stress;
mod timing;
mod versions;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::fake::FakeCluster;
use super::{
    BackoffConfig, ClosureFailure, Dispatcher, DispatcherConfig, EncodedValue, FailureKind,
    FunctionKind, Outcome, PerWorkerResource, ResourceState, ResultCell,
};
use crate::rpc::content_hash;
use tonic::Code;

/// Upper bound on any single wait in these tests; far above what a healthy run needs.
pub(super) const PATIENCE: Duration = Duration::from_secs(60);

#[allow(clippy::unnecessary_wraps)] // every caller passes it on as an optional deadline
pub(super) fn deadline() -> Option<Instant> {
    Some(Instant::now() + PATIENCE)
}

/// A config that recovers quickly, for tests.
pub(super) fn fast_config() -> DispatcherConfig {
    DispatcherConfig {
        backoff: BackoffConfig {
            initial: Duration::from_millis(5),
            max: Duration::from_millis(50),
        },
        probe_timeout: Duration::from_secs(2),
        ..DispatcherConfig::default()
    }
}

pub(super) fn start(cluster: &FakeCluster, config: DispatcherConfig) -> Dispatcher {
    Dispatcher::new(cluster.transports(), config).expect("dispatcher starts")
}

/// Registers the fake function spelled `payload`; returns its hash.
pub(super) fn function(dispatcher: &Dispatcher, payload: &str) -> [u8; 32] {
    let payload = Bytes::copy_from_slice(payload.as_bytes());
    let hash = content_hash(&payload);
    dispatcher
        .register_function(&hash, FunctionKind::Cloudpickle, payload)
        .expect("function registers");
    hash
}

/// A per-worker resource of the fake `resource` function (rebuilt after a restart), once
/// it is built on workers `0..workers`.
pub(super) fn built_resource(dispatcher: &Dispatcher, workers: usize) -> PerWorkerResource {
    let make = function(dispatcher, "resource");
    let resource = dispatcher.create_resource(&make, true).unwrap();
    wait_until("the resource is built", || {
        (0..workers).all(|w| resource.state(w) == ResourceState::Ready)
    });
    resource
}

pub(super) fn args(text: &str) -> EncodedValue {
    EncodedValue {
        pickle: Bytes::copy_from_slice(text.as_bytes()),
        buffers: vec![Bytes::from_static(b"buffer")],
    }
}

/// The state of worker `index`'s link.
pub(super) fn state(dispatcher: &Dispatcher, index: usize) -> super::LinkState {
    dispatcher.worker_statuses()[index].state
}

/// Polls `condition` until it holds, failing the test after [`PATIENCE`].
pub(super) fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let give_up = Instant::now() + PATIENCE;
    while !condition() {
        assert!(Instant::now() < give_up, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Waits for `cell` and returns its outcome.
pub(super) fn outcome(cell: &ResultCell) -> Outcome {
    assert!(cell.wait(deadline()), "closure {} never ended", cell.id());
    cell.outcome().expect("a settled cell has an outcome")
}

pub(super) fn value(cell: &ResultCell) -> EncodedValue {
    match outcome(cell) {
        Outcome::Value(value) => value,
        other => panic!("closure {} ended with {other:?}, not a value", cell.id()),
    }
}

pub(super) fn failure(cell: &ResultCell) -> Arc<ClosureFailure> {
    match outcome(cell) {
        Outcome::Failed(failure) => failure,
        other => panic!("closure {} ended with {other:?}, not a failure", cell.id()),
    }
}

pub(super) fn cancellation(cell: &ResultCell) -> String {
    match outcome(cell) {
        Outcome::Cancelled(why) => why,
        other => panic!("closure {} ended with {other:?}, not cancelled", cell.id()),
    }
}

/// The workers that executed closure `id`, in order.
pub(super) fn ran_on(cluster: &FakeCluster, id: u64) -> Vec<usize> {
    cluster
        .executions()
        .iter()
        .filter(|execution| execution.closure_id == id)
        .map(|execution| execution.worker)
        .collect()
}

/// Schedules `count` closures echoing their index, every `every`-th one (from 0) raising
/// instead: a mix of user errors and values for the error-policy tests.
pub(super) fn schedule_raising_every(
    dispatcher: &Dispatcher,
    count: usize,
    every: usize,
) -> Vec<Arc<ResultCell>> {
    let raise = function(dispatcher, "raise");
    let echo = function(dispatcher, "echo");
    (0..count)
        .map(|i| {
            let f = if i % every == 0 { &raise } else { &echo };
            dispatcher.schedule(f, args(&i.to_string()), &[]).unwrap()
        })
        .collect()
}

/// Whether every link has reached its worker.
pub(super) fn all_up(dispatcher: &Dispatcher) -> bool {
    dispatcher
        .metrics()
        .workers
        .iter()
        .all(|w| w.state.label() == "up")
}

/// `join` with a deadline, expected to report everything done.
pub(super) fn join(dispatcher: &Dispatcher) {
    let mut policy = crate::queue::WaitPolicy::until(deadline());
    assert!(
        dispatcher.join(&mut policy).expect("no pending error"),
        "join timed out"
    );
}
