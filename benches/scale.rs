//! Dispatch at 10, 100 and 1,000 workers: what one coordinator costs per worker.
//!
//!     cargo bench --bench scale                 # 10, 100, 1000 workers
//!     cargo bench --bench scale -- 10 100       # chosen sizes
//!     (`cargo test --all-targets` runs it with 10 workers, as a smoke test)
//!
//! The workers are real tonic `WorkerServer`s on 127.0.0.1 in child processes (this binary
//! run as `scale serve N`), each with a small Rust echo executor standing in for the Python
//! one: N - 1 in one child, and one in a child of its own, the one killed (`SIGKILL`). The coordinator
//! sees N real gRPC endpoints and its own process holds only the coordinator, so its threads
//! and memory are the coordinator's. For each size it reports:
//!
//! - ready: from `Dispatcher::new` until every link is `up`;
//! - closures/s for rounds of trivial closures (scheduled back to back, then joined), the
//!   median of 3 rounds, and the coordinator process's CPU time per closure over them. A
//!   round is 20,000 closures, or five pipelines' worth per worker if that is more (5 ×
//!   (1 + the default depth of 64) = 325 per worker at 1,000 workers): a shorter round is
//!   mostly the filling and draining of 1,000 pipelines (each link starts with one closure
//!   while others are idle), which measures the burst's length more than the dispatch rate
//!   (with 100 per worker, 300-335k/s on this machine where 325 gives 365-375k/s);
//! - the coordinator's threads and resident memory per worker, minus the process before
//!   the dispatcher existed: once every link is up (`idle`: links, connections and their
//!   open streams) and after the rounds (which adds what the queued closures left in the
//!   allocator: at 10 workers that, not the workers, is most of it);
//! - kill → detected: one worker's process is killed (`SIGKILL`) while closures run; the time until
//!   its link leaves `up` (its closures go back to the queue then), and how many were
//!   retried.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use _core::dispatch::{Dispatcher, DispatcherConfig, EncodedValue, FunctionKind, LinkState};
use _core::queue::WaitPolicy;
use _core::rpc::{pb, ClientConfig, WorkerClient};
use _core::runtime::runtime;
use _core::worker::{JobReply, JobRequest, Pop, WorkerConfig, WorkerServer};

const TOKEN: &str = "scale-bench-token";
/// A pickle-shaped payload, as the worker checks.
const ECHO: &[u8] = b"\x80\x05\x8c\x04echo\x94.";
/// The smallest round.
const CLOSURES: usize = 20_000;
/// Pipelines' worth of closures per worker in a round of many workers.
const PIPELINES_PER_ROUND: usize = 5;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("serve") {
        let count = args[1].parse().expect("scale serve N");
        return serve(count);
    }
    let sizes: Vec<usize> = args
        .iter()
        .filter_map(|arg| arg.parse().ok())
        .collect::<Vec<_>>();
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs this binary without it,
    // as a smoke test of 10 workers.
    let benchmarking = args.iter().any(|arg| arg == "--bench");
    let sizes = match (sizes.is_empty(), benchmarking) {
        (false, _) => sizes,
        (true, true) => vec![10, 100, 1000],
        (true, false) => vec![10],
    };
    // A thousand connections need more than the common default of 1,024 open files.
    let _ = _core::rpc::server::connections::raise_file_limit();
    println!(
        "{:>8} {:>10} {:>8} {:>12} {:>10} {:>9} {:>14} {:>14} {:>16}",
        "workers",
        "ready",
        "round",
        "closures/s",
        "coord CPU",
        "threads",
        "idle RSS/wkr",
        "RSS/worker",
        "kill->detected"
    );
    for size in sizes {
        measure(size);
    }
}

