//! The bottom rungs: smoke, length, one producer and consumer, many of each.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{spawn, within, Ledger, Queue};
use crate::queue::{TryGetError, TryPutError};

#[test]
fn smoke() {
    let ledger = Ledger::new(1);
    let queue = Queue::new(4);
    queue.put(ledger.item(0), None).unwrap();
    let item = queue.get(None, Some(Duration::ZERO)).unwrap();
    assert_eq!(item.id, 0);
    assert_eq!(queue.inflight(), 1);
    item.finish();
    queue.mark_finished().unwrap();
    assert_eq!(queue.inflight(), 0);
    assert!(queue.done().unwrap());
    ledger.assert_each_settled_once();
}

#[test]
fn length_and_fifo_order() {
    let ledger = Ledger::new(5);
    let queue = Queue::new(5);
    assert!(queue.is_empty());
    for id in 0..5 {
        queue.put(ledger.item(id), None).unwrap();
        assert_eq!(queue.len(), id + 1);
    }
    let refused = queue.try_put(ledger.item(0), None).unwrap_err();
    assert!(matches!(refused, TryPutError::Full(ref item) if item.id == 0));
    drop(refused); // the refused duplicate is handed back, not queued
    assert!(
        !queue.done().unwrap(),
        "queued closures are outstanding work"
    );
    for id in 0..5 {
        let item = queue.try_get(None).unwrap();
        assert_eq!(item.id, id, "FIFO order");
        assert_eq!(queue.len(), 4 - id);
        assert_eq!(queue.inflight(), id + 1);
        drop(item);
    }
    assert_eq!(queue.try_get(None).unwrap_err(), TryGetError::Empty);
}

#[test]
fn get_times_out_with_none_after_its_timeout() {
    let queue = Queue::new(1);
    let start = Instant::now();
    assert!(queue.get(None, Some(Duration::from_millis(30))).is_none());
    assert!(start.elapsed() >= Duration::from_millis(30));
    assert!(queue.get(None, Some(Duration::ZERO)).is_none());
}

#[test]
fn unbounded_when_max_size_is_zero() {
    let ledger = Ledger::new(1000);
    let queue = Queue::new(0);
    for id in 0..1000 {
        queue.try_put(ledger.item(id), None).unwrap();
    }
    assert_eq!(queue.len(), 1000);
    assert_eq!(queue.max_size(), 0);
}

#[test]
fn single_producer_single_consumer_preserves_order() {
    const N: usize = 10_000;
    let ledger = Ledger::new(N);
    let queue = Arc::new(Queue::new(16));
    let producer = {
        let (queue, ledger) = (Arc::clone(&queue), Arc::clone(&ledger));
        spawn(move || {
            for id in 0..N {
                queue.put(ledger.item(id), None).unwrap();
            }
        })
    };
    let consumer = {
        let queue = Arc::clone(&queue);
        spawn(move || {
            let mut seen = Vec::with_capacity(N);
            while seen.len() < N {
                let item = queue
                    .get(None, Some(super::PROMPTLY))
                    .expect("producer stalled");
                seen.push(item.id);
                item.finish();
                queue.mark_finished().unwrap();
            }
            seen
        })
    };
    producer.join("producer");
    let seen = consumer.join("consumer");
    assert_eq!(seen, (0..N).collect::<Vec<_>>());
    assert!(queue.wait(Some(super::PROMPTLY)).unwrap());
    ledger.assert_each_settled_once();
}

#[test]
fn many_producers_many_consumers_deliver_everything_once() {
    const PRODUCERS: usize = 4;
    const CONSUMERS: usize = 4;
    const PER_PRODUCER: usize = 5_000;
    const N: usize = PRODUCERS * PER_PRODUCER;
    let ledger = Ledger::new(N);
    let queue = Arc::new(Queue::new(64));
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let (queue, ledger) = (Arc::clone(&queue), Arc::clone(&ledger));
            spawn(move || {
                for i in 0..PER_PRODUCER {
                    queue.put(ledger.item(p * PER_PRODUCER + i), None).unwrap();
                }
            })
        })
        .collect();
    let consumers: Vec<_> = (0..CONSUMERS)
        .map(|_| {
            let queue = Arc::clone(&queue);
            spawn(move || {
                let mut seen = Vec::new();
                // Stop signals the end: every getter then returns None.
                while let Some(item) = queue.get(None, Some(super::PROMPTLY)) {
                    seen.push(item.id);
                    item.finish();
                    queue.mark_finished().unwrap();
                }
                seen
            })
        })
        .collect();
    for producer in producers {
        producer.join("producer");
    }
    let queue_for_wait = Arc::clone(&queue);
    assert!(within("wait for all", move || queue_for_wait
        .wait(Some(super::PROMPTLY))
        .unwrap()));
    queue.stop();
    let mut all = HashSet::new();
    for consumer in consumers {
        for id in consumer.join("consumer") {
            assert!(all.insert(id), "item {id} delivered twice");
        }
    }
    assert_eq!(all.len(), N);
    ledger.assert_each_settled_once();
}
