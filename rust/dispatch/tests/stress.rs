//! Seeded stress: many closures from many threads while fake workers crash and come back
//! at random points. Every closure must end exactly once (value, its own error, or a
//! cancellation) and every closure that ended with a value or error must have executed.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::dispatch::fake::Chaos;
use crate::dispatch::{DispatchError, ErrorPolicy, PerWorkerResource};
use crate::queue::WaitPolicy;

const SEED: u64 = 0x5EED_2026;
const THREADS: usize = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Echo,
    Slow,
    Raise,
    WithResource,
}

struct Scheduled {
    kind: Kind,
    args: EncodedValue,
    cell: Arc<ResultCell>,
}

struct Setup {
    cluster: FakeCluster,
    dispatcher: Dispatcher,
    functions: HashMap<&'static str, [u8; 32]>,
    resource: PerWorkerResource,
}

fn setup(policy: ErrorPolicy) -> Setup {
    let cluster = FakeCluster::with_chaos(
        4,
        Chaos {
            seed: SEED,
            crash_probability: 0.04,
            down_for: (Duration::from_millis(1), Duration::from_millis(15)),
        },
    );
    let config = DispatcherConfig {
        error_policy: policy,
        backoff: BackoffConfig {
            initial: Duration::from_millis(1),
            max: Duration::from_millis(10),
        },
        ..fast_config()
    };
    let dispatcher = start(&cluster, config);
    let functions: HashMap<_, _> = ["echo", "sleep:1", "raise", "resource"]
        .into_iter()
        .map(|payload| (payload, function(&dispatcher, payload)))
        .collect();
    let resource = dispatcher
        .create_resource(&functions["resource"], true)
        .unwrap();
    Setup {
        cluster,
        dispatcher,
        functions,
        resource,
    }
}

/// Schedules `count` random closures from this thread; returns them with their cells.
/// A schedule that raises the pending error (`cancel_all`) still hands back its cell.
fn schedule_many(setup: &Setup, thread: usize, count: usize, raise_percent: u32) -> Vec<Scheduled> {
    let mut rng = StdRng::seed_from_u64(SEED + thread as u64);
    let mut scheduled = Vec::with_capacity(count);
    for i in 0..count {
        let roll = rng.random_range(0..100);
        let kind = match roll {
            r if r < raise_percent => Kind::Raise,
            r if r < raise_percent + 10 => Kind::WithResource,
            r if r < raise_percent + 30 => Kind::Slow,
            _ => Kind::Echo,
        };
        let (payload, text) = match kind {
            Kind::Echo => ("echo", format!("t{thread}-{i}")),
            Kind::Slow => ("sleep:1", format!("t{thread}-{i}")),
            Kind::Raise => ("raise", format!("t{thread}-{i}")),
            Kind::WithResource => ("echo", format!("res:{};t{thread}-{i}", setup.resource.id())),
        };
        let resources: &[PerWorkerResource] = if kind == Kind::WithResource {
            std::slice::from_ref(&setup.resource)
        } else {
            &[]
        };
        let args = args(&text);
        let closure = setup
            .dispatcher
            .closure(&setup.functions[payload], args.clone(), resources)
            .unwrap();
        let cell = closure.cell();
        let queued = match setup.dispatcher.try_enqueue(closure).unwrap() {
            None => Ok(()),
            Some(closure) => setup
                .dispatcher
                .enqueue(closure, &mut WaitPolicy::until(deadline())),
        };
        match queued {
            Ok(()) | Err(DispatchError::ClosureFailed(_)) => {}
            Err(other) => panic!("schedule failed: {other:?}"),
        }
        scheduled.push(Scheduled { kind, args, cell });
    }
    scheduled
}

fn schedule_from_threads(setup: &Setup, per_thread: usize, raise_percent: u32) -> Vec<Scheduled> {
    std::thread::scope(|scope| {
        let threads: Vec<_> = (0..THREADS)
            .map(|thread| {
                scope.spawn(move || schedule_many(setup, thread, per_thread, raise_percent))
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|thread| thread.join().unwrap())
            .collect()
    })
}

/// Checks one closure's ending against what it was; returns whether it was cancelled.
fn check(setup: &Setup, closure: &Scheduled, executions: &HashMap<u64, usize>) -> bool {
    let ran = executions.get(&closure.cell.id()).copied().unwrap_or(0);
    match (closure.kind, outcome(&closure.cell)) {
        (Kind::Raise, Outcome::Failed(error)) => {
            assert_eq!(
                (error.kind, error.type_name.as_str()),
                (FailureKind::User, "ValueError")
            );
        }
        (_, Outcome::Value(value)) if closure.kind != Kind::Raise => {
            assert_eq!(value, closure.args);
        }
        (_, Outcome::Cancelled(_)) => return true,
        (kind, other) => panic!(
            "{kind:?} closure {} ended with {other:?} (workers up: {:?})",
            closure.cell.id(),
            (0..4).map(|w| setup.cluster.is_up(w)).collect::<Vec<_>>()
        ),
    }
    assert!(
        ran >= 1,
        "closure {} ended without executing",
        closure.cell.id()
    );
    false
}

fn execution_counts(cluster: &FakeCluster) -> HashMap<u64, usize> {
    let mut counts = HashMap::new();
    for execution in cluster.executions() {
        *counts.entry(execution.closure_id).or_default() += 1;
    }
    counts
}

#[test]
fn per_closure_every_closure_ends_once_despite_crashing_workers() {
    let setup = setup(ErrorPolicy::PerClosure);
    let scheduled = schedule_from_threads(&setup, 300, 10);
    join(&setup.dispatcher);
    let executions = execution_counts(&setup.cluster);
    let cancelled = scheduled
        .iter()
        .filter(|closure| check(&setup, closure, &executions))
        .count();
    assert_eq!(cancelled, 0);
    let metrics = setup.dispatcher.metrics();
    let raised = scheduled.iter().filter(|c| c.kind == Kind::Raise).count() as u64;
    assert_eq!(metrics.failed, raised);
    assert_eq!(metrics.completed + metrics.failed, scheduled.len() as u64);
    assert!(
        metrics.worker_failures > 0,
        "the chaos crashed some workers"
    );
    assert!(metrics.retried > 0);
    assert_eq!((metrics.queued, metrics.inflight), (0, 0));
    // At-least-once: retried closures may have run more than once, never zero times.
    assert!(executions.len() >= scheduled.len());
}

#[test]
fn cancel_all_every_closure_ends_once_despite_crashing_workers() {
    let setup = setup(ErrorPolicy::CancelAll);
    let scheduled = schedule_from_threads(&setup, 200, 2);
    let mut raised = 0;
    loop {
        match setup.dispatcher.join(&mut WaitPolicy::until(deadline())) {
            Ok(true) => break,
            Ok(false) => panic!("join timed out"),
            Err(DispatchError::ClosureFailed(error)) => {
                assert_eq!(error.type_name, "ValueError");
                raised += 1;
            }
            Err(other) => panic!("join failed: {other:?}"),
        }
    }
    let executions = execution_counts(&setup.cluster);
    let cancelled = scheduled
        .iter()
        .filter(|closure| check(&setup, closure, &executions))
        .count() as u64;
    let metrics = setup.dispatcher.metrics();
    assert_eq!(metrics.cancelled, cancelled);
    assert_eq!(
        metrics.completed + metrics.failed + metrics.cancelled,
        scheduled.len() as u64
    );
    if metrics.failed > 0 {
        assert!(
            raised >= 1 || cancelled > 0,
            "a failure was reported somewhere"
        );
    }
}
