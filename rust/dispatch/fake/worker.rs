//! One fake worker: its state, and how it runs a closure.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use tokio::sync::watch;

use super::behaviour::{resource_ids, Behaviour};
use super::{lock, ClusterInner, FakeCall};
use crate::rpc::{pb, RpcError, HASH_LEN};

pub(super) struct State {
    up: bool,
    /// The last incarnation number handed out (the next restart gets one more).
    last_incarnation: u64,
    pub(super) functions: HashMap<[u8; HASH_LEN], Bytes>,
    /// Built resources: `None` built fine, `Some(error)` failed to build.
    pub(super) resources: HashMap<u64, Option<pb::ClosureError>>,
    running: u32,
    calls: Vec<FakeCall>,
    /// Closure ids received on streams, in arrival order (queued, whether or not they ran).
    received: Vec<u64>,
}

pub(crate) struct FakeWorker {
    pub(super) address: String,
    pub(super) state: Mutex<State>,
    /// The live incarnation, 0 while down: calls in flight end when it changes.
    incarnation: watch::Sender<u64>,
    /// `RunClosures` streams open on this worker (their emulation still running).
    pub(super) streams: std::sync::atomic::AtomicUsize,
    /// The next `RunClosures` call is never accepted (a worker frozen as it was called).
    pub(super) stall_next_stream: std::sync::atomic::AtomicBool,
    /// The Python version its `GetStatus` reports (empty: not reported, as older workers).
    pub(super) python_version: Mutex<String>,
    /// The slice its `GetStatus` reports (`None`: a worker of its own).
    pub(super) slice: Mutex<Option<pb::SliceMembership>>,
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
                received: Vec::new(),
            }),
            incarnation: watch::Sender::new(1),
            streams: std::sync::atomic::AtomicUsize::new(0),
            stall_next_stream: std::sync::atomic::AtomicBool::new(false),
            python_version: Mutex::new(String::new()),
            slice: Mutex::new(None),
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

    pub fn received(&self) -> Vec<u64> {
        lock(&self.state).received.clone()
    }

    pub(super) fn record_received(&self, closure_id: u64) {
        lock(&self.state).received.push(closure_id);
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
    pub(super) fn begin(
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

    pub(super) fn down(&self) -> RpcError {
        RpcError::Unavailable(format!(
            "fake worker {} is down (connection refused)",
            self.address
        ))
    }

    pub(super) fn function(&self, hash: &[u8]) -> Result<Behaviour, RpcError> {
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
pub(super) async fn died(mut live: watch::Receiver<u64>, incarnation: u64) {
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

pub(super) fn user_error(type_name: &str, message: String) -> pb::ClosureError {
    pb::ClosureError {
        kind: pb::ErrorKind::User.into(),
        type_name: type_name.to_owned(),
        module: "builtins".to_owned(),
        message,
        traceback: "Traceback (most recent call last):\n  (fake worker)\n".to_owned(),
        exception: None,
        resource_id: None,
        ps_task: None,
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
pub(super) async fn execute(
    cluster: Arc<ClusterInner>,
    index: usize,
    behaviour: Behaviour,
    request: pb::RunClosureRequest,
) -> pb::RunClosureResponse {
    let _running = Running::start(&cluster, index);
    let closure_id = request.closure_id;
    let attempt = cluster.record_execution(closure_id, index);
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
        Behaviour::PsFail { task, times } if attempt <= times => failed(
            pb::ClosureError {
                ps_task: Some(task),
                ..user_error(
                    "PSUnavailableError",
                    format!("parameter server task {task} is unavailable (fake)"),
                )
            },
            closure_id,
        ),
        Behaviour::Echo | Behaviour::CrashOn(_) | Behaviour::Crash | Behaviour::PsFail { .. } => {
            echo
        }
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
