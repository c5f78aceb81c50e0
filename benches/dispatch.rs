//! Closures per second through the dispatcher with the in-memory fake transport: the
//! ceiling of the Rust path (queue, link tasks, result cells), with 1 and
//! 4 links. Run with `cargo bench --bench dispatch`.

use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

use _core::dispatch::fake::FakeCluster;
use _core::dispatch::{Dispatcher, DispatcherConfig, EncodedValue, FunctionKind};
use _core::queue::WaitPolicy;

/// Closures per measured batch: scheduled back to back, then joined.
const BATCH: u64 = 5_000;

fn closures_per_second(c: &mut Criterion) {
    let mut group = c.benchmark_group("dispatch");
    group.throughput(Throughput::Elements(BATCH));
    group.measurement_time(Duration::from_secs(10));
    for links in [1, 4] {
        let cluster = FakeCluster::new(links);
        let dispatcher = Dispatcher::new(cluster.transports(), DispatcherConfig::default())
            .expect("dispatcher starts");
        let payload = Bytes::from_static(b"echo");
        let hash = _core::rpc::content_hash(&payload);
        dispatcher
            .register_function(&hash, FunctionKind::Cloudpickle, payload)
            .expect("registers");
        let args = EncodedValue {
            pickle: Bytes::from_static(b"\x80\x05K\x01."),
            buffers: vec![Bytes::from(vec![0u8; 64])],
        };
        group.bench_function(format!("{links}_links"), |b| {
            b.iter(|| {
                for _ in 0..BATCH {
                    dispatcher
                        .schedule(&hash, args.clone(), &[])
                        .expect("schedules");
                }
                let deadline = Instant::now() + Duration::from_secs(60);
                let finished = dispatcher.join(&mut WaitPolicy::until(Some(deadline)));
                assert!(matches!(finished, Ok(true)), "{finished:?}");
            });
        });
        dispatcher.shutdown();
    }
    group.finish();
}

criterion_group!(benches, closures_per_second);
criterion_main!(benches);
