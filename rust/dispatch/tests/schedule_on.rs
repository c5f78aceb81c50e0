//! `schedule_on`: closures for one worker. Served after what was queued for that worker
//! (its resource builds), run again there after it restarts, failed when it is removed or
//! given up, and never counted by `join`.

use super::*;
use crate::dispatch::{DispatchError, LinkState};
use crate::queue::WaitPolicy;

/// The position of the first call `method` about `subject` on worker `worker`.
fn position(cluster: &FakeCluster, worker: usize, method: &str, subject: u64) -> usize {
    cluster
        .calls(worker)
        .iter()
        .position(|call| call.method == method && call.subject == Some(subject))
        .unwrap_or_else(|| panic!("worker {worker} never got {method} for {subject}"))
}

#[test]
fn a_closure_for_one_worker_runs_there_after_its_resource_is_built() {
    let cluster = FakeCluster::new(2);
    let dispatcher = start(&cluster, fast_config());
    let make = function(&dispatcher, "resource");
    let echo = function(&dispatcher, "echo");
    // Not waited for: the closure queued behind the build must find it built.
    let resource = dispatcher.create_resource(&make, true).unwrap();
    let input = args(&format!("res:{}", resource.id()));
    let cell = dispatcher
        .schedule_on(1, &echo, input.clone(), std::slice::from_ref(&resource))
        .unwrap();
    assert_eq!(value(&cell), input);
    assert_eq!(ran_on(&cluster, cell.id()), [1]);
    assert!(
        position(&cluster, 1, "CreateResource", resource.id())
            < position(&cluster, 1, "RunClosure", cell.id())
    );
    let out_of_range = dispatcher.schedule_on(2, &echo, args("x"), &[]);
    assert!(
        matches!(&out_of_range, Err(DispatchError::InvalidArgument(m)) if m.contains("no worker 2")),
        "{out_of_range:?}"
    );
}

#[test]
fn a_closure_for_a_worker_that_restarts_under_it_runs_there_again_after_the_rebuild() {
    let cluster = FakeCluster::new(2);
    let dispatcher = start(&cluster, fast_config());
    let resource = built_resource(&dispatcher, 2);
    let held = function(&dispatcher, "gate:restart");
    let input = args(&format!("res:{}", resource.id()));
    let cell = dispatcher
        .schedule_on(0, &held, input.clone(), std::slice::from_ref(&resource))
        .unwrap();
    wait_until("worker 0 runs it", || cluster.running(0) == 1);
    let builds_before = cluster
        .calls(0)
        .iter()
        .filter(|call| call.method == "CreateResource")
        .count();
    cluster.kill(0);
    cluster.restart(0);
    wait_until("worker 0 runs it again", || {
        ran_on(&cluster, cell.id()).len() == 2
    });
    cluster.open_gate("restart");
    assert_eq!(value(&cell), input);
    // Only ever on worker 0, and the restarted worker built the resource again first.
    assert_eq!(ran_on(&cluster, cell.id()), [0, 0]);
    let calls = cluster.calls(0);
    let rebuilt = calls
        .iter()
        .enumerate()
        .filter(|(_, call)| call.method == "CreateResource")
        .nth(builds_before)
        .map(|(i, _)| i)
        .expect("the resource was rebuilt");
    let rerun = calls
        .iter()
        .enumerate()
        .filter(|(_, call)| call.method == "RunClosure" && call.subject == Some(cell.id()))
        .nth(1)
        .map(|(i, _)| i)
        .expect("the closure ran again");
    assert!(rebuilt < rerun, "{calls:?}");
}

#[test]
fn a_closure_for_a_removed_worker_fails_naming_it() {
    let cluster = FakeCluster::new(2);
    let dispatcher = start(&cluster, fast_config());
    let echo = function(&dispatcher, "echo");
    wait_until("both workers are up", || all_up(&dispatcher));
    // Worker 0 is down, so the closure waits in its queue until the removal fails it.
    cluster.kill(0);
    dispatcher
        .schedule(&function(&dispatcher, "crash-on:0"), args("x"), &[])
        .ok();
    wait_until("worker 0 is found down", || {
        state(&dispatcher, 0) == LinkState::Recovering
    });
    let queued = dispatcher.schedule_on(0, &echo, args("x"), &[]).unwrap();
    assert!(!queued.wait(Some(Instant::now() + Duration::from_millis(50))));
    dispatcher.remove_workers(&[0]).unwrap();
    let error = failure(&queued);
    assert_eq!(error.kind, FailureKind::Infra(Code::Aborted));
    assert!(
        error.message.contains("worker 0") && error.message.contains("was removed"),
        "{error}"
    );
    // Once removed, refused at once with the same reason.
    let late = dispatcher.schedule_on(0, &echo, args("x"), &[]).unwrap();
    assert!(failure(&late).message.contains("was removed"));
    assert!(ran_on(&cluster, queued.id()).is_empty());
}

#[test]
fn a_closure_for_a_given_up_worker_fails_naming_it() {
    let cluster = FakeCluster::new(2);
    cluster.kill(0);
    let config = DispatcherConfig {
        recovery_timeout: Duration::from_millis(200),
        ..fast_config()
    };
    let dispatcher = start(&cluster, config);
    let echo = function(&dispatcher, "echo");
    let cell = dispatcher.schedule_on(0, &echo, args("x"), &[]).unwrap();
    let error = failure(&cell);
    assert_eq!(error.kind, FailureKind::Infra(Code::Aborted));
    assert!(error.message.contains("was given up"), "{error}");
    assert_eq!(
        value(&dispatcher.schedule_on(1, &echo, args("y"), &[]).unwrap()),
        args("y")
    );
}

#[test]
fn join_and_done_do_not_count_closures_for_one_worker() {
    let cluster = FakeCluster::new(1);
    let dispatcher = start(&cluster, fast_config());
    let held = function(&dispatcher, "gate:pinned");
    let cell = dispatcher.schedule_on(0, &held, args("x"), &[]).unwrap();
    wait_until("worker 0 runs it", || cluster.running(0) == 1);
    let mut policy = WaitPolicy::until(Some(Instant::now() + Duration::from_millis(200)));
    assert!(dispatcher.join(&mut policy).unwrap(), "join waited for it");
    assert!(dispatcher.done(&mut WaitPolicy::forever()).unwrap());
    assert_eq!(dispatcher.metrics().inflight, 0);
    // Nor is its error anyone else's: under cancel_all it raises nothing.
    let raise = function(&dispatcher, "raise");
    let failed = dispatcher.schedule_on(0, &raise, args("x"), &[]).unwrap();
    cluster.open_gate("pinned");
    assert_eq!(value(&cell), args("x"));
    assert_eq!(failure(&failed).kind, FailureKind::User);
    join(&dispatcher);
    let echo = function(&dispatcher, "echo");
    assert_eq!(
        value(&dispatcher.schedule(&echo, args("z"), &[]).unwrap()),
        args("z")
    );
}
