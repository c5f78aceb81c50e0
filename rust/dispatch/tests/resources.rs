//! Per-worker resources: built on every worker, failed builds as input errors, release.

use super::*;
use crate::dispatch::{DispatchError, FailureKind, ResourceState};

#[test]
fn a_resource_is_built_on_every_worker_and_released_on_each() {
    let cluster = FakeCluster::new(3);
    let dispatcher = start(&cluster, fast_config());
    let resource = built_resource(&dispatcher, 3);
    assert_eq!(resource.num_workers(), 3);
    for worker in 0..3 {
        assert_eq!(cluster.resources(worker), [resource.id()]);
    }
    resource.release();
    assert!((0..3).all(|w| resource.state(w) == ResourceState::Aborted));
    wait_until("released everywhere", || {
        (0..3).all(|w| cluster.resources(w).is_empty())
    });
    let echo = function(&dispatcher, "echo");
    let refused = dispatcher.schedule(&echo, args("x"), std::slice::from_ref(&resource));
    assert!(
        matches!(&refused, Err(DispatchError::InvalidArgument(m)) if m.contains("was released")),
        "{refused:?}"
    );
}

#[test]
fn dropping_the_last_reference_releases_the_resource() {
    let cluster = FakeCluster::new(2);
    let dispatcher = start(&cluster, fast_config());
    let resource = built_resource(&dispatcher, 2);
    let echo = function(&dispatcher, "echo");
    let input = args(&format!("res:{}", resource.id()));
    let cell = dispatcher
        .schedule(&echo, input.clone(), std::slice::from_ref(&resource))
        .unwrap();
    drop(resource);
    // The closure still holds the resource, so it runs with it, then it is released.
    assert_eq!(value(&cell), input);
    wait_until("released everywhere", || {
        (0..2).all(|w| cluster.resources(w).is_empty())
    });
}

#[test]
fn a_closure_using_a_resource_that_failed_to_build_fails_with_an_input_error() {
    let cluster = FakeCluster::new(2);
    let dispatcher = start(&cluster, fast_config());
    let make = function(&dispatcher, "resource-raise");
    let resource = dispatcher.create_resource(&make, true).unwrap();
    wait_until("both builds failed", || {
        (0..2).all(|w| matches!(resource.state(w), ResourceState::Failed(_)))
    });
    assert_eq!(resource.state(0).label(), "failed");
    let echo = function(&dispatcher, "echo");
    let input = args(&format!("res:{}", resource.id()));
    let cell = dispatcher
        .schedule(&echo, input, std::slice::from_ref(&resource))
        .unwrap();
    let error = failure(&cell);
    assert_eq!(error.kind, FailureKind::Input);
    assert_eq!(error.type_name, "RuntimeError");
    assert!(
        error.message.contains("failed to build on purpose"),
        "{error}"
    );
    // Refused before running: the fake never executed it.
    assert!(ran_on(&cluster, cell.id()).is_empty());
}

#[test]
fn a_resource_the_worker_lost_unnoticed_is_rebuilt_not_failed() {
    let cluster = FakeCluster::new(1);
    let dispatcher = start(&cluster, fast_config());
    let echo = function(&dispatcher, "echo");
    let resource = built_resource(&dispatcher, 1);
    assert_eq!(
        value(&dispatcher.schedule(&echo, args("warm"), &[]).unwrap()),
        args("warm")
    );
    // The worker restarts between two closures: nothing failed in between.
    cluster.kill(0);
    cluster.restart(0);
    let input = args(&format!("res:{}", resource.id()));
    let cell = dispatcher
        .schedule(&echo, input.clone(), std::slice::from_ref(&resource))
        .unwrap();
    assert_eq!(value(&cell), input);
    assert_eq!(cluster.resources(0), [resource.id()]);
    assert_eq!(dispatcher.metrics().worker_failures, 1);
}

