//! What every typed status record (`WorkerStatus`, `Metrics`, `PsStatus`, ...) shares:
//! read-only attributes, `to_dict()` in the shape callers had before the records were
//! typed, and dict-style `record["key"]` / `record.get("key")` for those callers.
//!
//! A record wraps the Rust snapshot it is built from (one `From<&Snapshot>` each) and
//! reads its attributes from it; [`record!`] writes the Python methods.

use pyo3::exceptions::PyKeyError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};

use super::enums::{ErrorKind, FunctionKind, ResourceState, ServingState, WorkerState};

/// Declares a record's `#[pymethods]`: one getter per field (`name: Type = expression`,
/// the expression reading `$s`, the record), `to_dict`, `__getitem__`, `get`, `keys` and
/// `__repr__`. The type itself implements `dict_of` (the dict `to_dict` gives), usually
/// as [`fields_dict`] over `Self::FIELDS`.
macro_rules! record {
    ($ty:ident as $pyname:literal ($s:ident) { $($field:ident: $fty:ty = $value:expr,)+ }) => {
        impl $ty {
            /// The attributes, in the order `to_dict()` and `repr()` list them.
            pub const FIELDS: &'static [&'static str] = &[$(stringify!($field),)+];
        }

        #[pymethods]
        impl $ty {
            $(
                #[getter]
                fn $field(&$s) -> $fty {
                    $value
                }
            )+

            /// The record as the plain dict callers read before it was typed (JSON and
            /// Prometheus export it): enums as their spellings, nested records as dicts.
            fn to_dict<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyDict>> {
                Self::dict_of(slf)
            }

            /// `to_dict()[key]`, for callers written against the dict.
            fn __getitem__<'py>(slf: &Bound<'py, Self>, key: &str) -> PyResult<Bound<'py, PyAny>> {
                $crate::py::record::item(&Self::dict_of(slf)?, $pyname, key)
            }

            /// `to_dict().get(key, default)`, for callers written against the dict.
            #[pyo3(signature = (key, default = None))]
            fn get<'py>(
                slf: &Bound<'py, Self>,
                key: &str,
                default: Option<Bound<'py, PyAny>>,
            ) -> PyResult<Bound<'py, PyAny>> {
                let found = Self::dict_of(slf)?.get_item(key)?;
                Ok(found.or(default).unwrap_or_else(|| slf.py().None().into_bound(slf.py())))
            }

            /// `to_dict().keys()`, so `dict(record)` works as it did on the dict.
            fn keys<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, pyo3::types::PyList>> {
                Ok(Self::dict_of(slf)?.keys())
            }

            fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
                $crate::py::record::repr(slf.as_any(), $pyname, Self::FIELDS)
            }
        }
    };
}

pub(crate) use record;

/// The value under `key` of a record's dict, or a `KeyError` naming the keys there are.
pub(crate) fn item<'py>(
    dict: &Bound<'py, PyDict>,
    record: &str,
    key: &str,
) -> PyResult<Bound<'py, PyAny>> {
    dict.get_item(key)?.ok_or_else(|| {
        let keys: Vec<String> = dict.keys().iter().map(|k| k.to_string()).collect();
        PyKeyError::new_err(format!("{record} has no {key:?}; its keys are {keys:?}"))
    })
}

/// `Name(field=value, ...)` from the record's attributes.
pub(crate) fn repr(record: &Bound<'_, PyAny>, name: &str, fields: &[&str]) -> PyResult<String> {
    let parts = fields
        .iter()
        .map(|field| Ok(format!("{field}={}", record.getattr(*field)?.repr()?)))
        .collect::<PyResult<Vec<_>>>()?;
    Ok(format!("{name}({})", parts.join(", ")))
}

/// The dict of `fields` read as attributes of `record`, each made [`plain`].
pub(crate) fn fields_dict<'py>(
    record: &Bound<'py, PyAny>,
    fields: &[&str],
) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(record.py());
    for field in fields {
        dict.set_item(*field, plain(&record.getattr(*field)?)?)?;
    }
    Ok(dict)
}

/// An attribute value as the old dicts held it: an enum as its spelling, a record as its
/// dict, a list of records as a list of dicts; anything else as it is.
pub(crate) fn plain<'py>(value: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    if value.is_instance_of::<WorkerState>()
        || value.is_instance_of::<ServingState>()
        || value.is_instance_of::<FunctionKind>()
        || value.is_instance_of::<ErrorKind>()
        || value.is_instance_of::<ResourceState>()
    {
        return Ok(value.str()?.into_any());
    }
    if let Ok(list) = value.cast::<PyList>() {
        let items = list
            .iter()
            .map(|item| plain(&item))
            .collect::<PyResult<Vec<_>>>()?;
        return Ok(PyList::new(value.py(), items)?.into_any());
    }
    if !value.is_instance_of::<PyString>() && value.hasattr("to_dict")? {
        return value.call_method0("to_dict");
    }
    Ok(value.clone())
}
