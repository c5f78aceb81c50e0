//! One fake worker's state, and the transport that talks to it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::watch;

use super::behaviour::{resource_ids, Behaviour};
use super::{lock, ClusterInner, FakeCall};
use crate::dispatch::WorkerTransport;
use crate::rpc::{pb, RpcError, HASH_LEN};

struct State {
    up: bool,
    /// The last incarnation number handed out (the next restart gets one more).
    last_incarnation: u64,
    functions: HashMap<[u8; HASH_LEN], Bytes>,
    /// Built resources: `None` built fine, `Some(error)` failed to build.
    resources: HashMap<u64, Option<pb::ClosureError>>,
    running: u32,
    calls: Vec<FakeCall>,
}

pub(crate) struct FakeWorker {
    address: String,
    state: Mutex<State>,
    /// The live incarnation, 0 while down: calls in flight end when it changes.
    incarnation: watch::Sender<u64>,
}

impl FakeWorker {
    pub fn new(index: usize) -> Self {
        Self {
            address: format!("fake-worker-{index}:8470"),
            state: Mutex::new(State {
                up: true,
                last_incarnation: 1,
                functions: HashMap::new(),
                resources: HashMap::new(),
                running: 0,
                calls: Vec::new(),
            }),
            incarnation: watch::Sender::new(1),
        }
    }

    pub fn kill(&self) {
        let mut state = lock(&self.state);
        state.up = false;
        state.functions.clear();
        state.resources.clear();
        self.incarnation.send_replace(0);
    }

    pub fn restart(&self) {
        let mut state = lock(&self.state);
        if state.up {
            return;
        }
        state.up = true;
        state.last_incarnation += 1;
        self.incarnation.send_replace(state.last_incarnation);
    }

    pub fn forget_functions(&self) {
        lock(&self.state).functions.clear();
    }

    pub fn is_up(&self) -> bool {
        lock(&self.state).up
    }

    pub fn calls(&self) -> Vec<FakeCall> {
        lock(&self.state).calls.clone()
    }

