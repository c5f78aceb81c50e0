//! Elastic workers: adding and removing workers while closures run. Every closure ends
//! exactly once, an added worker builds the live resources before its first closure, a
//! removed one drains, releases its resources and is never sent anything again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::dispatch::fake::FakeTransport;
use crate::dispatch::{DispatchError, LinkState, ResourceState};

/// A dispatcher on the first `initial` workers of `cluster`; the rest are handed back to
/// be added later, by index.
fn start_with(
    cluster: &FakeCluster,
    initial: usize,
    config: DispatcherConfig,
) -> (Dispatcher, Vec<Option<FakeTransport>>) {
    let mut transports = cluster.transports();
    let rest = transports.split_off(initial);
    let dispatcher = Dispatcher::new(transports, config).expect("dispatcher starts");
    let mut spare = vec![None; initial];
    spare.extend(rest.into_iter().map(Some));
    (dispatcher, spare)
}

fn runs_on(cluster: &FakeCluster, worker: usize) -> usize {
    cluster
        .calls(worker)
        .iter()
        .filter(|call| call.method == "RunClosure")
        .count()
}

#[test]
fn a_cluster_grows_from_2_to_4_and_shrinks_to_1_under_load_with_every_closure_run_once() {
    let cluster = FakeCluster::new(5);
    let (dispatcher, mut spare) = start_with(&cluster, 2, fast_config());
    let dispatcher = Arc::new(dispatcher);
    let slow = function(&dispatcher, "sleep:1");
    let producing = Arc::new(AtomicBool::new(true));
    let producers: Vec<_> = (0..3)
        .map(|thread| {
            let dispatcher = Arc::clone(&dispatcher);
            let producing = Arc::clone(&producing);
            std::thread::spawn(move || {
                let mut cells = Vec::new();
                let mut rng = StdRng::seed_from_u64(thread);
                while producing.load(Ordering::Acquire) || cells.len() < 50 {
                    // At most 100 outstanding per thread, so the queue stays short.
                    if let Some((_, oldest)) = cells.len().checked_sub(100).map(|i| &cells[i]) {
                        let oldest: &Arc<ResultCell> = oldest;
                        assert!(
                            oldest.wait(deadline()),
                            "closure {} never ended",
                            oldest.id()
                        );
                    }
                    let text = format!("{thread}-{}", cells.len());
                    let cell = dispatcher.schedule(&slow, args(&text), &[]).unwrap();
                    cells.push((text, cell));
                    if rng.random_bool(0.1) {
                        std::thread::yield_now();
                    }
                }
                cells
            })
        })
        .collect();
    let completed = |count: u64| dispatcher.metrics().completed >= count;
    wait_until("some closures ran on 2 workers", || completed(50));
    let added = dispatcher
        .add_workers(vec![spare[2].take().unwrap(), spare[3].take().unwrap()])
        .unwrap();
    assert_eq!(added, [2, 3]);
    wait_until("the added workers ran closures", || {
        runs_on(&cluster, 2) > 0 && runs_on(&cluster, 3) > 0
    });
    dispatcher.remove_workers(&[0, 2, 3]).unwrap();
    let after_removal: Vec<usize> = [0, 2, 3].map(|w| runs_on(&cluster, w)).to_vec();
    for worker in [0, 2, 3] {
        assert_eq!(state(&dispatcher, worker), LinkState::Removed);
    }
    let seen = dispatcher.metrics().completed;
    wait_until("worker 1 alone ran more closures", || completed(seen + 50));
    producing.store(false, Ordering::Release);
    let cells: Vec<(String, Arc<ResultCell>)> = producers
        .into_iter()
        .flat_map(|producer| producer.join().unwrap())
        .collect();
    join(&dispatcher);
    for (text, cell) in &cells {
        assert_eq!(value(cell), args(text), "closure {}", cell.id());
    }
    // Removed workers were sent nothing once removal returned.
    assert_eq!(
        [0, 2, 3].map(|w| runs_on(&cluster, w)).to_vec(),
        after_removal
    );
    // Nothing failed, so nothing ran twice.
    let mut runs: HashMap<u64, usize> = HashMap::new();
    for execution in cluster.executions() {
        *runs.entry(execution.closure_id).or_default() += 1;
    }
    for (_, cell) in &cells {
        assert_eq!(runs.get(&cell.id()), Some(&1), "closure {}", cell.id());
    }
    assert_eq!(dispatcher.metrics().retried, 0);
    assert_eq!(dispatcher.num_workers(), 4);
}