/// The child: `count` echo workers; prints their addresses, one per line, then `ready`,
/// and serves until stdin closes.
fn serve(count: usize) {
    let _ = _core::rpc::server::connections::raise_file_limit();
    let stopping = Arc::new(AtomicBool::new(false));
    let mut servers = Vec::with_capacity(count);
    for index in 0..count {
        let config = WorkerConfig {
            address: "127.0.0.1:0".to_owned(),
            auth_token: Some(TOKEN.to_owned()),
            worker_index: i64::try_from(index).unwrap_or(0),
            platform: "cpu".to_owned(),
            ..WorkerConfig::default()
        };
        let server = Arc::new(
            runtime()
                .expect("runtime")
                .block_on(WorkerServer::start(config))
                .expect("worker starts"),
        );
        let executor = Arc::clone(&server);
        let stop = Arc::clone(&stopping);
        std::thread::Builder::new()
            .stack_size(64 * 1024)
            .spawn(move || echo(&executor, &stop))
            .expect("executor thread");
        println!("{}", server.local_addr());
        servers.push(server);
    }
    println!("ready");
    std::io::stdout().flush().expect("stdout");
    for line in std::io::stdin().lock().lines() {
        if line.is_err() {
            break;
        }
    }
    stopping.store(true, Ordering::Release);
}

/// Starts `count` workers in a child process; returns it and their addresses.
fn spawn_workers(count: usize) -> (Child, Vec<String>) {
    let exe = std::env::current_exe().expect("own path");
    let mut child = Command::new(exe)
        .args(["serve", &count.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("workers start");
    let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut addresses = Vec::with_capacity(count);
    for line in lines {
        let line = line.expect("worker output");
        if line == "ready" {
            break;
        }
        addresses.push(line);
    }
    assert_eq!(addresses.len(), count, "the child started every worker");
    (child, addresses)
}

fn echo(server: &WorkerServer, stopping: &AtomicBool) {
    while !stopping.load(Ordering::Acquire) {
        let job = match server.next_job(Duration::from_millis(200)) {
            Pop::Job(job) => job,
            Pop::Drained => return,
            Pop::Empty | Pop::Busy => continue,
        };
        let reply = match job.request().clone() {
            JobRequest::Run { args, .. } => JobReply::Run(
                pb::run_closure_response::Outcome::Result(args.unwrap_or_default()),
            ),
            JobRequest::CreateResource { resource_id, .. } => {
                JobReply::CreateResource(pb::CreateResourceResponse {
                    resource_id,
                    error: None,
                    reattached: false,
                })
            }
            JobRequest::ReleaseSession => {
                JobReply::ReleaseResource(pb::ReleaseResourceResponse { released: 0 })
            }
            JobRequest::ReleaseResource { resource_ids } => {
                JobReply::ReleaseResource(pb::ReleaseResourceResponse {
                    released: u32::try_from(resource_ids.len()).unwrap_or(u32::MAX),
                })
            }
        };
        job.reply(reply);
    }
}

/// CPU time (user + system) this process has used, from `/proc/self/stat` (clock ticks of
/// 10 ms on Linux).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of stat, 12 and 13 after the name and state.
    (ticks(11) + ticks(12)) / 100.0
}

/// A dispatcher over `addresses`, once every link is `up`.
fn connect(addresses: &[String]) -> Dispatcher {
    let started = Instant::now();
    let clients: Vec<WorkerClient> = {
        let _context = runtime().expect("runtime").enter();
        addresses
            .iter()
            .map(|address| {
                let mut config = ClientConfig::new(address.clone());
                config.auth_token = Some(TOKEN.to_owned());
                WorkerClient::connect_lazy(&config).expect("client")
            })
            .collect()
    };
    let config = DispatcherConfig {
        error_policy: _core::dispatch::ErrorPolicy::PerClosure,
        ..DispatcherConfig::default()
    };
    let dispatcher = Dispatcher::new(clients, config).expect("dispatcher");
    while !dispatcher
        .worker_statuses()
        .iter()
        .all(|worker| worker.state == LinkState::Up)
    {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "workers never all up"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    dispatcher
}

/// `(threads, resident KiB)` of this process.
fn process_usage() -> (usize, usize) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|value| value.parse().ok())
            .unwrap_or(0)
    };
    (field("Threads:"), field("VmRSS:"))
}

