//! `jaxcluster._core.WorkerJob`: one request the Python executor took from the worker
//! server (`WorkerServer.next_job`, `worker.rs`): what it asks, and its answer, given
//! exactly once (`super::answer_once`).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use super::answer_once::{error_code, AnswerOnce};
use super::buffer::{buffer_list, bytes_of, bytes_of_all};
use super::enums::{ErrorKind, FunctionKind};
use crate::rpc::pb;
use crate::rpc::wire::codes::parse_error_kind;
use crate::rpc::wire::session::SessionId;
use crate::worker::{Job, JobReply, JobRequest, Ran};

/// A `reply_error` kind: an `ErrorKind` (not `CANCELLED`, which no worker reports) or its
/// spelling.
fn reported_kind(kind: &Bound<'_, PyAny>) -> PyResult<pb::ErrorKind> {
    let kind = match kind.extract::<ErrorKind>() {
        Ok(kind) => kind.spelling().to_owned(),
        Err(_) => kind.extract::<String>()?,
    };
    parse_error_kind(&kind).map_err(PyValueError::new_err)
}

/// One request taken by the executor (see `_core.pyi`).
#[pyclass(module = "jaxcluster._core", name = "WorkerJob", frozen)]
pub struct PyWorkerJob {
    request: JobRequest,
    session: SessionId,
    job: AnswerOnce<Job>,
}

impl PyWorkerJob {
    pub(crate) fn new(job: Job) -> Self {
        Self {
            request: job.request().clone(),
            session: job.session().clone(),
            job: AnswerOnce::new(job, "job"),
        }
    }

    fn args_value(&self) -> Option<&pb::Value> {
        match &self.request {
            JobRequest::Run { args, .. } | JobRequest::CreateResource { args, .. } => {
                args.as_ref().filter(|v| !v.pickle.is_empty())
            }
            JobRequest::ReleaseResource { .. } | JobRequest::ReleaseSession => None,
        }
    }

    fn function(&self) -> Option<&crate::worker::store::StoredFunction> {
        match &self.request {
            JobRequest::Run { function, .. } | JobRequest::CreateResource { function, .. } => {
                Some(function)
            }
            JobRequest::ReleaseResource { .. } | JobRequest::ReleaseSession => None,
        }
    }
}

