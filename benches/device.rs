//! Device-name parsing throughput (target: at least 10M parses/s on one core).
//!
//! Every iteration parses a fixed set of distinct strings mixing the canonical form,
//! shuffled segments, legacy device forms and uncommon job names, so neither the branch
//! predictor nor a cache can learn one string.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};

use _core::device::{parse, tpu_device_map, DeviceSpec};

const NAMES: usize = 4096;

fn distinct_names() -> Vec<String> {
    const JOBS: [&str; 5] = ["worker", "ps", "chief", "trainer", "localhost"];
    const TYPES: [&str; 4] = ["CPU", "GPU", "TPU", "TPU_SYSTEM"];
    (0..NAMES)
        .map(|i| {
            let job = JOBS[i % JOBS.len()];
            let kind = TYPES[(i / 5) % TYPES.len()];
            let (task, index) = (i / 20, i % 8);
            match i % 4 {
                0 | 1 => format!("/job:{job}/replica:0/task:{task}/device:{kind}:{index}"),
                2 => format!("/device:{kind}:{index}/task:{task}/job:{job}"),
                _ => format!("/job:{job}{i}/task:{task}/gpu:{index}"),
            }
        })
        .collect()
}

fn parsing(c: &mut Criterion) {
    let names = distinct_names();
    let mut group = c.benchmark_group("device_parse");
    group.throughput(Throughput::Elements(names.len() as u64));
    group.bench_function("parse (borrowed)", |b| {
        b.iter(|| {
            for name in &names {
                black_box(parse(black_box(name)).ok());
            }
        });
    });
    group.bench_function("DeviceSpec::parse (owned)", |b| {
        b.iter(|| {
            for name in &names {
                black_box(DeviceSpec::parse(black_box(name)).ok());
            }
        });
    });
    let specs: Vec<DeviceSpec> = names
        .iter()
        .map(|n| DeviceSpec::parse(n).unwrap())
        .collect();
    group.bench_function("DeviceSpec::render", |b| {
        b.iter(|| {
            for spec in &specs {
                black_box(spec.render());
            }
        });
    });
    group.finish();
}

fn tpu_map(c: &mut Criterion) {
    // A v4-256-like slice: 32 hosts of 4 cores plus one CPU device each.
    let names: Vec<String> = (0..32)
        .flat_map(|host| {
            (0..4)
                .map(move |core| format!("/job:worker/replica:0/task:{host}/device:TPU:{core}"))
                .chain(std::iter::once(format!(
                    "/job:worker/replica:0/task:{host}/device:CPU:0"
                )))
        })
        .collect();
    let mut group = c.benchmark_group("tpu_device_map");
    group.throughput(Throughput::Elements(names.len() as u64));
    group.bench_function("160 names", |b| {
        b.iter(|| black_box(tpu_device_map(black_box(&names)).unwrap()));
    });
    group.finish();
}

criterion_group!(benches, parsing, tpu_map);
criterion_main!(benches);