#[test]
fn an_added_worker_builds_every_live_resource_before_its_first_closure() {
    let cluster = FakeCluster::new(2);
    let (dispatcher, mut spare) = start_with(&cluster, 1, fast_config());
    let resource = built_resource(&dispatcher, 1);
    assert_eq!(resource.num_workers(), 1);
    dispatcher
        .add_workers(vec![spare[1].take().unwrap()])
        .unwrap();
    assert_eq!(resource.num_workers(), 2);
    let echo = function(&dispatcher, "echo");
    let input = args(&format!("res:{}", resource.id()));
    let cells: Vec<_> = (0..200)
        .map(|_| {
            dispatcher
                .schedule(&echo, input.clone(), std::slice::from_ref(&resource))
                .unwrap()
        })
        .collect();
    for cell in &cells {
        assert_eq!(value(cell), input);
    }
    wait_until("built on worker 1", || {
        resource.state(1) == ResourceState::Ready
    });
    assert_eq!(cluster.resources(1), [resource.id()]);
    let log = cluster.calls(1);
    let built = log.iter().position(|call| call.method == "CreateResource");
    let first_run = log.iter().position(|call| call.method == "RunClosure");
    if let Some(first_run) = first_run {
        assert!(
            built.is_some_and(|built| built < first_run),
            "worker 1 ran a closure before building the resource: {log:?}"
        );
    }
}

#[test]
fn a_removed_worker_releases_its_resources_and_its_index_is_not_reused() {
    let cluster = FakeCluster::new(3);
    let (dispatcher, mut spare) = start_with(&cluster, 2, fast_config());
    let resource = built_resource(&dispatcher, 2);
    dispatcher.remove_workers(&[1]).unwrap();
    assert_eq!(state(&dispatcher, 1), LinkState::Removed);
    assert!(
        cluster.resources(1).is_empty(),
        "worker 1 still holds the resource"
    );
    assert_eq!(resource.state(1), ResourceState::Aborted);
    assert_eq!(cluster.resources(0), [resource.id()]);
    let added = dispatcher
        .add_workers(vec![spare[2].take().unwrap()])
        .unwrap();
    assert_eq!(added, [2]);
    wait_until("built on the added worker", || {
        resource.state(2) == ResourceState::Ready
    });
    // The removed worker stays removed: nothing is rebuilt there.
    assert_eq!(resource.state(1), ResourceState::Aborted);
    assert!(cluster.resources(1).is_empty());
}

#[test]
fn removal_is_refused_for_unknown_or_removed_workers_and_when_none_would_remain() {
    let cluster = FakeCluster::new(2);
    let dispatcher = start(&cluster, fast_config());
    let refused = dispatcher.remove_workers(&[0, 1]);
    assert!(
        matches!(&refused, Err(DispatchError::InvalidArgument(m)) if m.contains("no worker able")),
        "{refused:?}"
    );
    let refused = dispatcher.remove_workers(&[7]);
    assert!(
        matches!(&refused, Err(DispatchError::InvalidArgument(m)) if m.contains("no worker 7")),
        "{refused:?}"
    );
    // Nothing was removed by the refused calls.
    assert!((0..2).all(|w| state(&dispatcher, w) != LinkState::Removed));
    dispatcher.remove_workers(&[1]).unwrap();
    let refused = dispatcher.remove_workers(&[1]);
    assert!(
        matches!(&refused, Err(DispatchError::InvalidArgument(m)) if m.contains("already removed")),
        "{refused:?}"
    );
    let echo = function(&dispatcher, "echo");
    let cell = dispatcher.schedule(&echo, args("still"), &[]).unwrap();
    assert_eq!(value(&cell), args("still"));
}

