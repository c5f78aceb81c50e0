//! The tonic `ParameterServer` service: decode and check a request, run it on the store,
//! count it. Handlers never touch Python.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use prost::Message;
use tonic::{Request, Response, Status, Streaming};

use super::dtype::Op;
use super::sessions::{PsSessions, Room};
use super::store::{StoreError, Updated, VariableStore};
use super::tensor::TensorView;
use crate::rpc::server::connections::{connection_info, ConnectionInfo};
use crate::rpc::server::sessions::{Release, SessionRegistry};
use crate::rpc::wire::chunks;
use crate::rpc::wire::limits::too_large;
use crate::rpc::wire::session::SessionId;
use crate::rpc::{pb, PROTOCOL_REVISION};

/// Monotonic counters reported by `GetStatus`.
#[derive(Debug, Default)]
pub struct PsStats {
    /// Variables read (`Read`, each item of `ReadMany`).
    pub reads: AtomicU64,
    /// Updates applied (each item of `AssignMany` counts once).
    pub updates: AtomicU64,
    /// Variables created.
    pub variables_created: AtomicU64,
    /// Requests refused for a missing or wrong token (shared with the auth check).
    pub unauthenticated: Arc<AtomicU64>,
    /// Requests refused as malformed, mismatched, unknown or oversized.
    pub rejected: AtomicU64,
    /// Tensor bytes sent in answers (reads, `read_value` of updates).
    pub bytes_read: AtomicU64,
    /// Tensor bytes received in updates and new variables.
    pub bytes_written: AtomicU64,
}

/// State shared by the service and the server handle.
pub struct PsShared {
    /// `--index` of this ps task.
    pub ps_index: i64,
    /// Random per process; tells a restarted ps from the one before.
    pub incarnation: u64,
    /// Largest request or response, in bytes.
    pub max_message_bytes: usize,
    /// The variables, one store per session.
    pub sessions: Arc<PsSessions>,
    /// When each session's variables are released (clean end, or vanished past the ttl).
    pub registry: Arc<SessionRegistry>,
    /// Counters.
    pub stats: PsStats,
    /// When the server started.
    pub started: Instant,
    /// Connections admitted and dropped (shared with the accept loop).
    pub connections: Arc<crate::rpc::server::connections::ConnectionStats>,
}

