//! Success, user errors under both policies, cancellation, shutdown, function registration.

use std::collections::HashSet;

use super::*;
use crate::dispatch::{CellStatus, DispatchError, ErrorPolicy, FailureKind};
use crate::queue::WaitPolicy;

#[test]
fn closures_return_their_values_and_each_worker_gets_the_function_once() {
    let cluster = FakeCluster::new(2);
    let dispatcher = start(&cluster, fast_config());
    let echo = function(&dispatcher, "echo");
    let cells: Vec<_> = (0..40)
        .map(|i| {
            dispatcher
                .schedule(&echo, args(&format!("v{i}")), &[])
                .unwrap()
        })
        .collect();
    join(&dispatcher);
    for (i, cell) in cells.iter().enumerate() {
        assert_eq!(value(cell), args(&format!("v{i}")));
        assert_eq!(ran_on(&cluster, cell.id()).len(), 1);
    }
    let used: HashSet<usize> = cluster.executions().iter().map(|e| e.worker).collect();
    for &worker in &used {
        assert_eq!(cluster.registrations(worker), 1, "worker {worker}");
    }
    let metrics = dispatcher.metrics();
    assert_eq!(metrics.completed, 40);
    assert_eq!(metrics.functions_registered, used.len() as u64);
    assert_eq!(
        (metrics.queued, metrics.inflight, metrics.failed),
        (0, 0, 0)
    );
    assert_eq!(metrics.latency.count, 40);
    wait_until("both links reached their workers", || all_up(&dispatcher));
}

#[test]
fn cancel_all_raises_the_first_error_once_and_cancels_what_is_queued() {
    let cluster = FakeCluster::new(1);
    let dispatcher = start(&cluster, fast_config());
    let failing = function(&dispatcher, "gate-raise:first");
    let echo = function(&dispatcher, "echo");
    let first = dispatcher.schedule(&failing, args("a"), &[]).unwrap();
    wait_until("the failing closure runs", || cluster.running(0) == 1);
    let queued: Vec<_> = (0..5)
        .map(|_| dispatcher.schedule(&echo, args("c"), &[]).unwrap())
        .collect();
    std::thread::scope(|scope| {
        let joining = scope.spawn(|| dispatcher.join(&mut WaitPolicy::until(deadline())));
        cluster.open_gate("first");
        match joining.join().unwrap() {
            Err(DispatchError::ClosureFailed(error)) => {
                assert_eq!(error.kind, FailureKind::User);
                assert_eq!(error.type_name, "ValueError");
                assert_eq!(error.worker, "fake-worker-0:8470");
            }
            other => panic!("join returned {other:?}"),
        }
    });
    for cell in &queued {
        assert!(cancellation(cell).contains("another closure failed"));
    }
    assert_eq!(failure(&first).message, "raised on purpose");
    // The error was raised once and cleared: the dispatcher is usable again.
    assert!(dispatcher.done(&mut WaitPolicy::forever()).unwrap());
    let after = dispatcher.schedule(&echo, args("d"), &[]).unwrap();
    assert_eq!(value(&after), args("d"));
    let metrics = dispatcher.metrics();
    assert_eq!(
        (metrics.failed, metrics.cancelled, metrics.completed),
        (1, 5, 1)
    );
}

#[test]
fn after_a_failure_no_queued_closure_starts_before_the_error_is_raised() {
    let cluster = FakeCluster::new(2);
    let dispatcher = start(&cluster, fast_config());
    let held = function(&dispatcher, "gate:long");
    let failing = function(&dispatcher, "gate-raise:fail");
    let echo = function(&dispatcher, "echo");
    let long = dispatcher.schedule(&held, args("long"), &[]).unwrap();
    let failed = dispatcher.schedule(&failing, args("bad"), &[]).unwrap();
    wait_until("both gated closures run", || {
        cluster.running(0) + cluster.running(1) == 2
    });
    let queued: Vec<_> = (0..10)
        .map(|i| {
            dispatcher
                .schedule(&echo, args(&i.to_string()), &[])
                .unwrap()
        })
        .collect();
    cluster.open_gate("fail");
    // The freed worker's link takes the queued closures and hands each back: all of them
    // end cancelled without running, although nobody has called join() yet.
    for cell in &queued {
        assert!(cancellation(cell).contains("another closure failed"));
        assert!(ran_on(&cluster, cell.id()).is_empty());
    }
    assert_eq!(failure(&failed).message, "raised on purpose");
    let raised = std::thread::scope(|scope| {
        let joining = scope.spawn(|| dispatcher.join(&mut WaitPolicy::until(deadline())));
        cluster.open_gate("long");
        joining.join().unwrap()
    });
    assert!(
        matches!(raised, Err(DispatchError::ClosureFailed(_))),
        "{raised:?}"
    );
    // Raising waited for the running closure, which finished normally.
    assert_eq!(long.status(), CellStatus::Ready);
    assert_eq!(value(&long), args("long"));
    let after = dispatcher.schedule(&echo, args("after"), &[]).unwrap();
    assert_eq!(value(&after), args("after"));
}

