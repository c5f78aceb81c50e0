//! Worker failures: put back and run elsewhere, reconnect with backoff, rebuild resources
//! before serving, register functions again, give up, and fail the rest when all gave up.

use std::time::Duration;

use super::*;
use crate::dispatch::fake::FakeCall;
use crate::dispatch::{ErrorPolicy, LinkState, ResourceState};

#[test]
fn a_closure_whose_worker_dies_runs_elsewhere_and_the_worker_is_used_again() {
    let cluster = FakeCluster::new(2);
    cluster.kill(1); // so the first closure can only go to worker 0
    let dispatcher = start(&cluster, fast_config());
    let crash = function(&dispatcher, "crash-on:0");
    let cell = dispatcher.schedule(&crash, args("x"), &[]).unwrap();
    wait_until("worker 0 crashed", || !cluster.is_up(0));
    cluster.restart(1);
    assert_eq!(value(&cell), args("x"));
    assert_eq!(ran_on(&cluster, cell.id()), [0, 1]);
    let metrics = dispatcher.metrics();
    assert_eq!((metrics.retried, metrics.worker_failures), (1, 1));
    assert_eq!(state(&dispatcher, 0), LinkState::Recovering);

    // Worker 0 comes back; with worker 1 gone the next closure must run there, and the
    // function is sent again because the restarted worker lost what it held.
    cluster.restart(0);
    wait_until("worker 0 is up again", || {
        state(&dispatcher, 0) == LinkState::Up
    });
    cluster.kill(1);
    let echo = function(&dispatcher, "echo");
    let later = dispatcher.schedule(&echo, args("z"), &[]).unwrap();
    assert_eq!(value(&later), args("z"));
    assert_eq!(ran_on(&cluster, later.id()), [0]);
    let registered: Vec<u64> = cluster
        .calls(0)
        .iter()
        .filter(|c| c.method == "RegisterFunction")
        .map(|c| c.incarnation)
        .collect();
    assert_eq!(registered, [1, 2], "once per worker process");
}

/// Gaps between consecutive probes of a down worker.
fn probe_gaps(calls: &[FakeCall]) -> Vec<Duration> {
    let probes: Vec<_> = calls
        .iter()
        .filter(|c| c.method == "GetStatus" && c.incarnation == 0)
        .collect();
    probes.windows(2).map(|w| w[1].at - w[0].at).collect()
}

#[test]
fn reconnection_backs_off_exponentially_up_to_the_cap() {
    let cluster = FakeCluster::new(1);
    cluster.kill(0);
    let config = DispatcherConfig {
        backoff: BackoffConfig {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(40),
        },
        ..fast_config()
    };
    let dispatcher = start(&cluster, config);
    let echo = function(&dispatcher, "echo");
    let cell = dispatcher.schedule(&echo, args("x"), &[]).unwrap();
    wait_until("six probes were made", || {
        probe_gaps(&cluster.calls(0)).len() >= 5
    });
    let gaps = probe_gaps(&cluster.calls(0));
    // Sleeps never end early, so each gap is at least the planned delay.
    for (gap, planned) in gaps.iter().zip([10, 20, 40, 40, 40]) {
        assert!(*gap >= Duration::from_millis(planned), "gaps {gaps:?}");
    }
    assert_eq!(state(&dispatcher, 0), LinkState::Recovering);
    assert!(dispatcher.worker_statuses()[0]
        .last_error
        .as_deref()
        .is_some_and(|e| e.contains("down")));
    cluster.restart(0);
    assert_eq!(value(&cell), args("x"));
    assert_eq!(state(&dispatcher, 0), LinkState::Up);
}

#[test]
fn resources_are_aborted_with_their_worker_and_rebuilt_before_it_serves() {
    let cluster = FakeCluster::new(1);
    let dispatcher = start(&cluster, fast_config());
    let echo = function(&dispatcher, "echo");
    let resource = built_resource(&dispatcher, 1);
    cluster.kill(0);
    let input = args(&format!("res:{}", resource.id()));
    let cell = dispatcher
        .schedule(&echo, input.clone(), std::slice::from_ref(&resource))
        .unwrap();
    wait_until("the resource is aborted", || {
        resource.state(0) == ResourceState::Aborted
    });
    cluster.restart(0);
    assert_eq!(value(&cell), input);
    assert_eq!(resource.state(0), ResourceState::Ready);
    assert_eq!(cluster.resources(0), [resource.id()]);
    let calls = cluster.calls(0);
    let position = |method: &str, subject: u64| {
        calls
            .iter()
            .position(|c| c.method == method && c.incarnation == 2 && c.subject == Some(subject))
            .unwrap_or_else(|| panic!("no {method} for {subject} after the restart: {calls:?}"))
    };
    assert!(position("CreateResource", resource.id()) < position("RunClosure", cell.id()));
}

