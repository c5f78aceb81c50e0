//! The dispatcher against real tonic worker servers on 127.0.0.1, each with a small Rust
//! executor thread standing in for the Python one.

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::*;
use crate::dispatch::LinkState;
use crate::rpc::{pb, ClientConfig, WorkerClient};
use crate::runtime::runtime;
use crate::worker::{JobReply, JobRequest, Pop, WorkerConfig, WorkerServer};

const TOKEN: &str = "dispatch-test-token";
/// Pickle-shaped payloads (protocol 5 opening, STOP at the end), as the worker checks.
const ECHO: &[u8] = b"\x80\x05\x8c\x04echo\x94.";
const RAISE: &[u8] = b"\x80\x05\x8c\x05raise\x94.";
const SLOW: &[u8] = b"\x80\x05\x8c\x04slow\x94.";

/// A running worker server and its executor thread; `ran` logs the closure ids it ran.
struct RealWorker {
    server: Arc<WorkerServer>,
    executor: Option<JoinHandle<()>>,
    ran: Arc<Mutex<Vec<u64>>>,
}

impl RealWorker {
    fn start(address: &str) -> Self {
        let config = WorkerConfig {
            address: address.to_owned(),
            auth_token: Some(TOKEN.to_owned()),
            platform: "cpu".to_owned(),
            ..WorkerConfig::default()
        };
        // A restarted worker rebinds its old port, which the OS may hold for a moment.
        let give_up = Instant::now() + PATIENCE;
        let server = loop {
            match runtime()
                .unwrap()
                .block_on(WorkerServer::start(config.clone()))
            {
                Ok(server) => break Arc::new(server),
                Err(error) if Instant::now() < give_up => {
                    eprintln!("retrying bind: {error}");
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(error) => panic!("worker did not start: {error}"),
            }
        };
        let ran = Arc::new(Mutex::new(Vec::new()));
        let executor = {
            let server = Arc::clone(&server);
            let ran = Arc::clone(&ran);
            std::thread::spawn(move || execute_jobs(&server, &ran))
        };
        Self {
            server,
            executor: Some(executor),
            ran,
        }
    }

    fn address(&self) -> String {
        self.server.local_addr().to_string()
    }

    fn ran(&self) -> Vec<u64> {
        self.ran.lock().unwrap().clone()
    }

    /// Shuts the worker down the way SIGTERM does, and closes its port.
    fn stop(mut self) {
        self.server.begin_shutdown();
        if let Some(executor) = self.executor.take() {
            executor.join().unwrap();
        }
        if let Some(serving) = self.server.stop_serving() {
            let _ = runtime().unwrap().block_on(serving);
        }
    }
}

fn execute_jobs(server: &WorkerServer, ran: &Mutex<Vec<u64>>) {
    loop {
        let job = match server.next_job(Duration::from_millis(20)) {
            Pop::Job(job) => job,
            Pop::Drained => return,
            Pop::Empty | Pop::Busy => continue,
        };
        let reply = match job.request().clone() {
            JobRequest::Run {
                closure_id,
                function,
                args,
                ..
            } => {
                ran.lock().unwrap().push(closure_id);
                if function.payload.as_ref() == SLOW {
                    std::thread::sleep(Duration::from_millis(400));
                }
                let outcome = if function.payload.as_ref() == RAISE {
                    pb::run_closure_response::Outcome::Error(pb::ClosureError {
                        kind: pb::ErrorKind::User.into(),
                        type_name: "ZeroDivisionError".into(),
                        module: "builtins".into(),
                        message: "division by zero".into(),
                        traceback: "Traceback (most recent call last): ...".into(),
                        exception: None,
                        resource_id: None,
                        ps_task: None,
                    })
                } else {
                    pb::run_closure_response::Outcome::Result(args.unwrap_or_default())
                };
                JobReply::Run(outcome)
            }
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
                    released: resource_ids.len() as u32,
                })
            }
        };
        job.reply(reply);
    }
}

fn clients(addresses: &[String], token: &str) -> Vec<WorkerClient> {
    let _context = runtime().unwrap().enter();
    addresses
        .iter()
        .map(|address| {
            let mut config = ClientConfig::new(address.clone());
            config.auth_token = Some(token.to_owned());
            config.connect_timeout = Duration::from_secs(2);
            WorkerClient::connect_lazy(&config).unwrap()
        })
        .collect()
}

fn register(dispatcher: &Dispatcher, payload: &'static [u8]) -> [u8; 32] {
    let hash = crate::rpc::content_hash(payload);
    dispatcher
        .register_function(
            &hash,
            FunctionKind::Cloudpickle,
            Bytes::from_static(payload),
        )
        .unwrap();
    hash
}

fn pickled(n: u8) -> EncodedValue {
    EncodedValue {
        pickle: Bytes::from(vec![0x80, 0x05, b'K', n, b'.']),
        buffers: vec![Bytes::from(vec![n; 64])],
    }
}

