//! Pipelining against the fake cluster: only while no worker is idle, reclaimed when a
//! worker goes idle, put back when a worker dies, and never started after a failure under
//! `cancel_all`. Every claim is checked by conditions (gates, what each fake worker
//! received and ran), never by timing.

use std::sync::Arc;

use super::*;
use crate::dispatch::{CellStatus, DispatchError, ErrorPolicy};
use crate::queue::WaitPolicy;

/// The worker running a closure right now, waiting until one is.
fn busy_worker(cluster: &FakeCluster, workers: usize, except: Option<usize>) -> usize {
    let mut found = None;
    wait_until("a worker runs the gated closure", || {
        found = (0..workers).find(|&i| Some(i) != except && cluster.running(i) == 1);
        found.is_some()
    });
    found.unwrap_or_default()
}

fn echoes(dispatcher: &Dispatcher, echo: &[u8; 32], count: usize) -> Vec<Arc<ResultCell>> {
    (0..count)
        .map(|i| {
            dispatcher
                .schedule(echo, args(&format!("e{i}")), &[])
                .unwrap()
        })
        .collect()
}

/// Ids of `cells`.
fn ids(cells: &[Arc<ResultCell>]) -> Vec<u64> {
    cells.iter().map(|cell| cell.id()).collect()
}

/// Gets `count` echoes pipelined on one worker behind a gated closure: worker `w` runs
/// `gate:held` (until opened) with every echo queued behind it, while the other worker
/// runs the fake function `other` (gated too, e.g. `gate:other`). Returns `w`, the held
/// closure and the echoes.
fn pipeline_behind_gate(
    cluster: &FakeCluster,
    dispatcher: &Dispatcher,
    other: &str,
    count: usize,
) -> (usize, Arc<ResultCell>, Vec<Arc<ResultCell>>) {
    let first = function(dispatcher, "gate:first");
    let other_fn = function(dispatcher, other);
    let held_fn = function(dispatcher, "gate:held");
    let echo = function(dispatcher, "echo");
    // Teach both workers the functions, so nothing waits for a registration later.
    for _ in 0..4 {
        value(&dispatcher.schedule(&echo, args("warm"), &[]).unwrap());
    }
    dispatcher.schedule(&first, args("first"), &[]).unwrap();
    let w = busy_worker(cluster, 2, None);
    dispatcher.schedule(&other_fn, args("other"), &[]).unwrap();
    busy_worker(cluster, 2, Some(w));
    // Both busy and neither answering: these wait in the queue.
    let held = dispatcher.schedule(&held_fn, args("held"), &[]).unwrap();
    let cells = echoes(dispatcher, &echo, count);
    // w answers; no worker is idle, so its link tops up with everything queued.
    cluster.open_gate("first");
    let wanted = ids(&cells);
    wait_until("the echoes are pipelined behind the held closure", || {
        let received = cluster.received(w);
        wanted.iter().all(|id| received.contains(id)) && cluster.running(w) == 1
    });
    assert_eq!(ran_on(cluster, held.id()), [w]);
    (w, held, cells)
}

#[test]
fn a_closure_never_queues_behind_a_busy_worker_while_another_is_idle() {
    let cluster = FakeCluster::new(2);
    let dispatcher = start(&cluster, fast_config());
    let long = function(&dispatcher, "gate:long");
    let echo = function(&dispatcher, "echo");
    let held = dispatcher.schedule(&long, args("long"), &[]).unwrap();
    let a = busy_worker(&cluster, 2, None);
    let b = 1 - a;
    // One at a time, each with b idle: every closure goes to b and finishes while a is
    // still held, so none waited behind a.
    for i in 0..20 {
        let cell = dispatcher
            .schedule(&echo, args(&format!("next{i}")), &[])
            .unwrap();
        assert_eq!(value(&cell), args(&format!("next{i}")));
        assert_eq!(ran_on(&cluster, cell.id()), [b]);
    }
    assert_eq!(cluster.received(a), [held.id()], "nothing was sent to a");
    assert_eq!(held.status(), CellStatus::NotReady);
    cluster.open_gate("long");
    assert_eq!(value(&held), args("long"));
}