#[test]
fn a_resource_not_to_be_rebuilt_is_lost_with_its_worker_and_fails_its_users() {
    let cluster = FakeCluster::new(1);
    // Per closure: under cancel_all the lost input would (rightly) be raised by the next
    // schedule, and this test checks the worker is used again afterwards.
    let config = DispatcherConfig {
        error_policy: ErrorPolicy::PerClosure,
        ..fast_config()
    };
    let dispatcher = start(&cluster, config);
    let make = function(&dispatcher, "resource");
    let echo = function(&dispatcher, "echo");
    let resource = dispatcher.create_resource(&make, false).unwrap();
    wait_until("the resource is built", || {
        resource.state(0) == ResourceState::Ready
    });
    cluster.kill(0);
    let input = args(&format!("res:{}", resource.id()));
    let cell = dispatcher
        .schedule(&echo, input, std::slice::from_ref(&resource))
        .unwrap();
    wait_until("the resource is lost", || {
        matches!(resource.state(0), ResourceState::Lost(_))
    });
    cluster.restart(0);
    let error = failure(&cell);
    assert_eq!(error.kind, FailureKind::Input);
    assert!(error.message.contains("was lost on worker"), "{error}");
    assert_eq!(error.type_name, "AbortedError");
    assert_eq!(resource.state(0).label(), "lost");
    // Nothing rebuilt it on the restarted worker.
    assert!(cluster.resources(0).is_empty());
    let plain = dispatcher.schedule(&echo, args("after"), &[]).unwrap();
    assert_eq!(value(&plain), args("after"));
}

#[test]
fn a_dispatcher_made_while_workers_are_down_gives_up_and_fails_the_rest() {
    let cluster = FakeCluster::new(2);
    cluster.kill(0);
    cluster.kill(1);
    let config = DispatcherConfig {
        recovery_timeout: Duration::from_millis(200),
        error_policy: ErrorPolicy::PerClosure,
        ..fast_config()
    };
    let dispatcher = start(&cluster, config);
    assert!(dispatcher
        .worker_statuses()
        .iter()
        .all(|w| w.state == LinkState::Recovering));
    let echo = function(&dispatcher, "echo");
    let cell = dispatcher.schedule(&echo, args("x"), &[]).unwrap();
    let error = failure(&cell);
    assert_eq!(error.kind, FailureKind::Infra(Code::Unavailable));
    assert!(
        error.message.contains("all 2 workers were given up"),
        "{error}"
    );
    // The failure names the bound and what the worker last did wrong, so the user knows
    // what to fix.
    assert!(
        error.message.contains("JAXCLUSTER_WORKER_RECOVERY_SEC")
            && error.message.contains("; last error: "),
        "{error}"
    );
    assert!(dispatcher
        .worker_statuses()
        .iter()
        .all(|w| w.state == LinkState::GivenUp));
    // Later closures fail too instead of waiting forever.
    let later = dispatcher.schedule(&echo, args("y"), &[]).unwrap();
    assert_eq!(failure(&later).type_name, "UnavailableError");
    join(&dispatcher);
    // A worker that answers after being given up is not used again.
    cluster.restart(0);
    let last = dispatcher.schedule(&echo, args("z"), &[]).unwrap();
    assert_eq!(failure(&last).kind, FailureKind::Infra(Code::Unavailable));
    assert!(cluster.executions().is_empty());
}

#[test]
fn the_other_workers_carry_on_when_one_is_given_up() {
    let cluster = FakeCluster::new(2);
    cluster.kill(1);
    let config = DispatcherConfig {
        recovery_timeout: Duration::from_millis(100),
        ..fast_config()
    };
    let dispatcher = start(&cluster, config);
    let make = function(&dispatcher, "resource");
    wait_until("worker 1 is given up", || {
        state(&dispatcher, 1) == LinkState::GivenUp
    });
    let resource = dispatcher.create_resource(&make, true).unwrap();
    assert_eq!(resource.state(1), ResourceState::Aborted);
    let echo = function(&dispatcher, "echo");
    let cells: Vec<_> = (0..10)
        .map(|i| {
            dispatcher
                .schedule(&echo, args(&i.to_string()), &[])
                .unwrap()
        })
        .collect();
    join(&dispatcher);
    for (i, cell) in cells.iter().enumerate() {
        assert_eq!(value(cell), args(&i.to_string()));
        assert_eq!(ran_on(&cluster, cell.id()), [0]);
    }
    wait_until("the resource is built on worker 0", || {
        resource.state(0) == ResourceState::Ready
    });
}

