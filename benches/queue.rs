//! Closure queue throughput (`cargo bench --bench queue`).
//!
//! - `single_thread`: one thread cycling put → get → `mark_finished` (and put → get alone);
//!   target >= 10M cycles/s.
//! - `threads_4x4`: 4 producer and 4 consumer threads moving items through one queue;
//!   target >= 5M items/s.
//! - `lock_free_reference`: the same item counts through `std::sync::mpsc::sync_channel`
//!   (a lock-free bounded channel, crossbeam's design) with 4 producers and 1 consumer, next
//!   to our queue in the same shape, to show what the one-mutex design costs.

#![allow(missing_docs)] // criterion's macros generate undocumented items

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use _core::queue::{Cancel, ClosureQueue};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

/// A closure stand-in: one word, nothing to do on cancel.
struct Job(u64);

impl Cancel for Job {
    fn cancel(self) {}
}

type Queue = ClosureQueue<Job, String>;

/// Items moved per measured iteration of the threaded benchmarks.
const BATCH: u64 = 4096;
const MAX_SIZE: usize = 262_144;

fn single_thread(c: &mut Criterion) {
    let mut group = c.benchmark_group("single_thread");
    group.throughput(Throughput::Elements(1));
    let queue = Queue::new(MAX_SIZE);
    group.bench_function("put_get_mark_finished", |b| {
        let mut n = 0;
        b.iter(|| {
            n += 1;
            queue.put(Job(n), None).unwrap();
            let job = queue.get(None, None).unwrap();
            black_box(job.0);
            queue.mark_finished().unwrap();
        });
    });
    group.bench_function("try_put_try_get", |b| {
        let mut n = 0;
        b.iter(|| {
            n += 1;
            let _ = queue.try_put(Job(n), None);
            black_box(queue.try_get(None).ok());
        });
    });
    group.finish();
}

/// Moves `total` items from `producers` threads to `consumers` threads through a fresh
/// queue; returns the elapsed time from the first put to the last `mark_finished`.
fn run_threads(producers: u64, consumers: u64, total: u64) -> Duration {
    let queue = Arc::new(Queue::new(MAX_SIZE));
    let consumed = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let consumer_threads: Vec<_> = (0..consumers)
        .map(|_| {
            let (queue, consumed) = (Arc::clone(&queue), Arc::clone(&consumed));
            thread::spawn(move || {
                let mut mine = 0;
                while let Some(job) = queue.get(None, None) {
                    black_box(job.0);
                    queue.mark_finished().unwrap();
                    mine += 1;
                }
                consumed.fetch_add(mine, Ordering::Relaxed);
            })
        })
        .collect();
    let producer_threads: Vec<_> = (0..producers)
        .map(|p| {
            let queue = Arc::clone(&queue);
            let share = total / producers + u64::from(p < total % producers);
            thread::spawn(move || {
                for n in 0..share {
                    queue.put(Job(n), None).unwrap();
                }
            })
        })
        .collect();
    for producer in producer_threads {
        producer.join().unwrap();
    }
    assert!(queue.wait(None).unwrap());
    let elapsed = start.elapsed();
    queue.stop();
    for consumer in consumer_threads {
        consumer.join().unwrap();
    }
    assert_eq!(consumed.load(Ordering::Relaxed), total);
    elapsed
}

/// The lock-free reference: `producers` threads into one `sync_channel` consumer.
fn run_channel(producers: u64, total: u64) -> Duration {
    let (tx, rx) = mpsc::sync_channel::<Job>(MAX_SIZE);
    let start = Instant::now();
    let producer_threads: Vec<_> = (0..producers)
        .map(|p| {
            let tx = tx.clone();
            let share = total / producers + u64::from(p < total % producers);
            thread::spawn(move || {
                for n in 0..share {
                    tx.send(Job(n)).unwrap();
                }
            })
        })
        .collect();
    drop(tx);
    let mut received = 0;
    for job in &rx {
        black_box(job.0);
        received += 1;
    }
    let elapsed = start.elapsed();
    for producer in producer_threads {
        producer.join().unwrap();
    }
    assert_eq!(received, total);
    elapsed
}

fn threads(c: &mut Criterion) {
    let mut group = c.benchmark_group("threads_4x4");
    group.throughput(Throughput::Elements(BATCH));
    group.sample_size(20);
    group.bench_function("put_get_mark_finished", |b| {
        b.iter_custom(|iters| run_threads(4, 4, iters * BATCH));
    });
    group.finish();

    let mut group = c.benchmark_group("lock_free_reference");
    group.throughput(Throughput::Elements(BATCH));
    group.sample_size(20);
    group.bench_function("closure_queue_4x1", |b| {
        b.iter_custom(|iters| run_threads(4, 1, iters * BATCH));
    });
    group.bench_function("std_sync_channel_4x1", |b| {
        b.iter_custom(|iters| run_channel(4, iters * BATCH));
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = single_thread, threads
}
criterion_main!(benches);