#[test]
fn closures_pipelined_behind_a_long_one_are_reclaimed_when_a_worker_goes_idle() {
    let cluster = FakeCluster::new(2);
    let dispatcher = start(&cluster, fast_config());
    let (w, held, cells) = pipeline_behind_gate(&cluster, &dispatcher, "gate:other", 10);
    // The other worker goes idle with nothing queued: w's link takes its queued closures
    // back and they run there, while w is still held.
    cluster.open_gate("other");
    for cell in &cells {
        value(cell);
        assert_eq!(
            ran_on(&cluster, cell.id()),
            [1 - w],
            "closure {}",
            cell.id()
        );
    }
    assert_eq!(held.status(), CellStatus::NotReady);
    assert_eq!(dispatcher.metrics().retried, 0, "handed back, not retried");
    cluster.open_gate("held");
    value(&held);
    join(&dispatcher);
}

#[test]
fn every_closure_pipelined_on_a_worker_that_dies_runs_again_elsewhere() {
    let cluster = FakeCluster::new(2);
    let dispatcher = start(&cluster, fast_config());
    let (w, held, cells) = pipeline_behind_gate(&cluster, &dispatcher, "gate:other", 12);
    cluster.kill(w);
    cluster.open_gate("other");
    cluster.open_gate("held");
    for (i, cell) in cells.iter().enumerate() {
        assert_eq!(value(cell), args(&format!("e{i}")));
        assert_eq!(
            ran_on(&cluster, cell.id()),
            [1 - w],
            "closure {}",
            cell.id()
        );
    }
    // The held closure started on w before it died, and ran again on the other worker.
    assert_eq!(value(&held), args("held"));
    assert_eq!(ran_on(&cluster, held.id()), [w, 1 - w]);
    let metrics = dispatcher.metrics();
    assert!(metrics.retried >= 13, "{metrics:?}");
    assert!(metrics.worker_failures >= 1, "{metrics:?}");
    join(&dispatcher);
}

#[test]
fn closures_pipelined_behind_a_failure_never_start_under_cancel_all() {
    let cluster = FakeCluster::new(1);
    let dispatcher = start(&cluster, fast_config());
    let first = function(&dispatcher, "gate:first");
    let failing = function(&dispatcher, "gate-raise:fail");
    let echo = function(&dispatcher, "echo");
    value(&dispatcher.schedule(&echo, args("warm"), &[]).unwrap());
    dispatcher.schedule(&first, args("first"), &[]).unwrap();
    busy_worker(&cluster, 1, None);
    let failed = dispatcher.schedule(&failing, args("bad"), &[]).unwrap();
    let cells = echoes(&dispatcher, &echo, 8);
    cluster.open_gate("first");
    let wanted = ids(&cells);
    wait_until(
        "the echoes are pipelined behind the failing closure",
        || {
            let received = cluster.received(0);
            wanted.iter().all(|id| received.contains(id))
        },
    );
    cluster.open_gate("fail");
    for cell in &cells {
        assert!(cancellation(cell).contains("another closure failed"));
        assert!(ran_on(&cluster, cell.id()).is_empty());
    }
    assert_eq!(failure(&failed).message, "raised on purpose");
    let raised = dispatcher.join(&mut WaitPolicy::until(deadline()));
    assert!(
        matches!(raised, Err(DispatchError::ClosureFailed(_))),
        "{raised:?}"
    );
    // The worker resumes the stream for the next closure.
    let after = dispatcher.schedule(&echo, args("after"), &[]).unwrap();
    assert_eq!(value(&after), args("after"));
}

