//! Bounded retries of closures that kill their workers (`max_closure_retries`), what does
//! not count as such a death, and failing fast when no worker was ever reachable
//! (`connect_timeout`).

use super::*;
use crate::dispatch::{DispatchError, LinkState};

fn retries(limit: Option<u32>) -> DispatcherConfig {
    DispatcherConfig {
        max_closure_retries: limit,
        error_policy: crate::dispatch::ErrorPolicy::PerClosure,
        ..fast_config()
    }
}

#[test]
fn a_closure_that_kills_its_workers_runs_limit_plus_one_times_then_fails_naming_them() {
    let cluster = FakeCluster::new(2);
    let dispatcher = start(&cluster, retries(Some(2)));
    let echo = function(&dispatcher, "echo");
    wait_until("both workers are up", || all_up(&dispatcher));
    let crash = function(&dispatcher, "crash");
    let poison = dispatcher.schedule(&crash, args("p"), &[]).unwrap();
    let failed = failure(&poison);
    assert_eq!(ran_on(&cluster, poison.id()).len(), 3, "1 run + 2 retries");
    assert_eq!(failed.type_name, "WorkerCrashedError");
    assert_eq!(failed.kind, FailureKind::Infra(Code::Aborted));
    let message = &failed.message;
    assert!(
        message.contains(&format!("closure {}", poison.id())),
        "{message}"
    );
    assert!(message.contains("max_closure_retries=2"), "{message}");
    assert!(message.contains("3. worker"), "{message}");
    assert!(message.contains("fake-worker-"), "{message}");
    // The fake restarts a crashed worker at once: each death was explained by a new
    // process answering (the fake does not report how the previous one ended).
    assert!(
        message.contains("a new process took its place"),
        "{message}"
    );
    // The workers are fine for everything else.
    let cells: Vec<_> = (0..20)
        .map(|i| {
            dispatcher
                .schedule(&echo, args(&i.to_string()), &[])
                .unwrap()
        })
        .collect();
    for (i, cell) in cells.iter().enumerate() {
        assert_eq!(value(cell), args(&i.to_string()));
    }
}

#[test]
fn with_no_bound_the_closure_is_retried_as_tf_does() {
    let cluster = FakeCluster::new(1);
    let dispatcher = start(&cluster, retries(None));
    let crash = function(&dispatcher, "crash");
    let poison = dispatcher.schedule(&crash, args("p"), &[]).unwrap();
    wait_until("the closure ran 6 times", || {
        ran_on(&cluster, poison.id()).len() >= 6
    });
    assert!(poison.outcome().is_none(), "still being retried");
    dispatcher.shutdown();
    assert!(matches!(outcome(&poison), Outcome::Cancelled(_)));
}

#[test]
fn a_worker_lost_between_closures_costs_no_closure_a_retry() {
    let cluster = FakeCluster::new(1);
    let dispatcher = start(&cluster, retries(Some(0)));
    let echo = function(&dispatcher, "echo");
    for round in 0..3 {
        let cell = dispatcher
            .schedule(&echo, args(&round.to_string()), &[])
            .unwrap();
        assert_eq!(value(&cell), args(&round.to_string()));
        // Killed while idle, and back: the next closure must not be charged for it.
        cluster.kill(0);
        wait_until("the worker's stream ended", || cluster.open_streams(0) == 0);
        cluster.restart(0);
    }
    let last = dispatcher.schedule(&echo, args("last"), &[]).unwrap();
    assert_eq!(value(&last), args("last"));
    assert_eq!(dispatcher.metrics().failed, 0);
}

#[test]
fn closures_queued_behind_a_dying_one_are_not_charged() {
    let cluster = FakeCluster::new(1);
    let dispatcher = start(&cluster, retries(Some(0)));
    wait_until("the worker is up", || all_up(&dispatcher));
    let gate = function(&dispatcher, "gate:g");
    let echo = function(&dispatcher, "echo");
    let crash = function(&dispatcher, "crash");
    // A gated closure holds the worker so the rest are pipelined behind it.
    let first = dispatcher.schedule(&gate, args("first"), &[]).unwrap();
    wait_until("the gated closure runs", || {
        !ran_on(&cluster, first.id()).is_empty()
    });
    let poison = dispatcher.schedule(&crash, args("p"), &[]).unwrap();
    let behind: Vec<_> = (0..5)
        .map(|i| {
            dispatcher
                .schedule(&echo, args(&i.to_string()), &[])
                .unwrap()
        })
        .collect();
    cluster.open_gate("g");
    assert_eq!(value(&first), args("first"));
    assert_eq!(failure(&poison).type_name, "WorkerCrashedError");
    for (i, cell) in behind.iter().enumerate() {
        assert_eq!(value(cell), args(&i.to_string()));
    }
}

#[test]
fn nothing_reachable_fails_fast_naming_every_worker_and_recovers_when_one_answers() {
    let cluster = FakeCluster::new(2);
    cluster.kill(0);
    cluster.kill(1);
    let config = DispatcherConfig {
        connect_timeout: Some(Duration::from_millis(300)),
        ..fast_config()
    };
    let dispatcher = start(&cluster, config);
    let echo = function(&dispatcher, "echo");
    let early = dispatcher.schedule(&echo, args("early"), &[]).unwrap();
    let failed = failure(&early);
    assert_eq!(failed.kind, FailureKind::Infra(Code::Unavailable));
    for address in ["fake-worker-0:8470", "fake-worker-1:8470"] {
        assert!(failed.message.contains(address), "{}", failed.message);
    }
    assert!(
        failed.message.contains("connect_timeout"),
        "{}",
        failed.message
    );
    // From then on scheduling fails at once, and so does join.
    let refused = dispatcher.schedule(&echo, args("late"), &[]).unwrap_err();
    assert!(
        matches!(refused, DispatchError::Unavailable(_)),
        "{refused:?}"
    );
    let joined = dispatcher.join(&mut crate::queue::WaitPolicy::forever());
    assert!(joined.is_err(), "{joined:?}");
    // A worker answers: the cluster is usable again.
    cluster.restart(1);
    wait_until("worker 1 is up", || {
        dispatcher.metrics().workers[1].state == LinkState::Up
    });
    let later = dispatcher.schedule(&echo, args("later"), &[]).unwrap();
    assert_eq!(value(&later), args("later"));
}

#[test]
fn a_cluster_reached_once_keeps_the_recovery_bound() {
    let cluster = FakeCluster::new(1);
    let config = DispatcherConfig {
        connect_timeout: Some(Duration::from_millis(200)),
        ..fast_config()
    };
    let dispatcher = start(&cluster, config);
    let echo = function(&dispatcher, "echo");
    let first = dispatcher.schedule(&echo, args("1"), &[]).unwrap();
    assert_eq!(value(&first), args("1"));
    cluster.kill(0);
    let waiting = dispatcher.schedule(&echo, args("2"), &[]).unwrap();
    // Well past connect_timeout: not failed, still waiting for the worker.
    assert!(!waiting.wait(Some(Instant::now() + Duration::from_millis(800))));
    cluster.restart(0);
    assert_eq!(value(&waiting), args("2"));
}