#[test]
fn a_schedule_after_a_failure_is_queued_cancelled_and_raises() {
    let cluster = FakeCluster::new(1);
    let dispatcher = start(&cluster, fast_config());
    let raise = function(&dispatcher, "raise");
    let echo = function(&dispatcher, "echo");
    let failed = dispatcher.schedule(&raise, args("x"), &[]).unwrap();
    assert_eq!(failure(&failed).kind, FailureKind::User);
    // The cell is settled just before the queue hears of the failure.
    wait_until("the failure is pending", || {
        dispatcher.metrics().inflight == 0
    });
    let closure = dispatcher.closure(&echo, args("y"), &[]).unwrap();
    let cell = closure.cell();
    let pending = dispatcher
        .try_enqueue(closure)
        .unwrap()
        .expect("an error is pending");
    let raised = dispatcher.enqueue(pending, &mut WaitPolicy::until(deadline()));
    assert!(
        matches!(raised, Err(DispatchError::ClosureFailed(ref f)) if f.message == "raised on purpose")
    );
    assert_eq!(cell.status(), CellStatus::Aborted);
    assert!(dispatcher.done(&mut WaitPolicy::forever()).unwrap());
}

#[test]
fn per_closure_keeps_each_error_on_its_own_closure() {
    let cluster = FakeCluster::new(2);
    let config = DispatcherConfig {
        error_policy: ErrorPolicy::PerClosure,
        ..fast_config()
    };
    let dispatcher = start(&cluster, config);
    let cells = schedule_raising_every(&dispatcher, 20, 4);
    join(&dispatcher);
    assert!(dispatcher.done(&mut WaitPolicy::forever()).unwrap());
    for (i, cell) in cells.iter().enumerate() {
        if i % 4 == 0 {
            let error = failure(cell);
            assert_eq!(
                (error.type_name.as_str(), error.module.as_str()),
                ("ValueError", "builtins")
            );
            assert!(error.traceback.contains("fake worker"));
        } else {
            assert_eq!(value(cell), args(&i.to_string()));
        }
    }
    let metrics = dispatcher.metrics();
    assert_eq!(
        (metrics.failed, metrics.completed, metrics.cancelled),
        (5, 15, 0)
    );
}

#[test]
fn worker_side_infrastructure_errors_are_retried_then_fail() {
    let cluster = FakeCluster::new(1);
    let dispatcher = start(&cluster, fast_config());
    let broken = function(&dispatcher, "infra");
    let cell = dispatcher.schedule(&broken, args("x"), &[]).unwrap();
    let error = failure(&cell);
    assert_eq!(error.kind, FailureKind::Infra(Code::Internal));
    assert_eq!(error.type_name, "OSError");
    assert_eq!(ran_on(&cluster, cell.id()).len(), 4); // the first try and three retries
    assert_eq!(dispatcher.metrics().retried, 3);
}

#[test]
fn an_evicted_function_is_registered_again_and_the_closure_retried_once() {
    let cluster = FakeCluster::new(1);
    let dispatcher = start(&cluster, fast_config());
    let echo = function(&dispatcher, "echo");
    assert_eq!(
        value(&dispatcher.schedule(&echo, args("1"), &[]).unwrap()),
        args("1")
    );
    cluster.forget_functions(0);
    let cell = dispatcher.schedule(&echo, args("2"), &[]).unwrap();
    assert_eq!(value(&cell), args("2"));
    assert_eq!(cluster.registrations(0), 2);
    let metrics = dispatcher.metrics();
    assert_eq!(
        (metrics.functions_registered, metrics.worker_failures),
        (2, 0)
    );
    assert_eq!(ran_on(&cluster, cell.id()), [0]);
}

#[test]
fn bad_arguments_are_refused_with_what_was_expected() {
    let cluster = FakeCluster::new(1);
    let dispatcher = start(&cluster, fast_config());
    let unknown = dispatcher.schedule(&[3; 32], args("x"), &[]).unwrap_err();
    assert!(
        unknown.to_string().contains("register_function"),
        "{unknown}"
    );
    let short = dispatcher.schedule(&[3; 5], args("x"), &[]).unwrap_err();
    assert!(short.to_string().contains("got 5 bytes"), "{short}");
    let none = Dispatcher::new(
        Vec::<crate::dispatch::fake::FakeTransport>::new(),
        fast_config(),
    );
    assert!(matches!(none, Err(DispatchError::InvalidArgument(_))));
}

#[test]
fn shutdown_cancels_queued_and_running_closures_and_refuses_more() {
    let cluster = FakeCluster::new(1);
    let dispatcher = start(&cluster, fast_config());
    let held = function(&dispatcher, "gate:never");
    let running = dispatcher.schedule(&held, args("a"), &[]).unwrap();
    let queued = dispatcher.schedule(&held, args("b"), &[]).unwrap();
    wait_until("the first closure runs", || cluster.running(0) == 1);
    dispatcher.shutdown();
    for cell in [&running, &queued] {
        assert!(cancellation(cell).contains("shut down"));
    }
    assert!(matches!(
        dispatcher.schedule(&held, args("c"), &[]),
        Err(DispatchError::Stopped)
    ));
    dispatcher.shutdown(); // idempotent
    assert!(dispatcher.is_shut_down());
}
