//! The one boundary where Rust errors become Python exceptions.
//!
//! Exception classes are defined in Python (`jaxcluster.errors`) so users can subclass and
//! pickle them; Rust looks them up by name here rather than defining parallel classes.

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

use crate::rpc::wire::codes::error_class;
use crate::rpc::RpcError;

static ERRORS_MODULE: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// Returns `jaxcluster.errors.<name>` as a type object.
#[allow(dead_code)]
pub fn error_type<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyType>> {
    let module = ERRORS_MODULE
        .get_or_try_init(py, || py.import("jaxcluster.errors").map(Bound::unbind))?
        .bind(py);
    Ok(module.getattr(name)?.cast_into::<PyType>()?)
}

/// Builds a `jaxcluster.errors.<name>` exception carrying `message`.
#[allow(dead_code)]
pub fn new_error(py: Python<'_>, name: &str, message: String) -> PyErr {
    match error_type(py, name) {
        Ok(ty) => PyErr::from_type(ty, message),
        Err(e) => e,
    }
}

/// Maps an RPC failure to its `jaxcluster.errors` class (the class of its gRPC code).
pub(crate) fn rpc_error(py: Python<'_>, error: &RpcError) -> PyErr {
    new_error(py, error_class(error.code()), error.message().to_owned())
}