#[test]
fn resources_of_another_dispatcher_are_refused() {
    let cluster = FakeCluster::new(1);
    let first = start(&cluster, fast_config());
    let second = start(&cluster, fast_config());
    let make = function(&first, "resource");
    let echo = function(&second, "echo");
    let resource = first.create_resource(&make, true).unwrap();
    let refused = second.schedule(&echo, args("x"), &[resource]).unwrap_err();
    assert!(
        refused.to_string().contains("another dispatcher"),
        "{refused}"
    );
}

/// A busy link that takes its worker's release while topping up holds it until its
/// pipeline drains; if the worker fails meanwhile, the release is still owed and is sent
/// once the worker answers again (it was dropped, leaving the resource allocated on a
/// worker that came back as the same process).
#[test]
fn a_release_taken_while_pipelining_is_still_sent_after_its_worker_fails() {
    let cluster = FakeCluster::new(2);
    let dispatcher = start(&cluster, fast_config());
    let resource = built_resource(&dispatcher, 2);
    let [first, other, held, second] =
        ["gate:first", "gate:other", "gate:held", "gate:second"].map(|f| function(&dispatcher, f));
    dispatcher.schedule(&first, args("first"), &[]).unwrap();
    let mut w = 0;
    wait_until("a worker runs the first closure", || {
        w = usize::from(cluster.running(1) == 1);
        cluster.running(w) == 1
    });
    let other_cell = dispatcher.schedule(&other, args("other"), &[]).unwrap();
    wait_until("the other worker is busy too", || {
        cluster.running(1 - w) == 1
    });
    let held_cell = dispatcher.schedule(&held, args("held"), &[]).unwrap();
    let second_cell = dispatcher.schedule(&second, args("second"), &[]).unwrap();
    // w answers; no worker is idle, so its link sends `held` with `second` behind it.
    cluster.open_gate("first");
    wait_until("held runs on w with second queued behind it", || {
        cluster.received(w).contains(&second_cell.id()) && cluster.running(w) == 1
    });
    resource.release();
    // w answers `held` while `second` is outstanding: the link tops up and takes the
    // release for w, to serve once its pipeline has drained.
    cluster.open_gate("held");
    wait_until("w's link took its release", || {
        dispatcher.queued_for(w) == 0
    });
    cluster.kill(w);
    wait_until("w is seen failed", || {
        dispatcher.metrics().worker_failures == 1
    });
    cluster.restart(w);
    wait_until("the release is sent to w once it answers", || {
        cluster.calls(w).iter().any(|call| {
            call.method == "ReleaseResource"
                && call.subject == Some(resource.id())
                && call.incarnation == 2
        })
    });
    cluster.open_gate("second");
    cluster.open_gate("other");
    for cell in [&held_cell, &second_cell, &other_cell] {
        value(cell);
    }
    join(&dispatcher);
}

#[test]
fn reading_a_kept_value_counts_it_and_a_missing_or_unreachable_one_says_so() {
    use crate::rpc::RpcError;

    let cluster = FakeCluster::new(2);
    let dispatcher = start(&cluster, fast_config());
    let resource = built_resource(&dispatcher, 2);
    let runtime = crate::runtime::runtime().unwrap();
    let read = |worker, id| runtime.block_on(dispatcher.read_value(worker, id, Some(PATIENCE)));
    let value = read(0, resource.id()).unwrap();
    assert_eq!(value.pickle, format!("value {}", resource.id()).as_bytes());
    let metrics = dispatcher.metrics();
    assert_eq!(metrics.kept_values_fetched, 1);
    assert_eq!(metrics.kept_bytes_fetched, value.byte_len() as u64);
    assert!(matches!(
        read(0, resource.id() + 1000),
        Err(RpcError::NotFound(_))
    ));
    cluster.kill(1);
    assert!(matches!(
        read(1, resource.id()),
        Err(RpcError::Unavailable(_))
    ));
    assert!(matches!(
        read(5, resource.id()),
        Err(RpcError::InvalidArgument(_))
    ));
    assert_eq!(dispatcher.metrics().kept_values_fetched, 1); // failed reads count nothing
}
