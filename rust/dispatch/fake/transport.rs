//! [`FakeTransport`]: the [`WorkerTransport`] that talks to one fake worker.

use std::sync::Arc;
use std::time::Duration;

use super::behaviour::Behaviour;
use super::stream;
use super::worker::{died, execute, user_error, FakeWorker};
use super::{lock, ClusterInner};
use crate::dispatch::WorkerTransport;
use crate::rpc::wire::limits::DEFAULT_MAX_MESSAGE_BYTES;
use crate::rpc::{pb, ClosureChannel, RpcError, HASH_LEN};

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

    pub(super) fn worker(&self) -> &FakeWorker {
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

    /// The error of a call to this worker while it is down.
    pub(super) fn down(&self) -> RpcError {
        self.worker().down()
    }

    /// Runs one closure as the worker's executor would; `Err` is what unary `RunClosure`
    /// would fail with (`UNAVAILABLE` when the worker is or goes down).
    pub(super) async fn run(
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
        if behaviour == Behaviour::CrashOn(self.index) || behaviour == Behaviour::Crash {
            self.cluster
                .record_execution(request.closure_id, self.index);
            self.worker().kill();
            if behaviour == Behaviour::Crash {
                self.worker().restart();
            }
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
                // As in a container, every incarnation is pid 1: only `incarnation` tells
                // a restart (unless the cluster plays workers too old to report one).
                pid: if self.cluster.pid_only {
                    incarnation
                } else {
                    1
                },
                incarnation: if self.cluster.pid_only {
                    0
                } else {
                    incarnation
                },
                inflight: self.worker().running(),
                python_version: super::lock(&self.worker().python_version).clone(),
                slice: *super::lock(&self.worker().slice),
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

    fn max_message_bytes(&self) -> usize {
        DEFAULT_MAX_MESSAGE_BYTES
    }

    async fn run_closures(
        &self,
        first: pb::RunClosuresRequest,
    ) -> Result<ClosureChannel, RpcError> {
        let (incarnation, live) = self.worker().begin("RunClosures", None)?;
        if self
            .worker()
            .stall_next_stream
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            // Until the test opens gate `streams` (never, for most).
            let mut gate = self.cluster.gate("streams");
            let _ = gate.wait_for(|open| *open).await;
        }
        Ok(stream::open(self, incarnation, live, first))
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
                reattached: false,
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

    async fn read_value(
        &self,
        value_id: u64,
        timeout: Option<Duration>,
    ) -> Result<pb::Value, RpcError> {
        bounded(timeout, async {
            self.worker().begin("ReadValue", Some(value_id))?;
            match lock(&self.worker().state).resources.get(&value_id) {
                Some(None) => Ok(pb::Value {
                    pickle: format!("value {value_id}").into_bytes().into(),
                    buffers: Vec::new(),
                }),
                _ => Err(RpcError::NotFound(format!(
                    "fake worker {} holds no value {value_id}",
                    self.index
                ))),
            }
        })
        .await
    }
}