fn measure(size: usize) {
    let (mut rest, mut addresses) = spawn_workers(size - 1);
    let (mut lone, lone_address) = spawn_workers(1);
    let victim = size / 2;
    addresses.insert(victim, lone_address[0].clone());
    // The runtime exists before the baseline, as it would in a coordinator process.
    let _ = runtime().expect("runtime");
    let (threads_before, rss_before) = process_usage();

    let started = Instant::now();
    let dispatcher = connect(&addresses);
    let ready = started.elapsed();
    let (_, rss_idle) = process_usage();

    let hash = _core::rpc::content_hash(ECHO);
    dispatcher
        .register_function(&hash, FunctionKind::Cloudpickle, Bytes::from_static(ECHO))
        .expect("registers");
    let args = EncodedValue {
        pickle: Bytes::from_static(b"\x80\x05K\x01."),
        buffers: vec![],
    };
    let per_worker = PIPELINES_PER_ROUND * (1 + DispatcherConfig::default().pipeline_depth);
    let closures = CLOSURES.max(per_worker * size);
    let mut rates = Vec::new();
    let cpu_before = cpu_seconds();
    for _ in 0..3 {
        let round = Instant::now();
        for _ in 0..closures {
            dispatcher
                .schedule(&hash, args.clone(), &[])
                .expect("schedules");
        }
        let deadline = Instant::now() + Duration::from_secs(300);
        let joined = dispatcher.join(&mut WaitPolicy::until(Some(deadline)));
        assert!(matches!(joined, Ok(true)), "{joined:?}");
        #[allow(clippy::cast_precision_loss)]
        rates.push(closures as f64 / round.elapsed().as_secs_f64());
    }
    rates.sort_by(f64::total_cmp);
    #[allow(clippy::cast_precision_loss)]
    let cpu_per_closure = (cpu_seconds() - cpu_before) / (3 * closures) as f64;
    let (threads, rss) = process_usage();

    // SIGKILL one worker's process while closures run.
    let retried_before = dispatcher.metrics().retried;
    let cells: Vec<_> = (0..CLOSURES)
        .map(|_| {
            dispatcher
                .schedule(&hash, args.clone(), &[])
                .expect("schedules")
        })
        .collect();
    lone.kill().expect("SIGKILL");
    let killed = Instant::now();
    let detected = loop {
        if dispatcher.worker_statuses()[victim].state != LinkState::Up {
            break killed.elapsed();
        }
        assert!(
            killed.elapsed() < Duration::from_secs(60),
            "kill never noticed"
        );
        std::thread::sleep(Duration::from_millis(1));
    };
    let deadline = Instant::now() + Duration::from_secs(300);
    for cell in &cells {
        assert!(cell.wait(Some(deadline)), "a closure never ended");
    }
    let retried = dispatcher.metrics().retried - retried_before;

    #[allow(clippy::cast_precision_loss)]
    let per_worker = rss.saturating_sub(rss_before) as f64 / size as f64;
    #[allow(clippy::cast_precision_loss)]
    let idle_per_worker = rss_idle.saturating_sub(rss_before) as f64 / size as f64;
    println!(
        "{size:>8} {:>9.2}s {closures:>8} {:>12.0} {:>8.1}µs {:>9} {idle_per_worker:>10.1} KiB {:>10.1} KiB {:>9.0} ms ({retried} retried)",
        ready.as_secs_f64(),
        rates[1],
        cpu_per_closure * 1e6,
        threads - threads_before,
        per_worker,
        detected.as_secs_f64() * 1000.0,
    );
    dispatcher.shutdown();
    let _ = lone.wait();
    drop(rest.stdin.take());
    let _ = rest.wait();
}