#[test]
fn closures_run_on_real_workers_over_grpc() {
    let workers = [
        RealWorker::start("127.0.0.1:0"),
        RealWorker::start("127.0.0.1:0"),
    ];
    let addresses: Vec<String> = workers.iter().map(RealWorker::address).collect();
    let dispatcher = Dispatcher::new(clients(&addresses, TOKEN), fast_config()).unwrap();
    let echo = register(&dispatcher, ECHO);
    let raise = register(&dispatcher, RAISE);
    let cells: Vec<_> = (0..20u8)
        .map(|n| dispatcher.schedule(&echo, pickled(n), &[]).unwrap())
        .collect();
    for (n, cell) in (0..20u8).zip(&cells) {
        assert_eq!(value(cell), pickled(n));
    }
    // Scheduled after the echoes ended: under cancel_all its failure cancels whatever is
    // still queued or not started, which on a loaded machine could be some of them.
    let failing = dispatcher.schedule(&raise, pickled(0), &[]).unwrap();
    let error = failure(&failing);
    assert_eq!(
        (error.kind, error.type_name.as_str()),
        (FailureKind::User, "ZeroDivisionError")
    );
    assert!(addresses.contains(&error.worker));
    let ran: usize = workers.iter().map(|w| w.ran().len()).sum();
    assert_eq!(ran, 21);
    // A link may still be connecting if the other worker ran everything (a loaded machine).
    wait_until("both links are up", || {
        dispatcher
            .worker_statuses()
            .iter()
            .all(|s| s.state == LinkState::Up)
    });
    let statuses = dispatcher.worker_statuses();
    assert_eq!(statuses[0].status.as_ref().unwrap().platform, "cpu");
    dispatcher.shutdown();
    for worker in workers {
        worker.stop();
    }
}

#[test]
fn a_stopped_worker_is_routed_around_and_used_again_after_it_restarts() {
    let first = RealWorker::start("127.0.0.1:0");
    let second = RealWorker::start("127.0.0.1:0");
    let addresses = vec![first.address(), second.address()];
    let dispatcher = Dispatcher::new(clients(&addresses, TOKEN), fast_config()).unwrap();
    let echo = register(&dispatcher, ECHO);
    wait_until("both links are up", || {
        dispatcher
            .worker_statuses()
            .iter()
            .all(|s| s.state == LinkState::Up)
    });
    first.stop();
    let cells: Vec<_> = (0..10u8)
        .map(|n| dispatcher.schedule(&echo, pickled(n), &[]).unwrap())
        .collect();
    for (n, cell) in (0..10u8).zip(&cells) {
        assert_eq!(value(cell), pickled(n));
    }
    assert_eq!(second.ran().len(), 10);

    let first = RealWorker::start(&addresses[0]);
    wait_until("worker 0 is up again", || {
        dispatcher.worker_statuses()[0].state == LinkState::Up
    });
    second.stop();
    let cell = dispatcher.schedule(&echo, pickled(99), &[]).unwrap();
    assert_eq!(value(&cell), pickled(99));
    assert_eq!(first.ran(), [cell.id()]);
    // The new worker process got the function again.
    assert_eq!(first.server.status().functions_registered, 1);
    assert!(dispatcher.metrics().worker_failures >= 1);
    dispatcher.shutdown();
    first.stop();
}

#[test]
fn a_wrong_token_fails_closures_with_unauthenticated() {
    let worker = RealWorker::start("127.0.0.1:0");
    let addresses = vec![worker.address()];
    let dispatcher = Dispatcher::new(clients(&addresses, "wrong-token"), fast_config()).unwrap();
    let echo = register(&dispatcher, ECHO);
    let cell = dispatcher.schedule(&echo, pickled(1), &[]).unwrap();
    let error = failure(&cell);
    assert_eq!(error.kind, FailureKind::Infra(Code::Unauthenticated));
    assert_eq!(error.type_name, "UnauthenticatedError");
    assert!(
        worker.ran().is_empty(),
        "nothing ran without the right token"
    );
    dispatcher.shutdown();
    worker.stop();
}

#[test]
fn a_closure_the_worker_times_out_is_retried_once_then_fails_deadline_exceeded() {
    let worker = RealWorker::start("127.0.0.1:0");
    let config = DispatcherConfig {
        closure_timeout: Some(Duration::from_millis(100)),
        ..fast_config()
    };
    let dispatcher = Dispatcher::new(clients(&[worker.address()], TOKEN), config).unwrap();
    let slow = register(&dispatcher, SLOW);
    let cell = dispatcher.schedule(&slow, pickled(1), &[]).unwrap();
    let error = failure(&cell);
    assert_eq!(
        error.kind,
        FailureKind::Infra(Code::DeadlineExceeded),
        "{error}"
    );
    assert!(error.message.contains(&worker.address()), "{error}");
    // Retried once, after the worker had finished the first attempt.
    assert_eq!(worker.ran(), [cell.id(), cell.id()]);
    assert_eq!(dispatcher.metrics().retried, 1);
    dispatcher.shutdown();
    worker.stop();
}