#[test]
fn a_failure_reclaims_closures_pipelined_on_other_workers_under_cancel_all() {
    let cluster = FakeCluster::new(2);
    let dispatcher = start(&cluster, fast_config());
    let (w, held, cells) = pipeline_behind_gate(&cluster, &dispatcher, "gate-raise:other", 8);
    // The other worker's closure fails while w still holds its queue: w's link takes the
    // queue back, and the closures are cancelled without ever starting.
    cluster.open_gate("other");
    for cell in &cells {
        assert!(cancellation(cell).contains("another closure failed"));
        assert!(
            ran_on(&cluster, cell.id()).is_empty(),
            "closure {}",
            cell.id()
        );
    }
    assert_eq!(ran_on(&cluster, held.id()), [w]);
    cluster.open_gate("held");
    let raised = dispatcher.join(&mut WaitPolicy::until(deadline()));
    assert!(
        matches!(raised, Err(DispatchError::ClosureFailed(_))),
        "{raised:?}"
    );
    // Running when the failure happened, the held closure finished normally.
    assert_eq!(value(&held), args("held"));
}

#[test]
fn per_closure_lets_pipelined_closures_run_after_an_error() {
    let cluster = FakeCluster::new(1);
    let config = DispatcherConfig {
        error_policy: ErrorPolicy::PerClosure,
        ..fast_config()
    };
    let dispatcher = start(&cluster, config);
    let cells = schedule_raising_every(&dispatcher, 50, 5);
    for (i, cell) in cells.iter().enumerate() {
        if i % 5 == 0 {
            assert_eq!(failure(cell).kind, FailureKind::User);
        } else {
            assert_eq!(value(cell), args(&i.to_string()));
        }
    }
    join(&dispatcher);
}

#[test]
fn a_busy_link_stops_pipelining_once_its_byte_budget_is_outstanding() {
    let cluster = FakeCluster::new(2);
    let dispatcher = start(
        &cluster,
        DispatcherConfig {
            pipeline_bytes: 4096,
            ..fast_config()
        },
    );
    let first = function(&dispatcher, "gate:first");
    let other = function(&dispatcher, "gate:other");
    let held_fn = function(&dispatcher, "gate:held");
    let echo = function(&dispatcher, "echo");
    for _ in 0..4 {
        value(&dispatcher.schedule(&echo, args("warm"), &[]).unwrap());
    }
    dispatcher.schedule(&first, args("first"), &[]).unwrap();
    let w = busy_worker(&cluster, 2, None);
    dispatcher.schedule(&other, args("other"), &[]).unwrap();
    busy_worker(&cluster, 2, Some(w));
    let held = dispatcher.schedule(&held_fn, args("held"), &[]).unwrap();
    // Ten closures of 1,027 bytes each: behind `held` (10 bytes), the fourth brings what
    // is outstanding to 4,118 bytes, over the 4,096 budget, well under the depth of 64.
    let big = |i: usize| EncodedValue {
        pickle: Bytes::from(format!("big{i}")),
        buffers: vec![Bytes::from(vec![u8::try_from(i).unwrap(); 1023])],
    };
    let cells: Vec<_> = (0..10)
        .map(|i| dispatcher.schedule(&echo, big(i), &[]).unwrap())
        .collect();
    cluster.open_gate("first");
    // The link took what it sends before sending it: once w has the first four, the
    // queue shows what the top-up left.
    wait_until("the held closure and four behind it reach w", || {
        let received = cluster.received(w);
        received.contains(&held.id()) && ids(&cells)[..4].iter().all(|id| received.contains(id))
    });
    assert_eq!(
        dispatcher.metrics().queued,
        6,
        "six closures wait in the queue, not on w"
    );
    let received = cluster.received(w);
    for cell in &cells[4..] {
        assert!(
            !received.contains(&cell.id()),
            "closure {} pipelined past the byte budget",
            cell.id()
        );
    }
    cluster.open_gate("held");
    cluster.open_gate("other");
    value(&held);
    for (i, cell) in cells.iter().enumerate() {
        assert_eq!(value(cell), big(i), "closure {i} echoes its argument");
    }
    join(&dispatcher);
}