fn count(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

impl PsShared {
    /// The `GetStatus` answer right now.
    pub fn status(&self) -> pb::PsStatusResponse {
        let (variables, bytes) = self.sessions.usage();
        let connected: std::collections::HashMap<SessionId, u32> = self
            .registry
            .snapshot()
            .into_iter()
            .map(|tracked| (tracked.id, tracked.connections))
            .collect();
        let sessions = self
            .sessions
            .held()
            .into_iter()
            .map(|held| {
                use crate::rpc::server::sessions::{session_held, Held};
                let values = held.variables as u64;
                let owned = Held {
                    values,
                    bytes: held.bytes as u64,
                    named: values > 0,
                };
                let connections = connected.get(&held.session).copied().unwrap_or(0);
                session_held(&held.session, owned, connections, held.idle)
            })
            .collect();
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        pb::PsStatusResponse {
            ps_index: self.ps_index,
            jaxcluster_version: env!("CARGO_PKG_VERSION").to_owned(),
            protocol_revision: PROTOCOL_REVISION,
            incarnation: self.incarnation,
            variables: variables as u64,
            variable_bytes: bytes as u64,
            reads: load(&self.stats.reads),
            updates: load(&self.stats.updates),
            variables_created: load(&self.stats.variables_created),
            unauthenticated_requests: load(&self.stats.unauthenticated),
            rejected_requests: load(&self.stats.rejected),
            pid: u64::from(std::process::id()),
            uptime_seconds: self.started.elapsed().as_secs_f64(),
            connections_open: load(&self.connections.open),
            connections_dropped: load(&self.connections.dropped),
            bytes_read: load(&self.stats.bytes_read),
            bytes_written: load(&self.stats.bytes_written),
            sessions,
            state_ttl_seconds: self.registry.ttl().as_secs_f64(),
        }
    }

    /// The registry that releases `sessions`' stores: at once for a clean end, `ttl` after
    /// a session's last connection closed. Logs each release that freed something.
    pub fn registry(sessions: &Arc<PsSessions>, ttl: std::time::Duration) -> SessionRegistry {
        let sessions = Arc::clone(sessions);
        SessionRegistry::new(ttl, move |session, why| {
            let (variables, bytes) = sessions.end(session);
            if variables > 0 {
                tracing::info!(
                    target: crate::log_target::PS,
                    "session {session} {}: released {variables} variables ({bytes} bytes)",
                    why.label()
                );
            }
        })
    }

    /// Records a call of `session` on the connection in `extensions`; the first call a
    /// connection makes for a session arranges for the registry to hear when it closes.
    fn track(&self, session: &SessionId, extensions: &tonic::Extensions) {
        let connection = connection_info(extensions);
        if self
            .registry
            .touch(session, connection.map(ConnectionInfo::id))
        {
            if let Some(connection) = connection {
                let registry = Arc::downgrade(&self.registry);
                let id = connection.id();
                connection.on_close(move || {
                    if let Some(registry) = registry.upgrade() {
                        registry.connection_closed(id);
                    }
                });
            }
        }
    }

    fn reject(&self, status: Status) -> Status {
        count(&self.stats.rejected, 1);
        status
    }

    fn store_error(&self, error: &StoreError) -> Status {
        self.reject(error.to_status())
    }

    fn view<'a>(
        &self,
        tensor: Option<&'a pb::Tensor>,
        what: &str,
    ) -> Result<TensorView<'a>, Status> {
        let tensor = tensor.ok_or_else(|| {
            self.reject(Status::invalid_argument(format!(
                "{what} is missing; expected a Tensor (dtype, shape, little-endian data)"
            )))
        })?;
        TensorView::from_pb(tensor, what).map_err(|e| self.reject(Status::invalid_argument(e)))
    }

    /// Refuses a response above `limit` bytes before tonic tries to encode it.
    fn sized<M: Message>(&self, message: M, what: &str, limit: usize) -> Result<M, Status> {
        let size = message.encoded_len();
        if size > limit {
            return Err(self.reject(too_large("ps", what, size, limit)));
        }
        Ok(message)
    }

    fn updated(
        &self,
        result: Result<Updated, StoreError>,
        limit: usize,
    ) -> Result<pb::UpdateResponse, Status> {
        let (version, value) = result.map_err(|e| self.store_error(&e))?;
        count(&self.stats.updates, 1);
        let bytes = value.as_ref().map_or(0, |value| value.data.len());
        let response = self.sized(
            pb::UpdateResponse { version, value },
            "the updated value",
            limit,
        )?;
        count(&self.stats.bytes_read, bytes as u64); // sent: counted once it may leave
        Ok(response)
    }

    fn update(
        &self,
        store: &VariableStore,
        request: &pb::UpdateRequest,
        op: Op,
        limit: usize,
    ) -> Result<pb::UpdateResponse, Status> {
        let what = format!("the value for {} to {:?}", op.verb(), request.name);
        let value = self.view(request.value.as_ref(), &what)?;
        count(&self.stats.bytes_written, value.data.len() as u64);
        self.updated(
            store.update(&request.name, op, &value, request.read_value),
            limit,
        )
    }

    fn create(
        &self,
        store: &VariableStore,
        request: &pb::CreateVariableRequest,
    ) -> Result<pb::CreateVariableResponse, Status> {
        let what = format!("the initial value of {:?}", request.name);
        let value = self.view(request.initial_value.as_ref(), &what)?;
        let replaced = store
            .create(&request.name, &value, request.replace)
            .map_err(|e| self.store_error(&e))?;
        count(&self.stats.variables_created, 1);
        count(&self.stats.bytes_written, value.data.len() as u64);
        Ok(pb::CreateVariableResponse { replaced })
    }

    fn read(
        &self,
        store: &VariableStore,
        request: &pb::ReadRequest,
        limit: usize,
    ) -> Result<pb::ReadResponse, Status> {
        let (value, version) = store
            .read(&request.name)
            .map_err(|e| self.store_error(&e))?;
        let bytes = value.data.len();
        let response = pb::ReadResponse {
            value: Some(value),
            version,
        };
        // Counted once the answer may leave: a read too large for one message is refused
        // here and asked again in chunks, and must not count twice.
        let response = self.sized(response, "the variable's value", limit)?;
        count(&self.stats.reads, 1);
        count(&self.stats.bytes_read, bytes as u64);
        Ok(response)
    }

    fn scatter_add(
        &self,
        store: &VariableStore,
        request: &pb::ScatterAddRequest,
        limit: usize,
    ) -> Result<pb::UpdateResponse, Status> {
        let what = format!("the updates for scatter_add to {:?}", request.name);
        let updates = self.view(request.updates.as_ref(), &what)?;
        count(&self.stats.bytes_written, updates.data.len() as u64);
        self.updated(
            store.scatter_add(
                &request.name,
                &request.indices,
                &updates,
                request.read_value,
            ),
            limit,
        )
    }

    fn list(
        &self,
        store: &VariableStore,
        limit: usize,
    ) -> Result<pb::ListVariablesResponse, Status> {
        let response = pb::ListVariablesResponse {
            variables: store.list(),
        };
        self.sized(response, "the variable list", limit)
    }

    fn read_many(
        &self,
        store: &VariableStore,
        request: &pb::ReadManyRequest,
        limit: usize,
    ) -> Result<pb::ReadManyResponse, Status> {
        let variables = store
            .read_many(&request.names)
            .map_err(|e| self.store_error(&e))?;
        let reads = variables.len() as u64;
        let bytes: usize = variables
            .iter()
            .filter_map(|item| item.value.as_ref())
            .map(|value| value.data.len())
            .sum();
        let response = self.sized(
            pb::ReadManyResponse { variables },
            "the variables read",
            limit,
        )?;
        count(&self.stats.reads, reads); // as for `read`: once the answer may leave
        count(&self.stats.bytes_read, bytes as u64);
        Ok(response)
    }

    fn assign_many(
        &self,
        store: &VariableStore,
        request: &pb::AssignManyRequest,
    ) -> Result<pb::AssignManyResponse, Status> {
        let items = request
            .variables
            .iter()
            .map(|item| {
                let what = format!("the value for {:?}", item.name);
                Ok((item.name.clone(), self.view(item.value.as_ref(), &what)?))
            })
            .collect::<Result<Vec<_>, Status>>()?;
        let (assigned, created) = store
            .assign_many(&items, request.create_missing)
            .map_err(|e| self.store_error(&e))?;
        count(&self.stats.updates, u64::from(assigned));
        let bytes: usize = items.iter().map(|(_, value)| value.data.len()).sum();
        count(&self.stats.bytes_written, bytes as u64);
        count(&self.stats.variables_created, u64::from(created));
        Ok(pb::AssignManyResponse { assigned, created })
    }

    fn apply_update(
        &self,
        store: &VariableStore,
        request: &pb::ApplyUpdateRequest,
        limit: usize,
    ) -> Result<pb::UpdateResponse, Status> {
        let what = format!("the gradient for apply_update to {:?}", request.name);
        let gradient = self.view(request.gradient.as_ref(), &what)?;
        let optimizer = super::optim::Optimizer::from_pb(request.optimizer.as_ref())
            .map_err(|e| self.reject(Status::invalid_argument(e)))?;
        count(&self.stats.bytes_written, gradient.data.len() as u64);
        self.updated(
            store.apply_update(
                &request.name,
                &request.slot_prefix,
                &optimizer,
                &gradient,
                request.gradient_scale,
                request.read_value,
            ),
            limit,
        )
    }
}

