//! An in-memory cluster of fake workers behind [`WorkerTransport`], for the dispatcher's
//! tests and benchmarks.
//!
//! A fake worker speaks the protocol's messages and errors like a real one: it holds
//! registered functions by hash (`NOT_FOUND` otherwise), keeps resources, reports
//! `GetStatus` with its process incarnation as `incarnation` and pid 1 (as in a container,
//! so only the incarnation tells a restart), and answers `UNAVAILABLE` while
//! down. Tests kill and restart workers, open gates, or let seeded chaos crash workers at
//! random points; every execution is logged, so at-least-once delivery can be checked.
//!
//! Closures arrive on `RunClosures` streams (see `stream.rs`), each logged as a
//! `RunClosure` call when it starts running and in [`FakeCluster::received`] when it
//! arrives.
//!
//! What a function does is spelled by its payload (UTF-8), see [`behaviour`]:
//! `echo`, `raise`, `infra`, `sleep:<ms>`, `gate:<name>`, `gate-raise:<name>`,
//! `crash-on:<worker>`, `ps-fail:<task>:<times>`, and for resources `resource` /
//! `resource-raise`. Arguments whose
//! pickle starts with `res:<id>,<id>…` use those resources, as a real worker resolves
//! persistent ids. `ReadValue` of a resource built fine answers the pickle
//! `value <id>` (a kept value, as the fake sees one); of anything else, `NOT_FOUND`.

pub mod behaviour;
mod stream;
mod transport;
mod worker;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::watch;

pub use transport::FakeTransport;
use worker::FakeWorker;

/// Random worker crashes for stress tests: each `RunClosure` crashes its worker with
/// probability `crash_probability` (before or after running the closure, at random), and a
/// crashed worker restarts, state lost, after a pause drawn from `down_for`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Chaos {
    /// Seed of the cluster's random generator.
    pub seed: u64,
    /// Chance that one `RunClosure` crashes its worker.
    pub crash_probability: f64,
    /// Bounds of how long a crashed worker stays down.
    pub down_for: (Duration, Duration),
}

/// One call a fake worker received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeCall {
    /// The RPC name, e.g. `"RunClosure"`.
    pub method: &'static str,
    /// When it arrived.
    pub at: Instant,
    /// The worker's incarnation then (0 while down).
    pub incarnation: u64,
    /// The closure or resource id it was about, if any.
    pub subject: Option<u64>,
}

/// One execution of a closure's function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Execution {
    /// The closure id (`RunClosureRequest.closure_id`).
    pub closure_id: u64,
    /// The worker that ran it.
    pub worker: usize,
}

/// The execution log and, beside it, a count per closure: `ps-fail` asks for a closure's
/// attempt number on every execution, and counting through the log each time made the
/// dispatch benchmark quadratic.
#[derive(Default)]
struct Executions {
    log: Vec<Execution>,
    attempts: HashMap<u64, usize>,
}

/// State shared by the cluster handle and every transport.
pub(crate) struct ClusterInner {
    workers: Vec<FakeWorker>,
    gates: Mutex<HashMap<String, watch::Sender<bool>>>,
    executions: Mutex<Executions>,
    chaos: Option<Chaos>,
    rng: Mutex<SplitMix>,
    /// Workers too old to report an incarnation: `GetStatus` has only a pid, which changes
    /// on restart.
    pub(crate) pid_only: bool,
}

impl ClusterInner {
    fn gate(&self, name: &str) -> watch::Receiver<bool> {
        lock(&self.gates)
            .entry(name.to_owned())
            .or_insert_with(|| watch::Sender::new(false))
            .subscribe()
    }

    /// Logs an execution; returns how many executions of `closure_id` there were, this
    /// one included.
    fn record_execution(&self, closure_id: u64, worker: usize) -> usize {
        let mut executions = lock(&self.executions);
        executions.log.push(Execution { closure_id, worker });
        let attempts = executions.attempts.entry(closure_id).or_insert(0);
        *attempts += 1;
        *attempts
    }

    /// A uniform draw in `[0, 1)`.
    fn random(&self) -> f64 {
        lock(&self.rng).next_f64()
    }
}

/// A cluster of in-memory workers; see the [module documentation](self).
///
/// ```
/// use _core::dispatch::fake::FakeCluster;
/// use _core::dispatch::WorkerTransport;
///
/// let cluster = FakeCluster::new(2);
/// let transports = cluster.transports();
/// assert_eq!(transports[1].address(), "fake-worker-1:8470");
/// cluster.kill(1);
/// assert!(!cluster.is_up(1));
/// ```
#[derive(Clone)]
pub struct FakeCluster {
    inner: Arc<ClusterInner>,
}