#[test]
fn a_draining_worker_finishes_its_running_closure_and_hands_back_the_queued_ones() {
    let workers = [
        RealWorker::start("127.0.0.1:0"),
        RealWorker::start("127.0.0.1:0"),
    ];
    let addresses: Vec<String> = workers.iter().map(RealWorker::address).collect();
    let dispatcher = Dispatcher::new(clients(&addresses, TOKEN), fast_config()).unwrap();
    let slow = register(&dispatcher, SLOW);
    wait_until("both links are up", || {
        dispatcher
            .worker_statuses()
            .iter()
            .all(|s| s.state == LinkState::Up)
    });
    let cells: Vec<_> = (0..12u8)
        .map(|n| dispatcher.schedule(&slow, pickled(n), &[]).unwrap())
        .collect();
    // Some worker runs one closure with more queued behind it (pipelined): drain it.
    let mut draining = None;
    wait_until("closures are pipelined on a worker", || {
        draining = workers.iter().position(|w| {
            let status = w.server.status();
            status.inflight == 1 && status.queued >= 1
        });
        draining.is_some()
    });
    let draining = draining.unwrap_or_default();
    assert!(workers[draining].server.begin_shutdown());
    for (n, cell) in (0..12u8).zip(&cells) {
        assert_eq!(value(cell), pickled(n));
    }
    // Every closure ran exactly once: the running one finished on the draining worker,
    // the queued ones were refused there unrun and ran on the other.
    let mut ran: Vec<u64> = workers.iter().flat_map(RealWorker::ran).collect();
    ran.sort_unstable();
    let mut ids: Vec<u64> = cells.iter().map(|cell| cell.id()).collect();
    ids.sort_unstable();
    assert_eq!(ran, ids);
    assert!(dispatcher.metrics().worker_failures >= 1);
    dispatcher.shutdown();
    for worker in workers {
        worker.stop();
    }
}

#[test]
fn a_preempted_worker_gets_nothing_more_and_its_queued_closures_run_elsewhere_uncharged() {
    let workers = [
        RealWorker::start("127.0.0.1:0"),
        RealWorker::start("127.0.0.1:0"),
    ];
    let addresses: Vec<String> = workers.iter().map(RealWorker::address).collect();
    let mut config = fast_config();
    config.max_closure_retries = Some(0);
    let dispatcher = Dispatcher::new(clients(&addresses, TOKEN), config).unwrap();
    let slow = register(&dispatcher, SLOW);
    wait_until("both links are up", || {
        dispatcher
            .worker_statuses()
            .iter()
            .all(|s| s.state == LinkState::Up)
    });
    let cells: Vec<_> = (0..12u8)
        .map(|n| dispatcher.schedule(&slow, pickled(n), &[]).unwrap())
        .collect();
    let mut preempted = None;
    wait_until("closures are pipelined on a worker", || {
        preempted = workers.iter().position(|w| {
            let status = w.server.status();
            status.inflight == 1 && status.queued >= 1
        });
        preempted.is_some()
    });
    let preempted = preempted.unwrap_or_default();
    let deadline = crate::rpc::unix_now() + 30.0;
    let notices = Arc::new(crate::dispatch::CellWatch::default());
    dispatcher.watch_preemptions(&notices);
    assert!(workers[preempted]
        .server
        .preempt("gce", deadline, "instance/preempted=TRUE"));
    // The watch wakes once the link acted on the notice, which its status then shows.
    let started = Instant::now();
    let mut never = || false;
    let woken = notices.wait_interruptible(Some(started + PATIENCE), Duration::MAX, &mut never);
    assert_eq!(woken, Ok(vec![]));
    assert!(
        started.elapsed() < PATIENCE,
        "the preemption watch never woke"
    );
    assert!(dispatcher.worker_statuses()[preempted].preemption.is_some());
    assert!(!workers[preempted].server.preempt("signal", 0.0, "SIGTERM"));
    let status = workers[preempted].server.status();
    assert_eq!(status.state(), pb::ServingState::Preempting);
    assert_eq!(status.preemption.map(|n| n.source), Some("gce".to_owned()));
    wait_until("the link saw the notice", || {
        dispatcher.worker_statuses()[preempted]
            .preemption
            .as_ref()
            .is_some_and(|n| n.source == "gce" && (n.deadline_unix_seconds - deadline).abs() < 1e-6)
    });
    let ran_before = workers[preempted].ran().len();
    for (n, cell) in (0..12u8).zip(&cells) {
        assert_eq!(value(cell), pickled(n));
    }
    // Nothing started there after the notice but the closure already running, and every
    // closure ran exactly once; none was charged (max_closure_retries=0) or counted a retry.
    assert!(workers[preempted].ran().len() <= ran_before + 1);
    let mut ran: Vec<u64> = workers.iter().flat_map(RealWorker::ran).collect();
    ran.sort_unstable();
    let mut ids: Vec<u64> = cells.iter().map(|cell| cell.id()).collect();
    ids.sort_unstable();
    assert_eq!(ran, ids);
    let metrics = dispatcher.metrics();
    assert_eq!(metrics.failed, 0);
    assert_eq!(metrics.retried, 0);
    assert_eq!(metrics.preemptions.get("gce"), Some(&1));
    dispatcher.shutdown();
    for worker in workers {
        worker.stop();
    }
}
