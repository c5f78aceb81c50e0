//! A worker of another Python minor version is refused at connect: its link stays out of
//! service naming both versions, and closures run on the other workers.

use super::*;
use crate::dispatch::{LinkState, Versions};

#[test]
fn a_worker_of_another_python_minor_is_refused_and_closures_run_elsewhere() {
    let cluster = FakeCluster::new(2);
    cluster.report_python(0, "3.11.4");
    cluster.report_python(1, "3.12.0");
    let config = DispatcherConfig {
        versions: Some(Versions {
            python: "3.11.9".to_owned(),
            jax: String::new(),
            jaxcluster: env!("CARGO_PKG_VERSION").to_owned(),
        }),
        ..fast_config()
    };
    let dispatcher = start(&cluster, config);
    wait_until("worker 1 is refused", || {
        dispatcher.worker_statuses()[1]
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("Python 3.12.0") && e.contains("Python 3.11.9"))
    });
    assert_ne!(state(&dispatcher, 1), LinkState::Up);
    wait_until("worker 0 is up", || state(&dispatcher, 0) == LinkState::Up);
    let echo = function(&dispatcher, "echo");
    let cells: Vec<_> = (0..4)
        .map(|i| {
            dispatcher
                .schedule(&echo, args(&i.to_string()), &[])
                .unwrap()
        })
        .collect();
    for (i, cell) in cells.iter().enumerate() {
        assert_eq!(value(cell), args(&i.to_string()));
        assert_eq!(ran_on(&cluster, cell.id()), [0]);
    }
    assert_ne!(state(&dispatcher, 1), LinkState::Up);
    assert!(cluster.calls(1).iter().all(|c| c.method == "GetStatus"));
}