#[path = "service_chunked.rs"]
mod chunked;
#[path = "service_reattach.rs"]
mod reattach;

/// The `jaxcluster.v1.ParameterServer` service.
pub struct PsService {
    shared: Arc<PsShared>,
}

impl PsService {
    /// A service over `shared`.
    pub fn new(shared: Arc<PsShared>) -> Self {
        Self { shared }
    }

    fn limit(&self) -> usize {
        self.shared.max_message_bytes
    }

    /// The store of the session `request` comes from (see [`PsSessions`]); a malformed
    /// session header is refused.
    fn room<T>(&self, request: &Request<T>) -> Result<Arc<Room>, Status> {
        let session = self.session(request)?;
        self.shared.track(&session, request.extensions());
        Ok(self.shared.sessions.room(&session))
    }

    fn session<T>(&self, request: &Request<T>) -> Result<SessionId, Status> {
        SessionId::from_metadata(request.metadata()).map_err(|s| self.shared.reject(s))
    }
}

#[tonic::async_trait]
impl pb::parameter_server_server::ParameterServer for PsService {
    async fn get_status(
        &self,
        _request: Request<pb::PsStatusRequest>,
    ) -> Result<Response<pb::PsStatusResponse>, Status> {
        Ok(Response::new(self.shared.status()))
    }

    async fn create_variable(
        &self,
        request: Request<pb::CreateVariableRequest>,
    ) -> Result<Response<pb::CreateVariableResponse>, Status> {
        let room = self.room(&request)?;
        self.shared
            .create(&room.store, request.get_ref())
            .map(Response::new)
    }

    async fn read(
        &self,
        request: Request<pb::ReadRequest>,
    ) -> Result<Response<pb::ReadResponse>, Status> {
        let room = self.room(&request)?;
        self.shared
            .read(&room.store, request.get_ref(), self.limit())
            .map(Response::new)
    }

