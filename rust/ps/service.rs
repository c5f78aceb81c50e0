//! The tonic `ParameterServer` service: decode and check a request, run it on the store,
//! count it. Handlers never touch Python.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use prost::Message;
use tonic::{Request, Response, Status, Streaming};

use super::dtype::Op;
use super::store::{StoreError, Updated, VariableStore};
use super::tensor::TensorView;
use crate::rpc::wire::chunks::{self, answer};
use crate::rpc::wire::limits::too_large;
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
    /// The variables.
    pub store: VariableStore,
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
        let (variables, bytes) = self.store.usage();
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
        request: &pb::UpdateRequest,
        op: Op,
        limit: usize,
    ) -> Result<pb::UpdateResponse, Status> {
        let what = format!("the value for {} to {:?}", op.verb(), request.name);
        let value = self.view(request.value.as_ref(), &what)?;
        count(&self.stats.bytes_written, value.data.len() as u64);
        self.updated(
            self.store
                .update(&request.name, op, &value, request.read_value),
            limit,
        )
    }

    fn create(
        &self,
        request: &pb::CreateVariableRequest,
    ) -> Result<pb::CreateVariableResponse, Status> {
        let what = format!("the initial value of {:?}", request.name);
        let value = self.view(request.initial_value.as_ref(), &what)?;
        let replaced = self
            .store
            .create(&request.name, &value, request.replace)
            .map_err(|e| self.store_error(&e))?;
        count(&self.stats.variables_created, 1);
        count(&self.stats.bytes_written, value.data.len() as u64);
        Ok(pb::CreateVariableResponse { replaced })
    }

    fn read(&self, request: &pb::ReadRequest, limit: usize) -> Result<pb::ReadResponse, Status> {
        let (value, version) = self
            .store
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
        request: &pb::ScatterAddRequest,
        limit: usize,
    ) -> Result<pb::UpdateResponse, Status> {
        let what = format!("the updates for scatter_add to {:?}", request.name);
        let updates = self.view(request.updates.as_ref(), &what)?;
        count(&self.stats.bytes_written, updates.data.len() as u64);
        self.updated(
            self.store.scatter_add(
                &request.name,
                &request.indices,
                &updates,
                request.read_value,
            ),
            limit,
        )
    }

    fn list(&self, limit: usize) -> Result<pb::ListVariablesResponse, Status> {
        let response = pb::ListVariablesResponse {
            variables: self.store.list(),
        };
        self.sized(response, "the variable list", limit)
    }

    fn read_many(
        &self,
        request: &pb::ReadManyRequest,
        limit: usize,
    ) -> Result<pb::ReadManyResponse, Status> {
        let variables = self
            .store
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
        let (assigned, created) = self
            .store
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
        request: &pb::ApplyUpdateRequest,
        limit: usize,
    ) -> Result<pb::UpdateResponse, Status> {
        let what = format!("the gradient for apply_update to {:?}", request.name);
        let gradient = self.view(request.gradient.as_ref(), &what)?;
        let optimizer = super::optim::Optimizer::from_pb(request.optimizer.as_ref())
            .map_err(|e| self.reject(Status::invalid_argument(e)))?;
        count(&self.stats.bytes_written, gradient.data.len() as u64);
        self.updated(
            self.store.apply_update(
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

    /// A chunked request decoded; a failure is counted as a rejected request.
    fn decoded<M: Message + Default>(&self, encoded: Bytes, what: &str) -> Result<M, Status> {
        chunks::decode(encoded, what).map_err(|s| self.reject(s))
    }

    /// Runs one unary call that came through `CallChunked`, whose answer may be of any
    /// size (it leaves in chunks).
    fn chunked(&self, method: &str, encoded: Bytes) -> Result<Vec<pb::Chunk>, Status> {
        let what = format!("a chunked {method} request");
        let what = what.as_str();
        let any = usize::MAX;
        let limit = self.max_message_bytes;
        Ok(match method {
            "CreateVariable" => answer(&self.create(&self.decoded(encoded, what)?)?, limit),
            "Read" => answer(&self.read(&self.decoded(encoded, what)?, any)?, limit),
            "Assign" => answer(
                &self.update(&self.decoded(encoded, what)?, Op::Assign, any)?,
                limit,
            ),
            "AssignAdd" => answer(
                &self.update(&self.decoded(encoded, what)?, Op::Add, any)?,
                limit,
            ),
            "AssignSub" => answer(
                &self.update(&self.decoded(encoded, what)?, Op::Sub, any)?,
                limit,
            ),
            "ScatterAdd" => answer(
                &self.scatter_add(&self.decoded(encoded, what)?, any)?,
                limit,
            ),
            "ReadMany" => answer(&self.read_many(&self.decoded(encoded, what)?, any)?, limit),
            "AssignMany" => answer(&self.assign_many(&self.decoded(encoded, what)?)?, limit),
            "ApplyUpdate" => answer(
                &self.apply_update(&self.decoded(encoded, what)?, any)?,
                limit,
            ),
            other => return Err(self.reject(chunks::unknown_method(other, &CHUNKED_METHODS))),
        })
    }
}

/// The unary methods `CallChunked` carries (those whose messages can be large).
const CHUNKED_METHODS: [&str; 9] = [
    "CreateVariable",
    "Read",
    "Assign",
    "AssignAdd",
    "AssignSub",
    "ScatterAdd",
    "ReadMany",
    "AssignMany",
    "ApplyUpdate",
];

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
        self.shared.create(request.get_ref()).map(Response::new)
    }

    async fn read(
        &self,
        request: Request<pb::ReadRequest>,
    ) -> Result<Response<pb::ReadResponse>, Status> {
        self.shared
            .read(request.get_ref(), self.limit())
            .map(Response::new)
    }

    async fn assign(
        &self,
        request: Request<pb::UpdateRequest>,
    ) -> Result<Response<pb::UpdateResponse>, Status> {
        let s = &self.shared;
        s.update(request.get_ref(), Op::Assign, self.limit())
            .map(Response::new)
    }

    async fn assign_add(
        &self,
        request: Request<pb::UpdateRequest>,
    ) -> Result<Response<pb::UpdateResponse>, Status> {
        let s = &self.shared;
        s.update(request.get_ref(), Op::Add, self.limit())
            .map(Response::new)
    }

    async fn assign_sub(
        &self,
        request: Request<pb::UpdateRequest>,
    ) -> Result<Response<pb::UpdateResponse>, Status> {
        let s = &self.shared;
        s.update(request.get_ref(), Op::Sub, self.limit())
            .map(Response::new)
    }

    async fn scatter_add(
        &self,
        request: Request<pb::ScatterAddRequest>,
    ) -> Result<Response<pb::UpdateResponse>, Status> {
        let s = &self.shared;
        s.scatter_add(request.get_ref(), self.limit())
            .map(Response::new)
    }

    async fn list_variables(
        &self,
        _request: Request<pb::ListVariablesRequest>,
    ) -> Result<Response<pb::ListVariablesResponse>, Status> {
        self.shared.list(self.limit()).map(Response::new)
    }

    async fn read_many(
        &self,
        request: Request<pb::ReadManyRequest>,
    ) -> Result<Response<pb::ReadManyResponse>, Status> {
        let s = &self.shared;
        s.read_many(request.get_ref(), self.limit())
            .map(Response::new)
    }

    async fn assign_many(
        &self,
        request: Request<pb::AssignManyRequest>,
    ) -> Result<Response<pb::AssignManyResponse>, Status> {
        self.shared
            .assign_many(request.get_ref())
            .map(Response::new)
    }

    async fn delete_variables(
        &self,
        request: Request<pb::DeleteVariablesRequest>,
    ) -> Result<Response<pb::DeleteVariablesResponse>, Status> {
        let deleted = self.shared.store.delete(&request.into_inner().names);
        Ok(Response::new(pb::DeleteVariablesResponse { deleted }))
    }

    async fn apply_update(
        &self,
        request: Request<pb::ApplyUpdateRequest>,
    ) -> Result<Response<pb::UpdateResponse>, Status> {
        let s = &self.shared;
        s.apply_update(request.get_ref(), self.limit())
            .map(Response::new)
    }

    type CallChunkedStream = chunks::AnswerStream;

    async fn call_chunked(
        &self,
        request: Request<Streaming<pb::Chunk>>,
    ) -> Result<Response<Self::CallChunkedStream>, Status> {
        let s = &self.shared;
        let answer = chunks::serve(
            request.into_inner(),
            |status| s.reject(status),
            |method, encoded| async move { s.chunked(&method, encoded) },
        )
        .await?;
        Ok(Response::new(answer))
    }
}
