//! Seeded stress: many producers, consumers and joiners at once, with random put-backs,
//! failures and tagged closures. Every closure must end exactly once (finished, failed or
//! cancelled) and be dropped exactly once; every blocking call has a deadline.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{spawn, Ledger, Queue, PROMPTLY};
use crate::queue::{QueueError, WaitPolicy};

const PRODUCERS: usize = 4;
const CONSUMERS: usize = 4;
const JOINERS: usize = 2;
const PER_PRODUCER: usize = 4_000;
const N: usize = PRODUCERS * PER_PRODUCER;

#[test]
fn random_put_backs_and_failures_account_for_every_closure() {
    for seed in [7_u64, 1_234, 99_999] {
        run(seed, 32);
        run(seed, 0);
    }
}

#[allow(clippy::too_many_lines)] // one scenario, read top to bottom
fn run(seed: u64, max_size: usize) {
    let ledger = Ledger::new(N);
    let queue = Arc::new(Queue::new(max_size));
    let tagged: Arc<Vec<AtomicBool>> = Arc::new((0..N).map(|_| AtomicBool::new(false)).collect());
    let producing = Arc::new(AtomicUsize::new(PRODUCERS));
    let raised = Arc::new(AtomicUsize::new(0));

    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let (queue, ledger, tagged) =
                (Arc::clone(&queue), Arc::clone(&ledger), Arc::clone(&tagged));
            let (producing, raised) = (Arc::clone(&producing), Arc::clone(&raised));
            spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed ^ (p as u64 + 1));
                for i in 0..PER_PRODUCER {
                    let id = p * PER_PRODUCER + i;
                    let tag = rng
                        .random_bool(0.05)
                        .then(|| rng.random_range(0..CONSUMERS as i64));
                    tagged[id].store(tag.is_some(), Ordering::SeqCst);
                    let mut policy = WaitPolicy::timeout(Some(PROMPTLY));
                    match queue.put_with(ledger.item(id), tag, &mut policy) {
                        Ok(()) => {}
                        Err(QueueError::Failed(_)) => {
                            raised.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(other) => panic!("producer {p}: put of item {id} failed: {other}"),
                    }
                }
                producing.fetch_sub(1, Ordering::SeqCst);
            })
        })
        .collect();

    let consumers: Vec<_> = (0..CONSUMERS)
        .map(|c| {
            let (queue, tagged) = (Arc::clone(&queue), Arc::clone(&tagged));
            spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed ^ (0x100 + c as u64));
                let mut handled = 0_usize;
                loop {
                    let Some(item) = queue.get(Some(c as i64), Some(Duration::from_millis(20)))
                    else {
                        if queue.is_stopped() {
                            return handled;
                        }
                        continue;
                    };
                    handled += 1;
                    if tagged[item.id].load(Ordering::SeqCst) {
                        item.finish(); // tagged closures are never settled with the queue
                        continue;
                    }
                    match rng.random_range(0..100) {
                        0..=1 => {
                            let message = format!("item {} failed", item.id);
                            item.fail();
                            queue.mark_failed(message).unwrap();
                        }
                        2..=11 => queue.put_back(item).unwrap(),
                        _ => {
                            item.finish();
                            queue.mark_finished().unwrap();
                        }
                    }
                }
            })
        })
        .collect();

    let joiners: Vec<_> = (0..JOINERS)
        .map(|j| {
            let (queue, producing, raised) = (
                Arc::clone(&queue),
                Arc::clone(&producing),
                Arc::clone(&raised),
            );
            spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed ^ (0x200 + j as u64));
                while producing.load(Ordering::SeqCst) > 0 {
                    let result = if rng.random_bool(0.5) {
                        queue.wait(Some(Duration::from_millis(rng.random_range(0..3))))
                    } else {
                        queue.done()
                    };
                    match result {
                        Ok(_) => {}
                        Err(QueueError::Failed(_)) => {
                            raised.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(other) => panic!("joiner {j}: {other}"),
                    }
                }
            })
        })
        .collect();

    for producer in producers {
        producer.join("producer");
    }
    for joiner in joiners {
        joiner.join("joiner");
    }
    loop {
        match queue.wait(Some(PROMPTLY)) {
            Ok(true) => break,
            Ok(false) => {
                panic!("seed {seed}: wait() did not see the queue drain within {PROMPTLY:?}")
            }
            Err(QueueError::Failed(_)) => {
                raised.fetch_add(1, Ordering::SeqCst);
            }
            Err(other) => panic!("seed {seed}: {other}"),
        }
    }
    queue.stop(); // cancels tagged closures their worker never took, releases consumers
    let handled: usize = consumers.into_iter().map(|c| c.join("consumer")).sum();
    assert_eq!(queue.inflight(), 0);

    let failed = Ledger::count(&ledger.failed) as usize;
    assert!(handled >= Ledger::count(&ledger.finished) as usize + failed);
    if failed > 0 {
        assert!(
            raised.load(Ordering::SeqCst) > 0,
            "seed {seed}: failures were never raised"
        );
    }
    ledger.assert_each_settled_once();
}
