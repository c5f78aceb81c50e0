//! `get_async`, the getter a dispatcher's link tasks use: woken by untagged and tagged puts
//! (the getter that began waiting last first) and by `stop`, timing out, cancel-safe, and
//! under many tasks and producer threads at random every item is taken exactly once.

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{await_state, Ledger, Queue, PROMPTLY};

/// A small multi-thread runtime of its own, so these tests do not depend on the process's.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap()
}

#[test]
fn an_async_getter_is_woken_by_a_put_from_a_thread() {
    let ledger = Ledger::new(1);
    let queue = Arc::new(Queue::new(0));
    let runtime = runtime();
    let getter = {
        let queue = Arc::clone(&queue);
        runtime.spawn(async move { queue.get_async(None, Some(PROMPTLY)).await })
    };
    // Whether the put comes before or after the getter waits, it must be taken.
    queue.put(ledger.item(0), None).unwrap();
    let item = runtime
        .block_on(getter)
        .unwrap()
        .expect("the getter took the item");
    item.finish();
    queue.mark_finished().unwrap();
    ledger.assert_each_settled_once();
}

#[test]
fn the_getter_that_began_waiting_last_is_woken_first() {
    // A serial loop stays on the link whose worker just answered: that link waits last.
    let ledger = Ledger::new(1);
    let queue = Arc::new(Queue::new(0));
    let runtime = runtime();
    let spawn_getter = || {
        let queue = Arc::clone(&queue);
        runtime.spawn(async move {
            queue
                .get_async(None, Some(Duration::from_millis(300)))
                .await
        })
    };
    let first = spawn_getter();
    await_state(&queue, "the first getter asleep", |state| {
        state.sleepers.async_getters == 1
    });
    let last = spawn_getter();
    await_state(&queue, "both getters asleep", |state| {
        state.sleepers.async_getters == 2
    });
    queue.put(ledger.item(0), None).unwrap();
    let item = runtime
        .block_on(last)
        .unwrap()
        .expect("the getter that began waiting last took the item");
    item.finish();
    assert!(
        runtime.block_on(first).unwrap().is_none(),
        "the first getter was left to time out"
    );
    queue.mark_finished().unwrap();
    ledger.assert_each_settled_once();
}

#[test]
fn a_tagged_put_wakes_the_getter_of_that_tag_and_stop_wakes_the_rest() {
    let ledger = Ledger::new(1);
    let queue = Arc::new(Queue::new(0));
    let runtime = runtime();
    let spawn_getter = |tag| {
        let queue = Arc::clone(&queue);
        runtime.spawn(async move { queue.get_async(Some(tag), Some(PROMPTLY)).await })
    };
    let (seven, eight) = (spawn_getter(7), spawn_getter(8));
    queue.try_put(ledger.item(0), Some(7)).unwrap();
    let item = runtime
        .block_on(seven)
        .unwrap()
        .expect("tag 7 took its item");
    assert_eq!(item.id, 0);
    item.finish();
    queue.stop();
    assert!(
        runtime.block_on(eight).unwrap().is_none(),
        "stop ends the wait with None"
    );
    ledger.assert_each_settled_once();
}

#[test]
fn a_getter_times_out_with_none_and_a_dropped_one_takes_nothing() {
    let ledger = Ledger::new(1);
    let queue = Arc::new(Queue::new(0));
    let runtime = runtime();
    let waited = runtime.block_on(queue.get_async(None, Some(Duration::from_millis(20))));
    assert!(waited.is_none());
    // A getter dropped while waiting (a link told to stop) leaves the item for the next.
    runtime.block_on(async {
        let dropped = tokio::time::timeout(Duration::from_millis(20), queue.get_async(None, None));
        assert!(
            dropped.await.is_err(),
            "nothing was queued, so it was still waiting"
        );
    });
    queue.put(ledger.item(0), None).unwrap();
    let item = runtime
        .block_on(queue.get_async(None, Some(PROMPTLY)))
        .expect("the item is still there");
    item.finish();
    queue.mark_finished().unwrap();
    ledger.assert_each_settled_once();
}

#[test]
fn many_async_getters_and_producer_threads_take_every_item_once() {
    const ITEMS: usize = 20_000;
    const GETTERS: usize = 64;
    const PRODUCERS: usize = 4;
    let ledger = Ledger::new(ITEMS);
    let queue = Arc::new(Queue::new(256));
    let runtime = runtime();
    let getters: Vec<_> = (0..GETTERS)
        .map(|getter| {
            let queue = Arc::clone(&queue);
            runtime.spawn(async move {
                let mut rng = StdRng::seed_from_u64(getter as u64);
                let mut taken = 0usize;
                // Tagged getters take untagged items too; half of them use a tag.
                let tag = (getter % 2 == 0).then_some(getter as i64);
                while let Some(item) = queue.get_async(tag, None).await {
                    if rng.random_bool(0.05) {
                        tokio::task::yield_now().await;
                    }
                    item.finish();
                    queue.mark_finished().unwrap();
                    taken += 1;
                }
                taken
            })
        })
        .collect();
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|producer| {
            let queue = Arc::clone(&queue);
            let ledger = Arc::clone(&ledger);
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(1000 + producer as u64);
                for id in (producer..ITEMS).step_by(PRODUCERS) {
                    queue.put(ledger.item(id), None).unwrap();
                    if rng.random_bool(0.01) {
                        std::thread::yield_now();
                    }
                }
            })
        })
        .collect();
    for producer in producers {
        producer.join().unwrap();
    }
    assert!(
        queue.wait(Some(PROMPTLY)).unwrap(),
        "every item was taken and finished"
    );
    queue.stop();
    let taken: usize = getters
        .into_iter()
        .map(|getter| runtime.block_on(getter).unwrap())
        .sum();
    assert_eq!(taken, ITEMS);
    ledger.assert_each_settled_once();
}