#[test]
fn an_idle_link_notices_its_worker_die_without_work_to_send() {
    let cluster = FakeCluster::new(2);
    let dispatcher = start(&cluster, fast_config());
    let gated = function(&dispatcher, "gate:idle");
    // Both links open a stream (each worker runs one gated closure), answer, and go idle
    // with it open.
    let cells: Vec<_> = (0..2)
        .map(|n| {
            dispatcher
                .schedule(&gated, args(&n.to_string()), &[])
                .unwrap()
        })
        .collect();
    wait_until("both workers run a closure", || {
        cluster.running(0) == 1 && cluster.running(1) == 1
    });
    cluster.open_gate("idle");
    for cell in &cells {
        assert!(cell.wait(None));
    }
    assert_eq!(state(&dispatcher, 1), LinkState::Up);
    let failures = dispatcher.metrics().worker_failures;
    cluster.kill(1);
    // Nothing is scheduled: the broken stream alone tells the idle link.
    wait_until("the idle link noticed", || {
        state(&dispatcher, 1) != LinkState::Up
    });
    assert_eq!(dispatcher.metrics().worker_failures, failures + 1);
    // It comes back once the worker does, and serves again.
    cluster.restart(1);
    wait_until("worker 1 is up again", || {
        state(&dispatcher, 1) == LinkState::Up
    });
    assert_eq!(state(&dispatcher, 0), LinkState::Up);
}

/// How many `method` calls worker `index` has received.
fn calls_of(cluster: &FakeCluster, index: usize, method: &str) -> usize {
    cluster
        .calls(index)
        .iter()
        .filter(|call| call.method == method)
        .count()
}

/// One worker whose link came up without its watching stream (the worker never accepted
/// it), then a closure whose stream's opening the worker stalls too; heartbeat timeout
/// 300 ms. Returns the cluster, its dispatcher and the closure.
fn a_closure_stalled_in_its_stream_opening() -> (FakeCluster, Dispatcher, Arc<ResultCell>) {
    let cluster = FakeCluster::new(1);
    cluster.stall_next_stream(0);
    let config = DispatcherConfig {
        probe_timeout: Duration::from_millis(200),
        heartbeat_timeout: Some(Duration::from_millis(300)),
        ..fast_config()
    };
    let dispatcher = start(&cluster, config);
    wait_until("the watching stream was asked for", || {
        calls_of(&cluster, 0, "RunClosures") == 1
    });
    cluster.stall_next_stream(0);
    let echo = function(&dispatcher, "echo");
    let cell = dispatcher.schedule(&echo, args("stalled"), &[]).unwrap();
    wait_until("the closure's stream was asked for", || {
        calls_of(&cluster, 0, "RunClosures") == 2
    });
    (cluster, dispatcher, cell)
}

#[test]
fn a_worker_frozen_before_accepting_a_stream_is_failed_and_its_closure_runs_again() {
    let (cluster, dispatcher, cell) = a_closure_stalled_in_its_stream_opening();
    // It stops answering anything: the probe after the heartbeat timeout gets no answer.
    cluster.kill(0);
    wait_until("the worker is seen failed", || {
        dispatcher.metrics().worker_failures == 1
    });
    assert_ne!(state(&dispatcher, 0), LinkState::Up);
    cluster.restart(0);
    assert_eq!(value(&cell), args("stalled"));
    assert_eq!(
        dispatcher.metrics().retried,
        1,
        "its closure was put back once"
    );
    join(&dispatcher);
}

#[test]
fn a_worker_slow_to_accept_a_stream_but_answering_probes_keeps_its_closure() {
    let (cluster, dispatcher, cell) = a_closure_stalled_in_its_stream_opening();
    let probes = calls_of(&cluster, 0, "GetStatus");
    wait_until("the link probes the worker that has not accepted", || {
        calls_of(&cluster, 0, "GetStatus") > probes + 1
    });
    assert_eq!(
        state(&dispatcher, 0),
        LinkState::Up,
        "it answers: not failed"
    );
    cluster.open_gate("streams");
    assert_eq!(value(&cell), args("stalled"));
    let metrics = dispatcher.metrics();
    assert_eq!((metrics.worker_failures, metrics.retried), (0, 0));
    assert_eq!(ran_on(&cluster, cell.id()), [0]);
    join(&dispatcher);
}
