//! Parameter-server failures reported by closures: TF's transient rule (retried below the
//! threshold, per ps task, never reset), then the closure's own error; never a worker
//! failure.

use super::*;
use crate::dispatch::{DispatchError, ErrorPolicy, FailureKind};
use crate::queue::WaitPolicy;

#[test]
fn failures_below_the_threshold_are_retried_and_the_closure_ends_with_its_value() {
    let cluster = FakeCluster::new(2);
    let dispatcher = start(&cluster, fast_config());
    let flaky = function(&dispatcher, "ps-fail:0:2");
    let cell = dispatcher.schedule(&flaky, args("v"), &[]).unwrap();
    assert_eq!(value(&cell), args("v"));
    join(&dispatcher);
    assert_eq!(ran_on(&cluster, cell.id()).len(), 3);
    let metrics = dispatcher.metrics();
    assert_eq!(
        (metrics.ps_failures, metrics.retried, metrics.failed),
        (2, 2, 0)
    );
    assert_eq!(
        metrics.worker_failures, 0,
        "a ps failure is not a worker failure"
    );
    wait_until("every link is up", || all_up(&dispatcher));
}

#[test]
fn the_threshold_th_report_is_raised_from_join_and_later_ones_at_once() {
    let cluster = FakeCluster::new(2);
    let dispatcher = start(&cluster, fast_config());
    let down = function(&dispatcher, "ps-fail:1:1000");
    let first = dispatcher.schedule(&down, args("a"), &[]).unwrap();
    match dispatcher.join(&mut WaitPolicy::until(deadline())) {
        Err(DispatchError::ClosureFailed(error)) => {
            assert_eq!(error.ps_task, Some(1));
            assert_eq!(error.kind, FailureKind::User);
            assert_eq!(error.type_name, "PSUnavailableError");
        }
        other => panic!("join returned {other:?}"),
    }
    assert_eq!(ran_on(&cluster, first.id()).len(), 3);
    assert_eq!(failure(&first).ps_task, Some(1));

    // TF never resets the count: the next report about ps 1 is raised at once...
    let second = dispatcher.schedule(&down, args("b"), &[]).unwrap();
    assert!(matches!(
        dispatcher.join(&mut WaitPolicy::until(deadline())),
        Err(DispatchError::ClosureFailed(_))
    ));
    assert_eq!(ran_on(&cluster, second.id()).len(), 1);
    // ...while ps 0 still has its own budget.
    let other = function(&dispatcher, "ps-fail:0:1");
    let third = dispatcher.schedule(&other, args("c"), &[]).unwrap();
    assert_eq!(value(&third), args("c"));
    let metrics = dispatcher.metrics();
    assert_eq!((metrics.ps_failures, metrics.retried), (5, 3));
    assert_eq!(metrics.worker_failures, 0);
    wait_until("every link is up", || all_up(&dispatcher));
}

#[test]
fn a_threshold_of_zero_reports_the_first_failure_and_per_closure_keeps_it_there() {
    let cluster = FakeCluster::new(1);
    let config = DispatcherConfig {
        transient_ps_failures: 0,
        error_policy: ErrorPolicy::PerClosure,
        ..fast_config()
    };
    let dispatcher = start(&cluster, config);
    let down = function(&dispatcher, "ps-fail:0:1");
    let cell = dispatcher.schedule(&down, args("a"), &[]).unwrap();
    assert_eq!(failure(&cell).ps_task, Some(0));
    join(&dispatcher);
    assert_eq!(ran_on(&cluster, cell.id()).len(), 1);
    let metrics = dispatcher.metrics();
    assert_eq!((metrics.ps_failures, metrics.retried), (1, 0));
}