#[pymethods]
impl PyWorkerJob {
    #[getter]
    fn kind(&self) -> &'static str {
        match self.request {
            JobRequest::Run { .. } => "run",
            JobRequest::CreateResource { .. } => "create_resource",
            JobRequest::ReleaseResource { .. } => "release_resource",
            JobRequest::ReleaseSession => "release_session",
        }
    }

    #[getter]
    fn session(&self) -> &str {
        self.session.as_str()
    }

    #[getter]
    fn name(&self) -> &str {
        match &self.request {
            JobRequest::CreateResource { name, .. } => name,
            _ => "",
        }
    }

    #[getter]
    fn closure_id(&self) -> Option<u64> {
        match self.request {
            JobRequest::Run { closure_id, .. } => Some(closure_id),
            _ => None,
        }
    }

    #[getter]
    fn resource_id(&self) -> Option<u64> {
        match self.request {
            JobRequest::CreateResource { resource_id, .. } => Some(resource_id),
            _ => None,
        }
    }

    #[getter]
    fn worker_index(&self) -> Option<i64> {
        match self.request {
            JobRequest::Run { worker_index, .. }
            | JobRequest::CreateResource { worker_index, .. } => worker_index,
            JobRequest::ReleaseResource { .. } | JobRequest::ReleaseSession => None,
        }
    }

    #[getter]
    fn keep_result_id(&self) -> Option<u64> {
        match self.request {
            JobRequest::Run { keep_result_id, .. } => keep_result_id,
            _ => None,
        }
    }

    #[getter]
    fn resource_ids(&self) -> Vec<u64> {
        match &self.request {
            JobRequest::ReleaseResource { resource_ids } => resource_ids.clone(),
            _ => Vec::new(),
        }
    }

    #[getter]
    fn function_hash<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        self.function().map(|f| PyBytes::new(py, &f.hash))
    }

    #[getter]
    fn function_kind(&self) -> Option<FunctionKind> {
        self.function()
            .and_then(|f| FunctionKind::from_proto(f.kind))
    }

    #[getter]
    fn function_payload<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        self.function().map(|f| PyBytes::new(py, &f.payload))
    }

    #[getter]
    fn args<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyBytes>> {
        self.args_value().map(|v| PyBytes::new(py, &v.pickle))
    }

    #[getter]
    fn buffers<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        match self.args_value() {
            Some(v) => buffer_list(py, &v.buffers),
            None => Ok(PyList::empty(py)),
        }
    }

    #[getter]
    fn replied(&self) -> bool {
        self.job.answered()
    }

    #[pyo3(signature = (value=None, buffers=Vec::new(), *, released=0, reattached=false))]
    #[allow(clippy::needless_pass_by_value)] // PyO3 extracts owned lists
    fn reply_ok(
        &self,
        value: Option<Bound<'_, PyAny>>,
        buffers: Vec<Bound<'_, PyAny>>,
        released: u32,
        reattached: bool,
    ) -> PyResult<()> {
        let reply = match &self.request {
            JobRequest::Run { .. } => {
                let Some(pickle) = value else {
                    return Err(PyValueError::new_err(
                        "reply_ok() for a 'run' job needs the pickled result as `value`",
                    ));
                };
                JobReply::Run(Ran::Result(pb::Value {
                    pickle: bytes_of(&pickle, "value")?,
                    buffers: bytes_of_all(&buffers, "each buffer")?,
                }))
            }
            JobRequest::CreateResource { resource_id, .. } => {
                JobReply::CreateResource(pb::CreateResourceResponse {
                    resource_id: *resource_id,
                    error: None,
                    reattached,
                })
            }
            JobRequest::ReleaseResource { .. } | JobRequest::ReleaseSession => {
                JobReply::ReleaseResource(pb::ReleaseResourceResponse { released })
            }
        };
        self.job.take()?.reply(reply);
        Ok(())
    }

    #[pyo3(signature = (kind, type_name, module, message, traceback, *, exception=None,
                        exception_buffers=Vec::new(), resource_id=None, ps_task=None))]
    #[allow(clippy::too_many_arguments, clippy::needless_pass_by_value)] // PyO3 extracts owned arguments
    fn reply_error(
        &self,
        kind: &Bound<'_, PyAny>,
        type_name: String,
        module: String,
        message: String,
        traceback: String,
        exception: Option<Bound<'_, PyAny>>,
        exception_buffers: Vec<Bound<'_, PyAny>>,
        resource_id: Option<u64>,
        ps_task: Option<i64>,
    ) -> PyResult<()> {
        let error = pb::ClosureError {
            kind: reported_kind(kind)?.into(),
            type_name,
            module,
            message,
            traceback,
            exception: exception
                .map(|pickle| -> PyResult<pb::Value> {
                    Ok(pb::Value {
                        pickle: bytes_of(&pickle, "exception")?,
                        buffers: bytes_of_all(&exception_buffers, "each exception buffer")?,
                    })
                })
                .transpose()?,
            resource_id,
            ps_task,
        };
        let reply = match &self.request {
            JobRequest::Run { .. } => JobReply::Run(Ran::Error(error)),
            JobRequest::CreateResource { resource_id, .. } => {
                JobReply::CreateResource(pb::CreateResourceResponse {
                    resource_id: *resource_id,
                    error: Some(error),
                    reattached: false,
                })
            }
            JobRequest::ReleaseResource { .. } | JobRequest::ReleaseSession => {
                return Err(PyValueError::new_err(format!(
                    "a {:?} job cannot carry a closure error; use reply_status",
                    self.kind()
                )))
            }
        };
        self.job.take()?.reply(reply);
        Ok(())
    }

    fn reply_status(&self, code: &str, message: &str) -> PyResult<()> {
        let code = error_code(code, "INVALID_ARGUMENT, NOT_FOUND, UNAVAILABLE or INTERNAL")?;
        self.job
            .take()?
            .reply_status(tonic::Status::new(code, message));
        Ok(())
    }

    fn __repr__(&self) -> String {
        let id = self
            .closure_id()
            .or(self.resource_id())
            .map_or(String::new(), |id| format!(", id={id}"));
        format!(
            "WorkerJob(kind={:?}{id}, replied={})",
            self.kind(),
            self.replied()
        )
    }
}