#[test]
fn a_worker_that_is_down_is_removed_without_waiting_for_it() {
    let cluster = FakeCluster::new(2);
    let config = DispatcherConfig {
        backoff: BackoffConfig {
            initial: Duration::from_secs(5),
            max: Duration::from_secs(5),
        },
        ..fast_config()
    };
    let dispatcher = start(&cluster, config);
    wait_until("both up", || all_up(&dispatcher));
    cluster.kill(1);
    let echo = function(&dispatcher, "echo");
    // Closures find worker 1 down; it then waits 5 s between attempts.
    let cells: Vec<_> = (0..20)
        .map(|i| {
            dispatcher
                .schedule(&echo, args(&i.to_string()), &[])
                .unwrap()
        })
        .collect();
    wait_until("worker 1 is recovering", || {
        state(&dispatcher, 1) == LinkState::Recovering
    });
    let started = Instant::now();
    dispatcher.remove_workers(&[1]).unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "removal waited out the backoff: {:?}",
        started.elapsed()
    );
    assert_eq!(state(&dispatcher, 1), LinkState::Removed);
    for (i, cell) in cells.iter().enumerate() {
        assert_eq!(value(cell), args(&i.to_string()));
    }
}

#[test]
fn closures_fail_while_every_worker_is_given_up_and_run_again_once_one_is_added() {
    let cluster = FakeCluster::new(2);
    let config = DispatcherConfig {
        recovery_timeout: Duration::from_millis(200),
        error_policy: crate::dispatch::ErrorPolicy::PerClosure,
        ..fast_config()
    };
    let (dispatcher, mut spare) = start_with(&cluster, 1, config);
    wait_until("worker 0 up", || all_up(&dispatcher));
    cluster.kill(0);
    let echo = function(&dispatcher, "echo");
    let doomed = dispatcher.schedule(&echo, args("doomed"), &[]).unwrap();
    let failed = failure(&doomed);
    assert_eq!(failed.type_name, "UnavailableError", "{failed:?}");
    assert!(failed.message.contains("given up"), "{}", failed.message);
    dispatcher
        .add_workers(vec![spare[1].take().unwrap()])
        .unwrap();
    let cell = dispatcher.schedule(&echo, args("runs"), &[]).unwrap();
    assert_eq!(value(&cell), args("runs"));
    assert_eq!(ran_on(&cluster, cell.id()), [1]);
}

#[test]
fn an_added_slice_serves_only_as_rank_zero_of_a_slice_that_size() {
    let cluster = FakeCluster::new(3);
    cluster.report_slice(1, 0, 2); // rank 0 of a 2-host slice
    cluster.report_slice(2, 0, 2);
    let (dispatcher, mut spare) = start_with(&cluster, 1, fast_config());
    wait_until("worker 0 is up", || state(&dispatcher, 0) == LinkState::Up);
    // Added as a slice of 2: it reports that, so it serves.
    assert_eq!(
        dispatcher
            .add_slices(vec![spare[1].take().unwrap()], 2)
            .unwrap(),
        [1]
    );
    // Added as a worker of its own, a slice's rank 0 is never used.
    assert_eq!(
        dispatcher
            .add_workers(vec![spare[2].take().unwrap()])
            .unwrap(),
        [2]
    );
    wait_until("the slice is up", || state(&dispatcher, 1) == LinkState::Up);
    wait_until("the mismatch is explained", || {
        dispatcher.worker_statuses()[2]
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("rank 0 of slice 0 of 2 hosts"))
    });
    let echo = function(&dispatcher, "echo");
    let cells: Vec<_> = (0..8)
        .map(|i| {
            dispatcher
                .schedule(&echo, args(&i.to_string()), &[])
                .unwrap()
        })
        .collect();
    for (i, cell) in cells.iter().enumerate() {
        assert_eq!(value(cell), args(&i.to_string()));
        assert_ne!(ran_on(&cluster, cell.id()), [2]);
    }
    assert_ne!(state(&dispatcher, 2), LinkState::Up);
    assert!(cluster.calls(2).iter().all(|c| c.method == "GetStatus"));
}