impl FakeCluster {
    /// `workers` healthy workers.
    pub fn new(workers: usize) -> Self {
        Self::build(workers, None)
    }

    /// `workers` healthy workers of an older protocol: their `GetStatus` reports no
    /// incarnation, only a pid (different after each restart).
    pub fn pid_only(workers: usize) -> Self {
        let mut cluster = Self::build(workers, None);
        if let Some(inner) = Arc::get_mut(&mut cluster.inner) {
            inner.pid_only = true;
        }
        cluster
    }

    /// `workers` workers that crash at random as `chaos` says.
    pub fn with_chaos(workers: usize, chaos: Chaos) -> Self {
        Self::build(workers, Some(chaos))
    }

    fn build(workers: usize, chaos: Option<Chaos>) -> Self {
        let seed = chaos.map_or(0, |chaos| chaos.seed);
        Self {
            inner: Arc::new(ClusterInner {
                workers: (0..workers).map(FakeWorker::new).collect(),
                gates: Mutex::new(HashMap::new()),
                executions: Mutex::new(Executions::default()),
                chaos,
                rng: Mutex::new(SplitMix(seed)),
                pid_only: false,
            }),
        }
    }

    /// Worker `index`'s `GetStatus` reports Python `version` from now on.
    pub fn report_python(&self, index: usize, version: &str) {
        version.clone_into(&mut lock(&self.inner.workers[index].python_version));
    }

    /// Worker `index`'s `GetStatus` reports being rank `rank` of a slice of `size` hosts.
    pub fn report_slice(&self, index: usize, rank: u32, size: u32) {
        *lock(&self.inner.workers[index].slice) = Some(crate::rpc::pb::SliceMembership {
            index: 0,
            rank,
            size,
        });
    }

    /// One transport per worker, in index order.
    pub fn transports(&self) -> Vec<FakeTransport> {
        (0..self.inner.workers.len())
            .map(|index| FakeTransport::new(Arc::clone(&self.inner), index))
            .collect()
    }

    /// Crashes worker `index`: it loses its functions and resources, calls in flight fail
    /// `UNAVAILABLE`, and so does every call until [`restart`](Self::restart).
    pub fn kill(&self, index: usize) {
        self.inner.workers[index].kill();
    }

    /// How many `RunClosures` streams are open on worker `index`.
    pub fn open_streams(&self, index: usize) -> usize {
        self.inner.workers[index]
            .streams
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Makes worker `index` not accept its next `RunClosures` call until gate `streams`
    /// opens (later calls are accepted).
    pub fn stall_next_stream(&self, index: usize) {
        self.inner.workers[index]
            .stall_next_stream
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Brings worker `index` back as a new process (new incarnation), holding nothing.
    pub fn restart(&self, index: usize) {
        self.inner.workers[index].restart();
    }

    /// Makes worker `index` forget its functions without restarting (an eviction).
    pub fn forget_functions(&self, index: usize) {
        self.inner.workers[index].forget_functions();
    }

    /// Whether worker `index` is up.
    pub fn is_up(&self, index: usize) -> bool {
        self.inner.workers[index].is_up()
    }

    /// Opens gate `name`: closures of `gate:<name>` functions proceed.
    pub fn open_gate(&self, name: &str) {
        lock(&self.inner.gates)
            .entry(name.to_owned())
            .or_insert_with(|| watch::Sender::new(false))
            .send_replace(true);
    }

    /// Every execution so far, in start order.
    pub fn executions(&self) -> Vec<Execution> {
        lock(&self.inner.executions).log.clone()
    }

    /// The calls worker `index` received, in order.
    pub fn calls(&self, index: usize) -> Vec<FakeCall> {
        self.inner.workers[index].calls()
    }

    /// How many `RegisterFunction` calls worker `index` accepted.
    pub fn registrations(&self, index: usize) -> usize {
        self.calls(index)
            .iter()
            .filter(|call| call.method == "RegisterFunction" && call.incarnation != 0)
            .count()
    }

    /// Resource ids worker `index` holds right now (built successfully or not).
    pub fn resources(&self, index: usize) -> Vec<u64> {
        self.inner.workers[index].resource_ids()
    }

    /// Closure ids worker `index` received on its streams, in arrival order, whether they
    /// then ran, were handed back, or died with the worker.
    pub fn received(&self, index: usize) -> Vec<u64> {
        self.inner.workers[index].received()
    }

    /// Closures worker `index` is executing right now.
    pub fn running(&self, index: usize) -> u32 {
        self.inner.workers[index].running()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Test scaffolding: every critical section is a single update.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A small seeded generator (splitmix64): deterministic per seed, no dependency.
struct SplitMix(u64);

impl SplitMix {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    // 53 random bits fit an f64's mantissa exactly.
    #[allow(clippy::cast_precision_loss)]
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}