    async fn assign(
        &self,
        request: Request<pb::UpdateRequest>,
    ) -> Result<Response<pb::UpdateResponse>, Status> {
        let room = self.room(&request)?;
        let s = &self.shared;
        s.update(&room.store, request.get_ref(), Op::Assign, self.limit())
            .map(Response::new)
    }

    async fn assign_add(
        &self,
        request: Request<pb::UpdateRequest>,
    ) -> Result<Response<pb::UpdateResponse>, Status> {
        let room = self.room(&request)?;
        let s = &self.shared;
        s.update(&room.store, request.get_ref(), Op::Add, self.limit())
            .map(Response::new)
    }

    async fn assign_sub(
        &self,
        request: Request<pb::UpdateRequest>,
    ) -> Result<Response<pb::UpdateResponse>, Status> {
        let room = self.room(&request)?;
        let s = &self.shared;
        s.update(&room.store, request.get_ref(), Op::Sub, self.limit())
            .map(Response::new)
    }

    async fn scatter_add(
        &self,
        request: Request<pb::ScatterAddRequest>,
    ) -> Result<Response<pb::UpdateResponse>, Status> {
        let room = self.room(&request)?;
        let s = &self.shared;
        s.scatter_add(&room.store, request.get_ref(), self.limit())
            .map(Response::new)
    }

    async fn list_variables(
        &self,
        request: Request<pb::ListVariablesRequest>,
    ) -> Result<Response<pb::ListVariablesResponse>, Status> {
        let room = self.room(&request)?;
        self.shared
            .list(&room.store, self.limit())
            .map(Response::new)
    }

    async fn read_many(
        &self,
        request: Request<pb::ReadManyRequest>,
    ) -> Result<Response<pb::ReadManyResponse>, Status> {
        let room = self.room(&request)?;
        let s = &self.shared;
        s.read_many(&room.store, request.get_ref(), self.limit())
            .map(Response::new)
    }

    async fn assign_many(
        &self,
        request: Request<pb::AssignManyRequest>,
    ) -> Result<Response<pb::AssignManyResponse>, Status> {
        let room = self.room(&request)?;
        self.shared
            .assign_many(&room.store, request.get_ref())
            .map(Response::new)
    }

    async fn delete_variables(
        &self,
        request: Request<pb::DeleteVariablesRequest>,
    ) -> Result<Response<pb::DeleteVariablesResponse>, Status> {
        let room = self.room(&request)?;
        let deleted = room.store.delete(&request.into_inner().names);
        Ok(Response::new(pb::DeleteVariablesResponse { deleted }))
    }

    async fn apply_update(
        &self,
        request: Request<pb::ApplyUpdateRequest>,
    ) -> Result<Response<pb::UpdateResponse>, Status> {
        let room = self.room(&request)?;
        let s = &self.shared;
        s.apply_update(&room.store, request.get_ref(), self.limit())
            .map(Response::new)
    }

    async fn end_session(
        &self,
        request: Request<pb::PsEndSessionRequest>,
    ) -> Result<Response<pb::PsEndSessionResponse>, Status> {
        let session = self.session(&request)?;
        let (variables, bytes) = self.shared.sessions.end(&session);
        // Stops tracking it (the release it makes then finds nothing left).
        self.shared.registry.end(&session);
        if variables > 0 {
            tracing::info!(
                target: crate::log_target::PS,
                "session {session} {}: released {variables} variables ({bytes} bytes)",
                Release::Ended.label()
            );
        }
        Ok(Response::new(pb::PsEndSessionResponse {
            variables: variables as u64,
            bytes: bytes as u64,
        }))
    }

    async fn reattach(
        &self,
        request: Request<pb::ReattachRequest>,
    ) -> Result<Response<pb::ReattachResponse>, Status> {
        let session = self.session(&request)?;
        self.shared.track(&session, request.extensions());
        self.shared
            .reattach(&session, request.get_ref())
            .map(Response::new)
    }

    type CallChunkedStream = chunks::AnswerStream;

    async fn call_chunked(
        &self,
        request: Request<Streaming<pb::Chunk>>,
    ) -> Result<Response<Self::CallChunkedStream>, Status> {
        let room = self.room(&request)?;
        let s = &self.shared;
        let store = &room.store;
        let answer = chunks::serve(
            request.into_inner(),
            |status| s.reject(status),
            |method, encoded| async move { s.chunked(store, &method, encoded) },
        )
        .await?;
        Ok(Response::new(answer))
    }
}
