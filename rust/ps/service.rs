//! The tonic `ParameterServer` service: decode and check a request, run it on the store,
//! count it. Handlers never touch Python.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use prost::Message;
use tonic::{Request, Response, Status};

use super::dtype::Op;
use super::store::{StoreError, Updated, VariableStore};
use super::tensor::TensorView;
use crate::rpc::limits::too_large;
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
    pub connections: Arc<crate::rpc::connections::ConnectionStats>,
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

    /// Refuses a response above the size limit before tonic tries to encode it.
    fn sized<M: Message>(&self, message: M, what: &str) -> Result<Response<M>, Status> {
        let size = message.encoded_len();
        if size > self.max_message_bytes {
            return Err(self.reject(too_large("ps", what, size, self.max_message_bytes)));
        }
        Ok(Response::new(message))
    }

    fn updated(
        &self,
        result: Result<Updated, StoreError>,
    ) -> Result<Response<pb::UpdateResponse>, Status> {
        let (version, value) = result.map_err(|e| self.store_error(&e))?;
        count(&self.stats.updates, 1);
        if let Some(value) = &value {
            count(&self.stats.bytes_read, value.data.len() as u64);
        }
        self.sized(pb::UpdateResponse { version, value }, "the updated value")
    }

    fn update(
        &self,
        request: &pb::UpdateRequest,
        op: Op,
    ) -> Result<Response<pb::UpdateResponse>, Status> {
        let what = format!("the value for {} to {:?}", op.verb(), request.name);
        let value = self.view(request.value.as_ref(), &what)?;
        count(&self.stats.bytes_written, value.data.len() as u64);
        self.updated(
            self.store
                .update(&request.name, op, &value, request.read_value),
        )
    }
}

/// The `jaxcluster.v1.ParameterServer` service.
pub struct PsService {
    shared: Arc<PsShared>,
}

impl PsService {
    /// A service over `shared`.
    pub fn new(shared: Arc<PsShared>) -> Self {
        Self { shared }
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
        let s = &self.shared;
        let request = request.into_inner();
        let what = format!("the initial value of {:?}", request.name);
        let value = s.view(request.initial_value.as_ref(), &what)?;
        let replaced = s
            .store
            .create(&request.name, &value, request.replace)
            .map_err(|e| s.store_error(&e))?;
        count(&s.stats.variables_created, 1);
        count(&s.stats.bytes_written, value.data.len() as u64);
        Ok(Response::new(pb::CreateVariableResponse { replaced }))
    }

    async fn read(
        &self,
        request: Request<pb::ReadRequest>,
    ) -> Result<Response<pb::ReadResponse>, Status> {
        let s = &self.shared;
        let (value, version) = s
            .store
            .read(&request.into_inner().name)
            .map_err(|e| s.store_error(&e))?;
        count(&s.stats.reads, 1);
        count(&s.stats.bytes_read, value.data.len() as u64);
        s.sized(
            pb::ReadResponse {
                value: Some(value),
                version,
            },
            "the variable's value",
        )
    }

    async fn assign(
        &self,
        request: Request<pb::UpdateRequest>,
    ) -> Result<Response<pb::UpdateResponse>, Status> {
        self.shared.update(&request.into_inner(), Op::Assign)
    }

    async fn assign_add(
        &self,
        request: Request<pb::UpdateRequest>,
    ) -> Result<Response<pb::UpdateResponse>, Status> {
        self.shared.update(&request.into_inner(), Op::Add)
    }

    async fn assign_sub(
        &self,
        request: Request<pb::UpdateRequest>,
    ) -> Result<Response<pb::UpdateResponse>, Status> {
        self.shared.update(&request.into_inner(), Op::Sub)
    }

    async fn scatter_add(
        &self,
        request: Request<pb::ScatterAddRequest>,
    ) -> Result<Response<pb::UpdateResponse>, Status> {
        let s = &self.shared;
        let request = request.into_inner();
        let what = format!("the updates for scatter_add to {:?}", request.name);
        let updates = s.view(request.updates.as_ref(), &what)?;
        count(&s.stats.bytes_written, updates.data.len() as u64);
        s.updated(s.store.scatter_add(
            &request.name,
            &request.indices,
            &updates,
            request.read_value,
        ))
    }

    async fn list_variables(
        &self,
        _request: Request<pb::ListVariablesRequest>,
    ) -> Result<Response<pb::ListVariablesResponse>, Status> {
        let s = &self.shared;
        s.sized(
            pb::ListVariablesResponse {
                variables: s.store.list(),
            },
            "the variable list",
        )
    }

    async fn read_many(
        &self,
        request: Request<pb::ReadManyRequest>,
    ) -> Result<Response<pb::ReadManyResponse>, Status> {
        let s = &self.shared;
        let variables = s
            .store
            .read_many(&request.into_inner().names)
            .map_err(|e| s.store_error(&e))?;
        count(&s.stats.reads, variables.len() as u64);
        let bytes: usize = variables
            .iter()
            .filter_map(|item| item.value.as_ref())
            .map(|value| value.data.len())
            .sum();
        count(&s.stats.bytes_read, bytes as u64);
        s.sized(pb::ReadManyResponse { variables }, "the variables read")
    }

    async fn assign_many(
        &self,
        request: Request<pb::AssignManyRequest>,
    ) -> Result<Response<pb::AssignManyResponse>, Status> {
        let s = &self.shared;
        let request = request.into_inner();
        let items = request
            .variables
            .iter()
            .map(|item| {
                let what = format!("the value for {:?}", item.name);
                Ok((item.name.clone(), s.view(item.value.as_ref(), &what)?))
            })
            .collect::<Result<Vec<_>, Status>>()?;
        let (assigned, created) = s
            .store
            .assign_many(&items, request.create_missing)
            .map_err(|e| s.store_error(&e))?;
        count(&s.stats.updates, u64::from(assigned));
        let bytes: usize = items.iter().map(|(_, value)| value.data.len()).sum();
        count(&s.stats.bytes_written, bytes as u64);
        count(&s.stats.variables_created, u64::from(created));
        Ok(Response::new(pb::AssignManyResponse { assigned, created }))
    }

    async fn delete_variables(
        &self,
        request: Request<pb::DeleteVariablesRequest>,
    ) -> Result<Response<pb::DeleteVariablesResponse>, Status> {
        let deleted = self.shared.store.delete(&request.into_inner().names);
        Ok(Response::new(pb::DeleteVariablesResponse { deleted }))
    }
}