    pub fn resource_ids(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = lock(&self.state).resources.keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    pub fn running(&self) -> u32 {
        lock(&self.state).running
    }

    /// Logs a call; fails it `UNAVAILABLE` if the worker is down, else returns the live
    /// incarnation and a receiver that sees the worker die.
    fn begin(
        &self,
        method: &'static str,
        subject: Option<u64>,
    ) -> Result<(u64, watch::Receiver<u64>), RpcError> {
        let mut state = lock(&self.state);
        let incarnation = if state.up { state.last_incarnation } else { 0 };
        state.calls.push(FakeCall {
            method,
            at: Instant::now(),
            incarnation,
            subject,
        });
        if !state.up {
            return Err(self.down());
        }
        Ok((incarnation, self.incarnation.subscribe()))
    }

    fn down(&self) -> RpcError {
        RpcError::Unavailable(format!(
            "fake worker {} is down (connection refused)",
            self.address
        ))
    }

    fn function(&self, hash: &[u8]) -> Result<Behaviour, RpcError> {
        let hash: [u8; HASH_LEN] = hash
            .try_into()
            .map_err(|_| RpcError::InvalidArgument(format!("hash of {} bytes", hash.len())))?;
        lock(&self.state)
            .functions
            .get(&hash)
            .map(|payload| Behaviour::parse(payload))
            .ok_or_else(|| RpcError::NotFound(format!("{} holds no such function", self.address)))
    }
}

/// Resolves when the worker's incarnation is no longer `incarnation` (it died).
async fn died(mut live: watch::Receiver<u64>, incarnation: u64) {
    let _ = live.wait_for(|now| *now != incarnation).await;
}

/// Counts a running execution for `GetStatus.inflight` until dropped.
struct Running(Arc<ClusterInner>, usize);

impl Running {
    fn start(cluster: &Arc<ClusterInner>, index: usize) -> Self {
        lock(&cluster.workers[index].state).running += 1;
        Self(Arc::clone(cluster), index)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        lock(&self.0.workers[self.1].state).running -= 1;
    }
}

fn user_error(type_name: &str, message: String) -> pb::ClosureError {
    pb::ClosureError {
        kind: pb::ErrorKind::User.into(),
        type_name: type_name.to_owned(),
        module: "builtins".to_owned(),
        message,
        traceback: "Traceback (most recent call last):\n  (fake worker)\n".to_owned(),
        exception: None,
        resource_id: None,
    }
}

fn failed(error: pb::ClosureError, closure_id: u64) -> pb::RunClosureResponse {
    pb::RunClosureResponse {
        closure_id,
        outcome: Some(pb::run_closure_response::Outcome::Error(error)),
    }
}

/// Runs a closure's behaviour on worker `index` (in its own task, so it keeps running
/// when the caller stops waiting, as on a real worker).
async fn execute(
    cluster: Arc<ClusterInner>,
    index: usize,
    behaviour: Behaviour,
    request: pb::RunClosureRequest,
) -> pb::RunClosureResponse {
    let _running = Running::start(&cluster, index);
    let closure_id = request.closure_id;
    cluster.record_execution(closure_id, index);
    let args = request.args.unwrap_or_default();
    let worker = &cluster.workers[index];
    for id in resource_ids(&args.pickle) {
        let held = lock(&worker.state).resources.get(&id).cloned();
        let cause = match held {
            Some(None) => continue,
            Some(Some(error)) => error,
            None => user_error(
                "KeyError",
                format!("resource {id} is not on {}", worker.address),
            ),
        };
        let error = pb::ClosureError {
            kind: pb::ErrorKind::Input.into(),
            resource_id: Some(id),
            ..cause
        };
        return failed(error, closure_id);
    }
    let echo = pb::RunClosureResponse {
        closure_id,
        outcome: Some(pb::run_closure_response::Outcome::Result(args)),
    };
    let raised = || {
        failed(
            user_error("ValueError", "raised on purpose".to_owned()),
            closure_id,
        )
    };
    match behaviour {
        Behaviour::Echo | Behaviour::CrashOn(_) => echo,
        Behaviour::Raise => raised(),
        Behaviour::Infra => failed(
            pb::ClosureError {
                kind: pb::ErrorKind::Infrastructure.into(),
                ..user_error("OSError", "the fake executor broke".to_owned())
            },
            closure_id,
        ),
        Behaviour::Sleep(pause) => {
            tokio::time::sleep(pause).await;
            echo
        }
        Behaviour::Gate(ref name) | Behaviour::GateRaise(ref name) => {
            let mut gate = cluster.gate(name);
            let _ = gate.wait_for(|open| *open).await;
            if matches!(behaviour, Behaviour::Gate(_)) {
                echo
            } else {
                raised()
            }
        }
        Behaviour::Resource | Behaviour::ResourceRaise | Behaviour::Unknown(_) => failed(
            user_error(
                "TypeError",
                format!("{behaviour:?} is not a closure function"),
            ),
            closure_id,
        ),
    }
}

/// A [`WorkerTransport`] to one fake worker.
#[derive(Clone)]
pub struct FakeTransport {
    cluster: Arc<ClusterInner>,
    index: usize,
}

impl FakeTransport {
    pub(crate) fn new(cluster: Arc<ClusterInner>, index: usize) -> Self {
        Self { cluster, index }
    }

    fn worker(&self) -> &FakeWorker {
        &self.cluster.workers[self.index]
    }

    /// Crashes the worker for a random pause, then restarts it (chaos only).
    fn crash(&self, down_for: (Duration, Duration)) {
        self.worker().kill();
        let pause =
            down_for.0 + (down_for.1.saturating_sub(down_for.0)).mul_f64(self.cluster.random());
        let this = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(pause).await;
            this.worker().restart();
        });
    }

    async fn run(
        &self,
        request: pb::RunClosureRequest,
    ) -> Result<pb::RunClosureResponse, RpcError> {
        let (incarnation, live) = self
            .worker()
            .begin("RunClosure", Some(request.closure_id))?;
        let behaviour = self.worker().function(&request.function_hash)?;
        let mut crash_after = None;
        if let Some(chaos) = self.cluster.chaos {
            if self.cluster.random() < chaos.crash_probability {
                if self.cluster.random() < 0.5 {
                    self.crash(chaos.down_for);
                    return Err(self.worker().down());
                }
                crash_after = Some(chaos.down_for);
            }
        }
        if behaviour == Behaviour::CrashOn(self.index) {
            self.cluster
                .record_execution(request.closure_id, self.index);
            self.worker().kill();
            return Err(self.worker().down());
        }
        let waits = matches!(
            behaviour,
            Behaviour::Sleep(_) | Behaviour::Gate(_) | Behaviour::GateRaise(_)
        );
        let response = if waits {
            // In its own task, so it keeps running when the caller stops waiting, as a
            // Python closure does on a real worker after the RPC's deadline.
            let task = tokio::spawn({
                let cluster = Arc::clone(&self.cluster);
                let index = self.index;
                let live = live.clone();
                async move {
                    tokio::select! {
                        response = execute(cluster, index, behaviour, request) => Some(response),
                        () = died(live, incarnation) => None,
                    }
                }
            });
            tokio::select! {
                response = task => response.ok().flatten(),
                () = died(live, incarnation) => None,
            }
        } else {
            // Instantaneous behaviours run inline: no task hand-off, so benchmarks measure
            // the dispatcher rather than the fake.
            Some(execute(Arc::clone(&self.cluster), self.index, behaviour, request).await)
        };
        if let Some(down_for) = crash_after {
            // The closure ran, but its worker died before answering.
            self.crash(down_for);
            return Err(self.worker().down());
        }
        response.ok_or_else(|| self.worker().down())
    }
}

