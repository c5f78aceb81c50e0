//! `closure_timeout` (retry once elsewhere, then `DEADLINE_EXCEEDED` naming the worker) and
//! the staggered start.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use super::*;
use crate::dispatch::{FailureKind, StartDelay};

#[test]
fn a_closure_that_times_out_twice_fails_naming_both_workers() {
    let cluster = FakeCluster::new(2);
    let config = DispatcherConfig {
        closure_timeout: Some(Duration::from_millis(100)),
        ..fast_config()
    };
    let dispatcher = start(&cluster, config);
    let slow = function(&dispatcher, "sleep:600");
    let cell = dispatcher.schedule(&slow, args("x"), &[]).unwrap();
    let error = failure(&cell);
    assert_eq!(
        error.kind,
        FailureKind::Infra(tonic::Code::DeadlineExceeded)
    );
    assert_eq!(error.kind, FailureKind::Infra(Code::DeadlineExceeded));
    let workers = ran_on(&cluster, cell.id());
    assert_eq!(workers.len(), 2, "one retry");
    assert_ne!(workers[0], workers[1], "the retry ran on the other worker");
    assert!(error.message.contains("closure_timeout=0.100 s"), "{error}");
    for worker in &workers {
        assert!(
            error
                .message
                .contains(&format!("fake-worker-{worker}:8470")),
            "{error}"
        );
    }
    assert_eq!(error.worker, format!("fake-worker-{}:8470", workers[1]));
    assert_eq!(dispatcher.metrics().retried, 1);
}

#[test]
fn a_timed_out_worker_takes_no_new_closure_until_it_is_idle() {
    let cluster = FakeCluster::new(1);
    let config = DispatcherConfig {
        closure_timeout: Some(Duration::from_millis(50)),
        ..fast_config()
    };
    let dispatcher = start(&cluster, config);
    let slow = function(&dispatcher, "sleep:300");
    let echo = function(&dispatcher, "echo");
    let timed_out = dispatcher.schedule(&slow, args("x"), &[]).unwrap();
    let next = dispatcher.schedule(&echo, args("y"), &[]).unwrap();
    assert_eq!(value(&next), args("y"));
    assert_eq!(
        failure(&timed_out).kind,
        FailureKind::Infra(Code::DeadlineExceeded)
    );
    // The timed-out execution kept the worker busy for 300 ms; the link polled its status
    // and sent nothing else (the echo, the retry) until it was idle again.
    let executions = cluster.executions();
    assert_eq!(
        executions.len(),
        3,
        "slow, echo, slow again: {executions:?}"
    );
    let calls = cluster.calls(0);
    let runs: Vec<Instant> = calls
        .iter()
        .filter(|c| c.method == "RunClosure")
        .map(|c| c.at)
        .collect();
    assert_eq!(runs.len(), 3);
    for later in &runs[1..] {
        assert!(*later - runs[0] >= Duration::from_millis(300), "{runs:?}");
    }
    let polls = calls
        .iter()
        .filter(|c| c.method == "GetStatus" && c.at > runs[0] && c.at < runs[1])
        .count();
    assert!(polls >= 1, "the link asked whether the worker was idle");
}

#[test]
fn workers_start_staggered_as_tf_coordinator_schedule_start_delay_says() {
    let cluster = FakeCluster::new(3);
    let config = DispatcherConfig {
        start_delay: StartDelay {
            per_worker: Duration::from_millis(150),
            max: Some(Duration::from_millis(200)),
        },
        ..fast_config()
    };
    let created = Instant::now();
    let dispatcher = start(&cluster, config);
    let slow = function(&dispatcher, "sleep:40");
    let cells: Vec<_> = (0..30)
        .map(|i| {
            dispatcher
                .schedule(&slow, args(&i.to_string()), &[])
                .unwrap()
        })
        .collect();
    join(&dispatcher);
    let workers: HashSet<usize> = cluster.executions().iter().map(|e| e.worker).collect();
    assert_eq!(workers.len(), 3, "every worker took part");
    for (worker, delay) in [(1, 150), (2, 200)] {
        let first = cluster
            .calls(worker)
            .iter()
            .find(|c| c.method == "RunClosure")
            .map(|c| c.at)
            .expect("the worker ran something");
        assert!(
            first - created >= Duration::from_millis(delay),
            "worker {worker} started after {:?}",
            first - created
        );
    }
    for cell in &cells {
        assert!(matches!(outcome(cell), crate::dispatch::Outcome::Value(_)));
    }
}
