//! Device-name parsing throughput (target: at least 10M parses/s on one core).
//!
//! Every iteration parses a fixed set of distinct strings mixing the canonical form,
//! shuffled segments, legacy device forms and uncommon job names, so neither the branch
//! predictor nor a cache can learn one string.
//!
//! Each benchmark runs twice: timed by the wall clock (criterion's default) and by this
//! thread's CPU time (`*_cpu` groups). On a machine shared with other jobs the wall clock
//! also counts time spent descheduled; the CPU-time figure is the one to compare with the
//! target there.

use std::hint::black_box;
use std::time::Instant;

use criterion::measurement::{Measurement, ValueFormatter, WallTime};
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

/// Nanoseconds this thread has run, from Linux's scheduler statistics; falls back to the
/// wall clock where `/proc/thread-self/schedstat` does not exist.
struct ThreadCpuTime {
    origin: Instant,
}

impl ThreadCpuTime {
    fn now_ns(&self) -> u64 {
        std::fs::read_to_string("/proc/thread-self/schedstat")
            .ok()
            .and_then(|stat| stat.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| self.origin.elapsed().as_nanos() as u64)
    }
}

static WALL_TIME: WallTime = WallTime;

impl Measurement for ThreadCpuTime {
    type Intermediate = u64;
    type Value = u64;

    fn start(&self) -> u64 {
        self.now_ns()
    }
    fn end(&self, start: u64) -> u64 {
        self.now_ns().saturating_sub(start)
    }
    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }
    fn zero(&self) -> u64 {
        0
    }
    #[allow(clippy::cast_precision_loss)] // exact below 2^53 ns, about 104 days
    fn to_f64(&self, value: &u64) -> f64 {
        *value as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        // Values are nanoseconds, as the wall clock's are.
        WALL_TIME.formatter()
    }
}

fn parsing<M: Measurement>(c: &mut Criterion<M>, suffix: &str) {
    let names = distinct_names();
    let mut group = c.benchmark_group(format!("device_parse{suffix}"));
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
    group.bench_function("DeviceSpec::to_string", |b| {
        b.iter(|| {
            for spec in &specs {
                black_box(spec.to_string());
            }
        });
    });
    group.finish();
}

fn tpu_map<M: Measurement>(c: &mut Criterion<M>, suffix: &str) {
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
    let mut group = c.benchmark_group(format!("tpu_device_map{suffix}"));
    group.throughput(Throughput::Elements(names.len() as u64));
    group.bench_function("160 names", |b| {
        b.iter(|| black_box(tpu_device_map(black_box(&names)).unwrap()));
    });
    group.finish();
}

fn wall(c: &mut Criterion) {
    parsing(c, "");
    tpu_map(c, "");
}

fn cpu(c: &mut Criterion<ThreadCpuTime>) {
    parsing(c, "_cpu");
    tpu_map(c, "_cpu");
}

criterion_group!(wall_clock, wall);
criterion_group! {
    name = cpu_time;
    config = Criterion::default().with_measurement(ThreadCpuTime { origin: Instant::now() });
    targets = cpu
}
criterion_main!(wall_clock, cpu_time);
