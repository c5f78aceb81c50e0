//! In-process tests of the worker service: a real tonic server on 127.0.0.1:0, the real
//! client, and a small Rust executor thread standing in for Python's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;

use super::*;
use crate::rpc::{content_hash, ClientConfig, RpcError, WorkerClient};

mod leases;
mod reads;
mod streams;

const TOKEN: &str = "test-token";
/// A function payload the test executor answers with a user error instead of an echo.
const RAISE: &[u8] = b"\x80\x05\x8c\x05raise\x94.";

/// Answers Run jobs by echoing the argument pickle (or failing, for [`RAISE`]); `gate`
/// holds each run while closed, so tests can keep a closure in flight.
fn spawn_echo_executor(server: Arc<WorkerServer>, gate: Arc<AtomicBool>) -> JoinHandle<usize> {
    std::thread::spawn(move || {
        let mut ran = 0;
        loop {
            match server.next_job(Duration::from_millis(20)) {
                Pop::Job(job) => {
                    let reply = match job.request().clone() {
                        JobRequest::Run { args, function, .. } => {
                            while !gate.load(Ordering::Acquire) {
                                std::thread::yield_now();
                            }
                            ran += 1;
                            let outcome = if function.payload.as_ref() == RAISE {
                                pb::run_closure_response::Outcome::Error(pb::ClosureError {
                                    kind: pb::ErrorKind::User.into(),
                                    type_name: "ValueError".into(),
                                    module: "builtins".into(),
                                    message: "raised on purpose".into(),
                                    ..pb::ClosureError::default()
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
                Pop::Drained => return ran,
                Pop::Empty | Pop::Busy => {}
            }
        }
    })
}

struct Harness {
    server: Arc<WorkerServer>,
    executor: Option<JoinHandle<usize>>,
    gate: Arc<AtomicBool>,
}

impl Harness {
    async fn start(config: WorkerConfig) -> Self {
        let server = Arc::new(WorkerServer::start(config).await.unwrap());
        let gate = Arc::new(AtomicBool::new(true));
        let executor = Some(spawn_echo_executor(Arc::clone(&server), Arc::clone(&gate)));
        Self {
            server,
            executor,
            gate,
        }
    }

    fn client(&self, token: Option<&str>) -> WorkerClient {
        let mut config = ClientConfig::new(self.server.local_addr().to_string());
        config.auth_token = token.map(str::to_owned);
        WorkerClient::connect_lazy(&config).unwrap()
    }

    async fn stop(mut self) -> usize {
        self.server.begin_shutdown();
        let executor = self.executor.take().unwrap();
        let ran = tokio::task::spawn_blocking(move || executor.join().unwrap())
            .await
            .unwrap();
        self.server.stop_serving().unwrap().await.unwrap().unwrap();
        ran
    }
}

fn config() -> WorkerConfig {
    WorkerConfig {
        auth_token: Some(TOKEN.to_owned()),
        worker_index: 3,
        devices: vec![pb::Device {
            name: "/job:worker/replica:0/task:3/device:CPU:0".into(),
            device_type: "CPU".into(),
        }],
        ..WorkerConfig::default()
    }
}

const PICKLED_ONE: &[u8] = b"\x80\x05K\x01.";

fn register_request(payload: &'static [u8]) -> pb::RegisterFunctionRequest {
    pb::RegisterFunctionRequest {
        function_hash: Bytes::copy_from_slice(&content_hash(payload)),
        kind: pb::FunctionKind::Cloudpickle.into(),
        payload: Bytes::from_static(payload),
    }
}

fn run_request(hash: &[u8], args: &'static [u8]) -> pb::RunClosureRequest {
    pb::RunClosureRequest {
        function_hash: Bytes::copy_from_slice(hash),
        args: Some(pb::Value {
            pickle: Bytes::from_static(args),
            buffers: vec![Bytes::from_static(b"buffer")],
        }),
        closure_id: 42,
        worker_index: None,
        preemption_save: false,
        keep_result_id: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_devices_and_a_closure_round_trip() {
    let harness = Harness::start(config()).await;
    let client = harness.client(Some(TOKEN));
    let status = client.get_status(None).await.unwrap();
    assert_eq!(status.worker_index, 3);
    assert_eq!(status.state(), pb::ServingState::Serving);
    let devices = client.list_devices(None).await.unwrap();
    assert_eq!(devices[0].device_type, "CPU");

    let first = client
        .register_function(register_request(PICKLED_ONE), None)
        .await;
    assert!(!first.unwrap().already_registered);
    let again = client
        .register_function(register_request(PICKLED_ONE), None)
        .await;
    assert!(again.unwrap().already_registered);

    let hash = content_hash(PICKLED_ONE);
    let response = client
        .run_closure(run_request(&hash, b"\x80\x05K\x07."), None)
        .await;
    let response = response.unwrap();
    assert_eq!(response.closure_id, 42);
    let Some(pb::run_closure_response::Outcome::Result(value)) = response.outcome else {
        panic!("expected a result, got {response:?}");
    };
    assert_eq!(&value.pickle[..], b"\x80\x05K\x07.");
    assert_eq!(value.buffers, vec![Bytes::from_static(b"buffer")]);

    let status = client.get_status(None).await.unwrap();
    assert_eq!((status.functions_registered, status.closures_run), (1, 1));
    assert_eq!(harness.stop().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_or_wrong_token_is_refused_and_runs_nothing() {
    let harness = Harness::start(config()).await;
    let hash = content_hash(PICKLED_ONE);
    for token in [None, Some("wrong"), Some("test-token2")] {
        let client = harness.client(token);
        let e = client
            .register_function(register_request(PICKLED_ONE), None)
            .await;
        assert!(
            matches!(e, Err(RpcError::Unauthenticated(_))),
            "{token:?}: {e:?}"
        );
        let e = client
            .run_closure(run_request(&hash, PICKLED_ONE), None)
            .await;
        assert!(
            matches!(e, Err(RpcError::Unauthenticated(_))),
            "{token:?}: {e:?}"
        );
        let e = client.get_status(None).await;
        assert!(
            matches!(e, Err(RpcError::Unauthenticated(_))),
            "{token:?}: {e:?}"
        );
    }
    let status = harness.client(Some(TOKEN)).get_status(None).await.unwrap();
    assert_eq!(status.functions_registered, 0);
    assert_eq!(status.closures_run, 0);
    assert_eq!(status.unauthenticated_requests, 9);
    assert_eq!(harness.stop().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_are_invalid_and_unknown_hashes_not_found() {
    let harness = Harness::start(config()).await;
    let client = harness.client(Some(TOKEN));

    let mut short_hash = register_request(PICKLED_ONE);
    short_hash.function_hash = Bytes::from_static(b"abc");
    let e = client
        .register_function(short_hash, None)
        .await
        .unwrap_err();
    assert!(matches!(e, RpcError::InvalidArgument(_)), "{e:?}");
    assert!(e.message().contains("is 3 bytes"), "{e}");

    let garbage = client
        .register_function(register_request(b"garbage!"), None)
        .await;
    assert!(
        matches!(garbage, Err(RpcError::InvalidArgument(_))),
        "{garbage:?}"
    );

    let mut unspecified = register_request(PICKLED_ONE);
    unspecified.kind = 0;
    let e = client
        .register_function(unspecified, None)
        .await
        .unwrap_err();
    assert!(matches!(e, RpcError::InvalidArgument(_)), "{e:?}");

    // A malformed hash is INVALID_ARGUMENT even though it is also unknown.
    let e = client
        .run_closure(run_request(b"short", PICKLED_ONE), None)
        .await;
    assert!(matches!(e, Err(RpcError::InvalidArgument(_))), "{e:?}");
    let e = client
        .run_closure(run_request(&[9; 32], b"not a pickle"), None)
        .await;
    assert!(matches!(e, Err(RpcError::InvalidArgument(_))), "{e:?}");
    let e = client
        .run_closure(run_request(&[9; 32], PICKLED_ONE), None)
        .await;
    let e = e.unwrap_err();
    assert!(matches!(e, RpcError::NotFound(_)), "{e:?}");
    assert!(e.message().contains("0x0909"), "{e}");

    let status = client.get_status(None).await.unwrap();
    assert_eq!(status.rejected_requests, 6);
    assert_eq!(status.closures_run, 0);
    assert_eq!(harness.stop().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_requests_are_resource_exhausted_and_the_worker_keeps_serving() {
    let harness = Harness::start(WorkerConfig {
        max_message_bytes: 4096,
        ..config()
    })
    .await;
    let client = harness.client(Some(TOKEN));
    client
        .register_function(register_request(PICKLED_ONE), None)
        .await
        .unwrap();
    let mut request = run_request(&content_hash(PICKLED_ONE), PICKLED_ONE);
    request.args.as_mut().unwrap().buffers = vec![Bytes::from(vec![0u8; 10_000])];
    let e = client.run_closure(request, None).await.unwrap_err();
    assert!(matches!(e, RpcError::ResourceExhausted(_)), "{e:?}");
    assert!(e.message().contains("size limit"), "{e}");

    let small = run_request(&content_hash(PICKLED_ONE), PICKLED_ONE);
    assert!(client.run_closure(small, None).await.is_ok());
    assert_eq!(harness.stop().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_finishes_the_inflight_closure_and_refuses_new_ones() {
    let harness = Harness::start(config()).await;
    harness.gate.store(false, Ordering::Release);
    let client = harness.client(Some(TOKEN));
    client
        .register_function(register_request(PICKLED_ONE), None)
        .await
        .unwrap();
    let hash = content_hash(PICKLED_ONE);
    let inflight = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .run_closure(run_request(&hash, PICKLED_ONE), None)
                .await
        }
    });
    // Wait (with a deadline) until the executor holds the closure.
    let deadline = Instant::now() + Duration::from_secs(10);
    while harness.server.status().inflight == 0 {
        assert!(Instant::now() < deadline, "the closure never started");
        tokio::task::yield_now().await;
    }
    assert!(harness.server.begin_shutdown());
    assert_eq!(
        client.get_status(None).await.unwrap().state(),
        pb::ServingState::Draining
    );
    let refused = client
        .run_closure(run_request(&hash, PICKLED_ONE), None)
        .await;
    assert!(
        matches!(refused, Err(RpcError::Unavailable(_))),
        "{refused:?}"
    );
    assert!(!harness.server.wait_idle(Duration::from_millis(1)));

    harness.gate.store(true, Ordering::Release);
    let finished = inflight.await.unwrap().unwrap();
    assert_eq!(finished.closure_id, 42);
    assert_eq!(harness.stop().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_loopback_bind_needs_a_token() {
    let refused = WorkerServer::start(WorkerConfig {
        address: "0.0.0.0:0".into(),
        ..WorkerConfig::default()
    })
    .await;
    let Err(WorkerError::Config(message)) = refused else {
        panic!("expected a config error");
    };
    assert!(message.contains("without an auth token"), "{message}");

    let bad_limit = WorkerServer::start(WorkerConfig {
        max_message_bytes: 1,
        ..WorkerConfig::default()
    })
    .await;
    assert!(matches!(bad_limit, Err(WorkerError::Config(_))));
}
