//! The states and kinds Python sees as enums: `WorkerState`, `ServingState`,
//! `FunctionKind`, `ErrorKind` and `ResourceState`.
//!
//! Each variant is spelled once, by the Rust enum or protocol table it mirrors
//! (`crate::rpc::wire::codes`, [`LinkState::label`], [`ResourceStatus::label`]); the Python enum
//! takes that spelling as its `value` and `str()`, and compares equal to (and hashes like)
//! it, so `status.state == "up"` and `{"up": 1}[status.state]` keep working for callers
//! that hold strings, while typed callers write `WorkerState.UP`.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple, PyType};

use crate::dispatch::{FailureKind, LinkState, ResourceStatus, WorkerSnapshot};
use crate::rpc::pb;
use crate::rpc::wire::codes::{
    error_kind_name, function_kind_name, parse_function_kind, serving_state_name, CANCELLED_KIND,
};

/// Declares one spelled enum: the `#[pyclass]`, its spelling per variant (an expression
/// that asks the owner), parsing, and the Python methods that make it equal to its
/// spelling.
macro_rules! spelled_enum {
    (
        $(#[$meta:meta])*
        $name:ident as $pyname:literal {
            $($(#[$vmeta:meta])* $variant:ident as $pyvariant:literal => $spelling:expr,)+
        }
    ) => {
        $(#[$meta])*
        #[pyclass(frozen, module = "jaxcluster._core", name = $pyname)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum $name {
            $($(#[$vmeta])* #[pyo3(name = $pyvariant)] $variant,)+
        }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: &'static [Self] = &[$(Self::$variant,)+];

            /// The variant's one spelling, as its owner spells it.
            pub fn spelling(self) -> &'static str {
                match self {
                    $(Self::$variant => $spelling,)+
                }
            }

            /// The variant spelled `name`, if any.
            pub fn parse(name: &str) -> Option<Self> {
                Self::ALL.iter().copied().find(|v| v.spelling() == name)
            }

            fn python_name(self) -> &'static str {
                match self {
                    $(Self::$variant => $pyvariant,)+
                }
            }
        }

        #[pymethods]
        impl $name {
            /// `Enum("spelling")`, as Python's `enum` allows; also what unpickling calls.
            #[new]
            fn py_new(value: &str) -> PyResult<Self> {
                Self::parse(value).ok_or_else(|| {
                    let known: Vec<&str> = Self::ALL.iter().map(|v| v.spelling()).collect();
                    PyValueError::new_err(format!(
                        "{value:?} is not a {}; expected one of {known:?}",
                        $pyname
                    ))
                })
            }

            #[getter]
            fn value(&self) -> &'static str {
                self.spelling()
            }

            #[getter]
            fn name(&self) -> &'static str {
                self.python_name()
            }

            fn __str__(&self) -> &'static str {
                self.spelling()
            }

            fn __repr__(&self) -> String {
                format!("{}.{}", $pyname, self.python_name())
            }

            fn __eq__<'py>(&self, other: &Bound<'py, PyAny>) -> Bound<'py, PyAny> {
                let py = other.py();
                match spelling_of::<Self>(other, |v| v.spelling()) {
                    Some(spelling) => {
                        pyo3::types::PyBool::new(py, spelling == self.spelling()).to_owned().into_any()
                    }
                    None => py.NotImplemented().into_bound(py),
                }
            }

            fn __ne__<'py>(&self, other: &Bound<'py, PyAny>) -> Bound<'py, PyAny> {
                let py = other.py();
                match spelling_of::<Self>(other, |v| v.spelling()) {
                    Some(spelling) => {
                        pyo3::types::PyBool::new(py, spelling != self.spelling()).to_owned().into_any()
                    }
                    None => py.NotImplemented().into_bound(py),
                }
            }

            fn __hash__(&self, py: Python<'_>) -> PyResult<isize> {
                PyString::new(py, self.spelling()).hash()
            }

            fn __reduce__<'py>(
                slf: &Bound<'py, Self>,
            ) -> PyResult<(Bound<'py, PyType>, Bound<'py, PyTuple>)> {
                let py = slf.py();
                Ok((slf.as_any().get_type(), PyTuple::new(py, [slf.get().spelling()])?))
            }

            /// Every variant, in declaration order (Python's `list(Enum)`).
            #[staticmethod]
            fn members() -> Vec<Self> {
                Self::ALL.to_vec()
            }
        }
    };
}

