//! What the dispatcher lets one see: a restart told by the worker's incarnation (not its
//! pid, the same in every container), per-worker counters, and `GetStatus` answers
//! refreshed on demand.

use std::time::Duration;

use super::*;
use crate::dispatch::LinkState;

/// A worker restarts between two closures, unnoticed: the resource it held is gone. The
/// dispatcher must see a new process, rebuild the resource and run the closure.
fn rebuilt_after_an_unnoticed_restart(cluster: &FakeCluster) -> Dispatcher {
    let dispatcher = start(cluster, fast_config());
    let echo = function(&dispatcher, "echo");
    let resource = built_resource(&dispatcher, 1);
    assert_eq!(
        value(&dispatcher.schedule(&echo, args("warm"), &[]).unwrap()),
        args("warm")
    );
    cluster.kill(0);
    cluster.restart(0);
    let input = args(&format!("res:{}", resource.id()));
    let cell = dispatcher
        .schedule(&echo, input.clone(), std::slice::from_ref(&resource))
        .unwrap();
    assert_eq!(
        value(&cell),
        input,
        "the closure ran on the rebuilt resource"
    );
    assert_eq!(cluster.resources(0), [resource.id()]);
    assert_eq!(dispatcher.metrics().worker_failures, 1);
    dispatcher
}

#[test]
fn a_restart_with_the_same_pid_is_told_by_the_incarnation() {
    let cluster = FakeCluster::new(1);
    let before = status_of(&cluster);
    let dispatcher = rebuilt_after_an_unnoticed_restart(&cluster);
    let after = dispatcher.worker_statuses()[0].status.clone().unwrap();
    // The premise: both processes are pid 1, as in a container.
    assert_eq!((before.pid, after.pid), (1, 1));
    assert_ne!(before.incarnation, after.incarnation);
    assert_ne!(after.incarnation, 0);
}

#[test]
fn a_worker_that_reports_no_incarnation_is_told_by_its_pid() {
    let cluster = FakeCluster::pid_only(1);
    let before = status_of(&cluster);
    let dispatcher = rebuilt_after_an_unnoticed_restart(&cluster);
    let after = dispatcher.worker_statuses()[0].status.clone().unwrap();
    assert_eq!((before.incarnation, after.incarnation), (0, 0));
    assert_ne!(before.pid, after.pid);
}

fn status_of(cluster: &FakeCluster) -> crate::rpc::pb::GetStatusResponse {
    let transport = cluster.transports().remove(0);
    crate::runtime::runtime()
        .unwrap()
        .block_on(crate::dispatch::WorkerTransport::get_status(
            &transport, None,
        ))
        .unwrap()
}

#[test]
fn per_worker_counters_say_where_closures_ended() {
    let cluster = FakeCluster::new(2);
    cluster.kill(1);
    let dispatcher = start(&cluster, fast_config());
    let echo = function(&dispatcher, "echo");
    let raise = function(&dispatcher, "raise");
    let crash = function(&dispatcher, "crash-on:0");
    let config_cells: Vec<_> = (0..3)
        .map(|i| {
            dispatcher
                .schedule(&echo, args(&i.to_string()), &[])
                .unwrap()
        })
        .collect();
    for cell in &config_cells {
        value(cell);
    }
    let _ = failure(&dispatcher.schedule(&raise, args("boom"), &[]).unwrap());
    // Under cancel_all the error is pending: raise it before scheduling more.
    assert!(dispatcher
        .join(&mut crate::queue::WaitPolicy::until(deadline()))
        .is_err());
    let crashed = dispatcher.schedule(&crash, args("c"), &[]).unwrap();
    wait_until("worker 0 crashed", || !cluster.is_up(0));
    cluster.restart(1);
    value(&crashed);
    let workers = dispatcher.worker_statuses();
    let zero = &workers[0];
    assert_eq!((zero.completed, zero.failed), (3, 1));
    assert_eq!((zero.retried, zero.failures), (1, 1));
    assert_eq!(zero.state, LinkState::Recovering);
    assert!(zero.last_error.is_some());
    let one = &workers[1];
    assert_eq!(
        (one.completed, one.failed, one.retried, one.failures),
        (1, 0, 0, 0)
    );
}

#[test]
fn statuses_are_refreshed_on_demand_for_workers_that_are_up() {
    let cluster = FakeCluster::new(2);
    cluster.kill(1);
    let dispatcher = start(&cluster, fast_config());
    wait_until("worker 0 is up", || {
        dispatcher.worker_statuses()[0].state == LinkState::Up
    });
    let probes = |worker| {
        cluster
            .calls(worker)
            .iter()
            .filter(|call| call.method == "GetStatus")
            .count()
    };
    let before = probes(0);
    // Fresh enough: nothing is asked.
    assert_eq!(
        dispatcher.refresh_statuses(Duration::from_secs(3600), Duration::from_secs(5)),
        0
    );
    assert_eq!(probes(0), before);
    std::thread::sleep(Duration::from_millis(20));
    let age = dispatcher.worker_statuses()[0].status_age.unwrap();
    assert!(age >= Duration::from_millis(20), "{age:?}");
    // Stale: worker 0 (up) is asked, worker 1 (recovering: its link probes it) is not.
    assert_eq!(
        dispatcher.refresh_statuses(Duration::from_millis(10), Duration::from_secs(5)),
        1
    );
    assert_eq!(probes(0), before + 1);
    let fresh = dispatcher.worker_statuses()[0].status_age.unwrap();
    assert!(fresh < age, "{fresh:?} is not newer than {age:?}");
    assert_eq!(dispatcher.worker_statuses()[1].status, None);
}

/// A link opens its stream as soon as its worker comes up, before any work, so an idle
/// worker's death shows at once (the stream ends), and again after it came back.
#[test]
fn an_idle_worker_is_watched_from_the_moment_it_comes_up() {
    let cluster = FakeCluster::new(2);
    let dispatcher = start(&cluster, fast_config());
    for index in 0..2 {
        wait_until("each worker has a stream open", || {
            cluster.open_streams(index) == 1
        });
    }
    for _ in 0..2 {
        cluster.kill(1);
        wait_until("the idle worker is seen down", || {
            state(&dispatcher, 1) != LinkState::Up
        });
        cluster.restart(1);
        wait_until("it is watched again once back", || {
            state(&dispatcher, 1) == LinkState::Up && cluster.open_streams(1) == 1
        });
    }
    assert_eq!(
        dispatcher.metrics().completed,
        0,
        "no closure was needed to see it"
    );
}

/// Watching is bounded like a probe: a worker that never accepts that first stream does
/// not keep its link from taking work once the probe timeout has passed.
#[test]
fn a_worker_that_never_accepts_the_watching_stream_still_gets_work() {
    let cluster = FakeCluster::new(1);
    cluster.stall_next_stream(0);
    let config = DispatcherConfig {
        probe_timeout: Duration::from_millis(200),
        ..fast_config()
    };
    let dispatcher = start(&cluster, config);
    let echo = function(&dispatcher, "echo");
    let cell = dispatcher.schedule(&echo, args("after"), &[]).unwrap();
    assert_eq!(value(&cell), args("after"));
}