/// Bounds `future` by `timeout` the way the real client does.
async fn bounded<T>(
    timeout: Option<Duration>,
    future: impl std::future::Future<Output = Result<T, RpcError>>,
) -> Result<T, RpcError> {
    match timeout {
        None => future.await,
        Some(limit) => tokio::time::timeout(limit, future)
            .await
            .unwrap_or_else(|_| {
                Err(RpcError::DeadlineExceeded(format!(
                    "no answer within {:.3} s",
                    limit.as_secs_f64()
                )))
            }),
    }
}

impl WorkerTransport for FakeTransport {
    fn address(&self) -> &str {
        &self.worker().address
    }

    async fn get_status(
        &self,
        timeout: Option<Duration>,
    ) -> Result<pb::GetStatusResponse, RpcError> {
        bounded(timeout, async {
            let (incarnation, _) = self.worker().begin("GetStatus", None)?;
            Ok(pb::GetStatusResponse {
                state: pb::ServingState::Serving.into(),
                worker_index: self.index as i64,
                jaxcluster_version: env!("CARGO_PKG_VERSION").to_owned(),
                platform: "fake".to_owned(),
                pid: incarnation,
                inflight: self.worker().running(),
                ..pb::GetStatusResponse::default()
            })
        })
        .await
    }

    async fn register_function(
        &self,
        request: pb::RegisterFunctionRequest,
        timeout: Option<Duration>,
    ) -> Result<pb::RegisterFunctionResponse, RpcError> {
        bounded(timeout, async {
            self.worker().begin("RegisterFunction", None)?;
            let hash: [u8; HASH_LEN] = request.function_hash.as_ref().try_into().map_err(|_| {
                RpcError::InvalidArgument("function_hash is not 32 bytes".to_owned())
            })?;
            let mut state = lock(&self.worker().state);
            let already_registered = state.functions.insert(hash, request.payload).is_some();
            Ok(pb::RegisterFunctionResponse { already_registered })
        })
        .await
    }

    async fn run_closure(
        &self,
        request: pb::RunClosureRequest,
        timeout: Option<Duration>,
    ) -> Result<pb::RunClosureResponse, RpcError> {
        bounded(timeout, self.run(request)).await
    }

    async fn create_resource(
        &self,
        request: pb::CreateResourceRequest,
        timeout: Option<Duration>,
    ) -> Result<pb::CreateResourceResponse, RpcError> {
        bounded(timeout, async {
            let id = request.resource_id;
            self.worker().begin("CreateResource", Some(id))?;
            let behaviour = self.worker().function(&request.function_hash)?;
            let error = match behaviour {
                Behaviour::ResourceRaise | Behaviour::Raise => Some(user_error(
                    "RuntimeError",
                    format!("resource {id} failed to build on purpose"),
                )),
                _ => None,
            };
            lock(&self.worker().state)
                .resources
                .insert(id, error.clone());
            Ok(pb::CreateResourceResponse {
                resource_id: id,
                error,
            })
        })
        .await
    }

    async fn release_resource(
        &self,
        resource_ids: Vec<u64>,
        timeout: Option<Duration>,
    ) -> Result<u32, RpcError> {
        bounded(timeout, async {
            self.worker()
                .begin("ReleaseResource", resource_ids.first().copied())?;
            let mut state = lock(&self.worker().state);
            let released = resource_ids
                .iter()
                .filter(|id| state.resources.remove(id).is_some())
                .count();
            Ok(released as u32)
        })
        .await
    }
}