/// The spelling `other` stands for: a `str` as it is, or a variant of `E`.
fn spelling_of<E>(other: &Bound<'_, PyAny>, spell: fn(E) -> &'static str) -> Option<String>
where
    E: Copy,
    for<'a, 'py> E: FromPyObject<'a, 'py>,
{
    if let Ok(text) = other.cast::<PyString>() {
        return text.to_str().ok().map(str::to_owned);
    }
    other.extract::<E>().ok().map(|v| spell(v).to_owned())
}

spelled_enum! {
    /// A worker's state as the coordinator's link sees it (`Dispatcher.worker_statuses()`).
    WorkerState as "WorkerState" {
        /// Serving closures.
        Up as "UP" => LinkState::Up.label(),
        /// Not answering, or not answered yet; probed with backoff.
        Recovering as "RECOVERING" => LinkState::Recovering.label(),
        /// Did not answer within the recovery bound; no longer used.
        GivenUp as "GIVEN_UP" => LinkState::GivenUp.label(),
        /// Taken out by `remove_workers`.
        Removed as "REMOVED" => LinkState::Removed.label(),
        /// Announced its preemption (up or recovering meanwhile): gets no new closure.
        Preempting as "PREEMPTING" => serving_state_name(pb::ServingState::Preempting),
    }
}

impl From<LinkState> for WorkerState {
    fn from(state: LinkState) -> Self {
        match state {
            LinkState::Up => Self::Up,
            LinkState::Recovering => Self::Recovering,
            LinkState::GivenUp => Self::GivenUp,
            LinkState::Removed => Self::Removed,
        }
    }
}

impl WorkerState {
    /// The state a snapshot shows: `preempting` while a worker process that announced its
    /// preemption is up or being waited for, else the link's state.
    pub fn of(snapshot: &WorkerSnapshot) -> Self {
        match snapshot.state {
            LinkState::Up | LinkState::Recovering if snapshot.preemption.is_some() => {
                Self::Preempting
            }
            state => state.into(),
        }
    }
}

spelled_enum! {
    /// A worker's own serving state, as its `GetStatus` reports it.
    ServingState as "ServingState" {
        /// Taking closures.
        Serving as "SERVING" => serving_state_name(pb::ServingState::Serving),
        /// Finishing what it has before it exits; takes no new closures.
        Draining as "DRAINING" => serving_state_name(pb::ServingState::Draining),
        /// A preemption notice arrived: draining, gone by the notice's deadline.
        Preempting as "PREEMPTING" => serving_state_name(pb::ServingState::Preempting),
        /// The proto's zero value (a worker that did not say).
        Unspecified as "UNSPECIFIED" => serving_state_name(pb::ServingState::Unspecified),
    }
}

impl From<pb::ServingState> for ServingState {
    fn from(state: pb::ServingState) -> Self {
        match state {
            pb::ServingState::Serving => Self::Serving,
            pb::ServingState::Draining => Self::Draining,
            pb::ServingState::Preempting => Self::Preempting,
            pb::ServingState::Unspecified => Self::Unspecified,
        }
    }
}

spelled_enum! {
    /// How a registered function's payload is encoded.
    FunctionKind as "FunctionKind" {
        /// A cloudpickled Python callable.
        Cloudpickle as "CLOUDPICKLE" => function_kind_name(pb::FunctionKind::Cloudpickle),
        /// A serialized `jax.export.Exported`.
        JaxExport as "JAX_EXPORT" => function_kind_name(pb::FunctionKind::JaxExport),
    }
}

impl FunctionKind {
    /// The kind a protocol value stands for; `None` for the proto's zero value.
    pub fn from_proto(kind: pb::FunctionKind) -> Option<Self> {
        match kind {
            pb::FunctionKind::Cloudpickle => Some(Self::Cloudpickle),
            pb::FunctionKind::JaxExport => Some(Self::JaxExport),
            pb::FunctionKind::Unspecified => None,
        }
    }

    /// The protocol's value for this kind.
    pub fn proto(self) -> pb::FunctionKind {
        match self {
            Self::Cloudpickle => pb::FunctionKind::Cloudpickle,
            Self::JaxExport => pb::FunctionKind::JaxExport,
        }
    }
}

/// A function-kind argument: a `FunctionKind` or its spelling.
pub(crate) fn function_kind_arg(kind: &Bound<'_, PyAny>) -> PyResult<pb::FunctionKind> {
    if let Ok(kind) = kind.extract::<FunctionKind>() {
        return Ok(kind.proto());
    }
    let Ok(name) = kind.cast::<PyString>() else {
        return Err(PyTypeError::new_err(format!(
            "a function kind is a FunctionKind or its name ('cloudpickle' or 'jax_export'), \
             not {}",
            kind.get_type().name()?
        )));
    };
    parse_function_kind(name.to_str()?).map_err(PyValueError::new_err)
}

