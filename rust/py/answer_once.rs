//! [`AnswerOnce`]: a request handed to Python that must be answered exactly once (a
//! `WorkerJob`, a `ValueRead`), and the status codes their `reply_status` accepts.
//!
//! The Rust side answers a request dropped unanswered by itself (`INTERNAL`), so a Python
//! bug never leaves a caller hanging; what Python must not do is answer twice. Both
//! classes hold their request here and take it out to answer, so a second answer is a
//! `RuntimeError` and `replied` is whether it is gone.

use std::sync::{Mutex, PoisonError};

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::PyResult;

use crate::rpc::wire::codes::parse_code;

/// A request Python answers once: [`take`](Self::take) hands it out for its answer the
/// first time, and refuses every later call.
pub(crate) struct AnswerOnce<T> {
    pending: Mutex<Option<T>>,
    /// What the request is called in the error of a second answer ("job", "read").
    what: &'static str,
}

impl<T> AnswerOnce<T> {
    /// Holds `request` until it is answered.
    pub(crate) fn new(request: T, what: &'static str) -> Self {
        Self {
            pending: Mutex::new(Some(request)),
            what,
        }
    }

    /// The request, to answer now; `RuntimeError` once it was answered.
    pub(crate) fn take(&self) -> PyResult<T> {
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .ok_or_else(|| {
                PyRuntimeError::new_err(format!("this {} has already been answered", self.what))
            })
    }

    /// Whether [`take`](Self::take) has handed the request out.
    pub(crate) fn answered(&self) -> bool {
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_none()
    }
}

/// The code of a `reply_status(code, ...)`: a gRPC error code name (not `OK`), else a
/// `ValueError` naming `examples` of what is expected.
pub(crate) fn error_code(code: &str, examples: &str) -> PyResult<tonic::Code> {
    parse_code(code)
        .filter(|code| *code != tonic::Code::Ok)
        .ok_or_else(|| {
            PyValueError::new_err(format!(
                "status code {code:?} is not a gRPC error code name; expected e.g. {examples}"
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_handed_out_once() {
        let once = AnswerOnce::new(7_u32, "job");
        assert!(!once.answered());
        assert_eq!(once.take().unwrap(), 7);
        assert!(once.answered());
        assert!(once.take().is_err());
        assert!(once.answered());
    }

    #[test]
    fn only_error_codes_are_accepted() {
        assert_eq!(error_code("NOT_FOUND", "").unwrap(), tonic::Code::NotFound);
        assert!(error_code("OK", "").is_err());
        assert!(error_code("NOPE", "").is_err());
    }
}