spelled_enum! {
    /// Why a closure did not produce a value (`ClosureError.kind`).
    ErrorKind as "ErrorKind" {
        /// The function raised.
        User as "USER" => error_kind_name(pb::ErrorKind::User),
        /// An input (a per-worker resource) could not be produced.
        Input as "INPUT" => error_kind_name(pb::ErrorKind::Input),
        /// The function could not be loaded on the worker.
        FunctionLoad as "FUNCTION_LOAD" => error_kind_name(pb::ErrorKind::FunctionLoad),
        /// The infrastructure failed (see `ClosureError.code`).
        Infrastructure as "INFRASTRUCTURE" => error_kind_name(pb::ErrorKind::Infrastructure),
        /// The closure was cancelled before it ended.
        Cancelled as "CANCELLED" => CANCELLED_KIND,
    }
}

/// An error-kind argument (`ClosureError(kind, ...)`): an `ErrorKind` or its spelling.
pub(crate) fn error_kind_arg(kind: &Bound<'_, PyAny>) -> PyResult<ErrorKind> {
    if let Ok(kind) = kind.extract::<ErrorKind>() {
        return Ok(kind);
    }
    let name = kind.str()?;
    let name = name.to_str()?;
    ErrorKind::parse(name).ok_or_else(|| {
        let known: Vec<&str> = ErrorKind::ALL.iter().map(|k| k.spelling()).collect();
        PyValueError::new_err(format!(
            "ClosureError kind {name:?} is not known; expected one of {known:?}"
        ))
    })
}

impl From<pb::ErrorKind> for ErrorKind {
    /// A worker's reported kind; the proto's zero value (no valid reply carries it) reads
    /// as an infrastructure failure.
    fn from(kind: pb::ErrorKind) -> Self {
        match kind {
            pb::ErrorKind::User => Self::User,
            pb::ErrorKind::Input => Self::Input,
            pb::ErrorKind::FunctionLoad => Self::FunctionLoad,
            pb::ErrorKind::Infrastructure | pb::ErrorKind::Unspecified => Self::Infrastructure,
        }
    }
}

impl From<FailureKind> for ErrorKind {
    fn from(kind: FailureKind) -> Self {
        match kind {
            FailureKind::User => Self::User,
            FailureKind::Input => Self::Input,
            FailureKind::Infra(_) => Self::Infrastructure,
        }
    }
}

spelled_enum! {
    /// Where a per-worker resource stands on one worker (`PerWorkerResource.state(i)`).
    ResourceState as "ResourceState" {
        /// Not built yet, or being built.
        Pending as "PENDING" => ResourceStatus::Pending.label(),
        /// Built; closures there can use it.
        Ready as "READY" => ResourceStatus::Ready.label(),
        /// Building it failed.
        Failed as "FAILED" => ResourceStatus::Failed.label(),
        /// Lost with its worker or released; rebuilt when the worker returns unless released.
        Aborted as "ABORTED" => ResourceStatus::Aborted.label(),
        /// Lost with its worker and not to be rebuilt.
        Lost as "LOST" => ResourceStatus::Lost.label(),
    }
}

impl From<ResourceStatus> for ResourceState {
    fn from(status: ResourceStatus) -> Self {
        match status {
            ResourceStatus::Pending => Self::Pending,
            ResourceStatus::Ready => Self::Ready,
            ResourceStatus::Failed => Self::Failed,
            ResourceStatus::Aborted => Self::Aborted,
            ResourceStatus::Lost => Self::Lost,
        }
    }
}

/// Adds every enum to the `_core` module.
pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<WorkerState>()?;
    m.add_class::<ServingState>()?;
    m.add_class::<FunctionKind>()?;
    m.add_class::<ErrorKind>()?;
    m.add_class::<ResourceState>()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::wire::codes::parse_error_kind;

    #[test]
    fn spellings_are_the_owners_and_parse_back() {
        assert_eq!(WorkerState::from(LinkState::GivenUp).spelling(), "given_up");
        assert_eq!(FunctionKind::JaxExport.spelling(), "jax_export");
        assert_eq!(ResourceState::Lost.spelling(), "lost");
        assert_eq!(ServingState::Draining.spelling(), "draining");
        for kind in ErrorKind::ALL {
            assert_eq!(ErrorKind::parse(kind.spelling()), Some(*kind));
            if *kind != ErrorKind::Cancelled {
                assert!(parse_error_kind(kind.spelling()).is_ok(), "{kind:?}");
            }
        }
        for kind in FunctionKind::ALL {
            assert_eq!(parse_function_kind(kind.spelling()), Ok(kind.proto()));
        }
        assert_eq!(WorkerState::parse("hibernating"), None);
    }
}
