//! `jaxcluster.DeviceSpec` and the TPU device-map functions, over [`crate::device`].
//!
//! The class stores the Rust spec and builds Python strings only when asked: a
//! `DeviceSpec.from_string` call from a Python loop is one parse and one object allocation.

use std::collections::BTreeMap;

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyFloat, PyInt, PyString, PyTuple};

use crate::device::{self, intern, normalize_device_type, DeviceSpec, Field, IndexProblem, Name};

/// An immutable TF device spec (`/job:<name>/replica:<int>/task:<int>/device:<TYPE>:<int|*>`).
#[pyclass(frozen, module = "jaxcluster._core", name = "DeviceSpec")]
pub struct PyDeviceSpec {
    spec: DeviceSpec,
    /// `to_string()`, built on first use and shared by `__hash__` and `__eq__`.
    text: PyOnceLock<Py<PyString>>,
}

impl PyDeviceSpec {
    fn wrap(spec: DeviceSpec) -> Self {
        PyDeviceSpec {
            spec,
            text: PyOnceLock::new(),
        }
    }

    fn text<'py>(&self, py: Python<'py>) -> &Bound<'py, PyString> {
        self.text
            .get_or_init(py, || PyString::new(py, &self.spec.render()).unbind())
            .bind(py)
    }
}

const FIELDS: [&str; 5] = ["job", "replica", "task", "device_type", "device_index"];

#[pymethods]
impl PyDeviceSpec {
    #[new]
    #[pyo3(signature = (job=None, replica=None, task=None, device_type=None, device_index=None))]
    fn new(
        job: Option<&Bound<'_, PyAny>>,
        replica: Option<&Bound<'_, PyAny>>,
        task: Option<&Bound<'_, PyAny>>,
        device_type: Option<&Bound<'_, PyAny>>,
        device_index: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        Ok(Self::wrap(DeviceSpec {
            job: name_arg(job)?,
            replica: index_arg(replica, Field::Replica)?,
            task: index_arg(task, Field::Task)?,
            device_type: device_type_arg(device_type)?,
            device_index: index_arg(device_index, Field::DeviceIndex)?,
        }))
    }

    /// Parses a TF device string such as `/job:worker/task:0/device:GPU:0`.
    // A staticmethod, not TF's classmethod: the class cannot be subclassed, and this saves
    // binding a method object on every call.
    #[staticmethod]
    fn from_string(spec: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        parse_arg(spec).map(Self::wrap)
    }

    /// Returns a new spec parsed from `spec`; `self` is unchanged (TF 2.x semantics).
    #[allow(clippy::unused_self)]
    fn parse_from_string(&self, spec: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        parse_arg(spec).map(Self::wrap)
    }

    fn to_string(&self, py: Python<'_>) -> Py<PyString> {
        self.text(py).clone().unbind()
    }

    fn make_merged_spec(&self, dev: &Bound<'_, PyDeviceSpec>) -> Self {
        Self::wrap(self.spec.merged(&dev.get().spec))
    }

    #[pyo3(signature = (**fields))]
    fn replace(&self, fields: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let Some(fields) = fields else {
            return Ok(Self::wrap(self.spec.clone()));
        };
        let mut spec = self.spec.clone();
        for (key, value) in fields.iter() {
            let key: String = key.extract()?;
            let value = (!value.is_none()).then_some(&value);
            match key.as_str() {
                "job" => spec.job = name_arg(value)?,
                "replica" => spec.replica = index_arg(value, Field::Replica)?,
                "task" => spec.task = index_arg(value, Field::Task)?,
                "device_type" => spec.device_type = device_type_arg(value)?,
                "device_index" => spec.device_index = index_arg(value, Field::DeviceIndex)?,
                other => {
                    return Err(PyTypeError::new_err(format!(
                        "DeviceSpec.replace() got an unknown field {other:?}; expected some of {}",
                        FIELDS.join(", ")
                    )))
                }
            }
        }
        Ok(Self::wrap(spec))
    }

    #[getter]
    fn job(&self) -> Option<&str> {
        self.spec.job.as_deref()
    }

    #[getter]
    fn replica(&self) -> Option<u64> {
        self.spec.replica
    }

    #[getter]
    fn task(&self) -> Option<u64> {
        self.spec.task
    }

    #[getter]
    fn device_type(&self) -> Option<&str> {
        self.spec.device_type.as_deref()
    }

    #[getter]
    fn device_index(&self) -> Option<u64> {
        self.spec.device_index
    }

    /// Equal when `to_string()` is, as in TF (so `device_index` without a type is ignored).
    fn __eq__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<bool> {
        let Ok(other) = other.cast::<PyDeviceSpec>() else {
            return Ok(false);
        };
        let other = other.get();
        if self.spec == other.spec {
            return Ok(true);
        }
        Ok(self.text(py).to_str()? == other.text(py).to_str()?)
    }

    fn __hash__(&self, py: Python<'_>) -> PyResult<isize> {
        self.text(py).hash()
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let mut parts = Vec::with_capacity(FIELDS.len());
        if let Some(job) = &self.spec.job {
            parts.push(format!("job={}", PyString::new(py, job).repr()?));
        }
        for (name, value) in [("replica", self.spec.replica), ("task", self.spec.task)] {
            if let Some(value) = value {
                parts.push(format!("{name}={value}"));
            }
        }
        if let Some(kind) = &self.spec.device_type {
            parts.push(format!("device_type={}", PyString::new(py, kind).repr()?));
        }
        if let Some(index) = self.spec.device_index {
            parts.push(format!("device_index={index}"));
        }
        Ok(format!("DeviceSpec({})", parts.join(", ")))
    }

    /// Pickles as the constructor call with the five fields.
    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        let spec = &slf.get().spec;
        let args = (
            spec.job.as_deref(),
            spec.replica,
            spec.task,
            spec.device_type.as_deref(),
            spec.device_index,
        )
            .into_pyobject(slf.py())?;
        Ok((slf.get_type().into_any(), args))
    }
}

fn parse_arg(spec: Option<&Bound<'_, PyAny>>) -> PyResult<DeviceSpec> {
    // TF treats None as the empty spec.
    let Some(spec) = spec else {
        return Ok(DeviceSpec::default());
    };
    let Ok(text) = spec.cast::<PyString>() else {
        return Err(PyTypeError::new_err(format!(
            "DeviceSpec.from_string expects a str such as '/job:worker/task:0/device:GPU:0', got \
             {} {}",
            spec.get_type().name()?,
            spec.repr()?
        )));
    };
    let text = text.to_str().map_err(|_| {
        PyValueError::new_err(format!(
            "device spec {} contains a lone surrogate, so it is not valid Unicode text; expected \
             a device name such as '/job:worker/task:0/device:GPU:0'",
            spec.repr()
                .map_or_else(|_| "?".to_owned(), |r| r.to_string())
        ))
    })?;
    DeviceSpec::parse(text).map_err(|err| PyValueError::new_err(err.to_string()))
}

/// `job` becomes `str` as in TF (`str(value)` for non-strings).
fn name_arg(value: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Name>> {
    value
        .map(|value| Ok(intern(text_arg(value, "job")?.to_str()?)))
        .transpose()
}

/// `device_type` becomes `str` too, with `cpu`/`gpu` upper-cased.
fn device_type_arg(value: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Name>> {
    value
        .map(|value| {
            let text = text_arg(value, "device_type")?;
            Ok(intern(normalize_device_type(text.to_str()?)))
        })
        .transpose()
}

/// `value` as a `str` that is valid UTF-8 (no lone surrogates).
fn text_arg<'py>(value: &Bound<'py, PyAny>, field: &str) -> PyResult<Bound<'py, PyString>> {
    let text = match value.cast::<PyString>() {
        Ok(text) => text.clone(),
        Err(_) => value.str()?,
    };
    match text.to_str() {
        Ok(_) => Ok(text),
        Err(_) => Err(PyValueError::new_err(format!(
            "DeviceSpec {field} {} contains a lone surrogate, so it is not valid Unicode text; \
             expected a name such as 'worker'",
            text.repr()?
        ))),
    }
}

/// `replica`, `task` and `device_index` accept ints and int-like strings, as TF's `int()`.
fn index_arg(value: Option<&Bound<'_, PyAny>>, field: Field) -> PyResult<Option<u64>> {
    let Some(value) = value else {
        return Ok(None);
    };
    let problem = if let Ok(text) = value.cast::<PyString>() {
        match device::parse_index(text.to_str()?) {
            Ok(index) => return Ok(Some(index)),
            Err(problem) => problem,
        }
    } else if value.is_instance_of::<PyInt>() {
        if let Ok(index) = value.extract::<u64>() {
            return Ok(Some(index));
        }
        if value.lt(0)? {
            IndexProblem::Negative
        } else {
            IndexProblem::TooLarge
        }
    } else if let Ok(number) = value.cast::<PyFloat>() {
        let number = number.value();
        if number.fract() == 0.0 && (0.0..18_446_744_073_709_551_616.0).contains(&number) {
            return Ok(Some(number as u64));
        }
        if number < 0.0 {
            IndexProblem::Negative
        } else {
            IndexProblem::NotAnInteger
        }
    } else if let Ok(index) = value.extract::<u64>() {
        // Objects with __index__ (numpy integers, ...).
        return Ok(Some(index));
    } else {
        return Err(PyTypeError::new_err(format!(
            "DeviceSpec {field} must be an int or an int-like string, got {} {}",
            value.get_type().name()?,
            value.repr()?
        )));
    };
    Err(PyValueError::new_err(format!(
        "DeviceSpec {field} {} {problem}; expected a non-negative integer or an int-like string \
         such as '3'",
        value.repr()?
    )))
}

/// Groups TPU device names by host: `({host: sorted core ids}, total cores)`.
#[pyfunction]
fn tpu_device_map(names: &Bound<'_, PyAny>) -> PyResult<(BTreeMap<u64, Vec<u64>>, usize)> {
    if names.is_instance_of::<PyString>() {
        return Err(PyTypeError::new_err(format!(
            "tpu_device_map expects an iterable of device names, got the single str {}; wrap it \
             in a list",
            names.repr()?
        )));
    }
    let mut texts: Vec<Bound<'_, PyString>> = Vec::new();
    for item in names.try_iter()? {
        let item = item?;
        match item.cast_into::<PyString>() {
            Ok(text) => texts.push(text),
            Err(err) => {
                let item = err.into_inner();
                return Err(PyTypeError::new_err(format!(
                    "tpu_device_map expects device names as str, got {} {}",
                    item.get_type().name()?,
                    item.repr()?
                )));
            }
        }
    }
    let names = texts
        .iter()
        .map(|t| t.to_str())
        .collect::<PyResult<Vec<&str>>>()?;
    let map = device::tpu_device_map(names).map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok((map.hosts, map.total_cores))
}

/// Returns the core count every host shares, or raises `RuntimeError` naming the hosts.
#[pyfunction]
fn verify_same_core_count(device_map: &Bound<'_, PyAny>) -> PyResult<usize> {
    let items = device_map.call_method0("items").map_err(|_| {
        PyTypeError::new_err(format!(
            "verify_same_core_count expects a mapping of host id to core ids, as \
             tpu_device_map returns, got {}",
            device_map
                .get_type()
                .name()
                .map_or_else(|_| "?".to_owned(), |n| n.to_string())
        ))
    })?;
    let mut counts = Vec::new();
    for item in items.try_iter()? {
        let (host, cores): (Bound<'_, PyAny>, Bound<'_, PyAny>) = item?.extract()?;
        let host_id = host.extract::<u64>().map_err(|_| {
            PyTypeError::new_err(format!(
                "verify_same_core_count: host id {} is not a non-negative int",
                host.repr()
                    .map_or_else(|_| "?".to_owned(), |r| r.to_string())
            ))
        })?;
        counts.push((host_id, cores.len()?));
    }
    device::verify_same_core_count(counts).map_err(|e| PyRuntimeError::new_err(e.to_string()))
}

/// Adds `DeviceSpec`, `tpu_device_map` and `verify_same_core_count` to `_core`.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyDeviceSpec>()?;
    m.add_function(wrap_pyfunction!(tpu_device_map, m)?)?;
    m.add_function(wrap_pyfunction!(verify_same_core_count, m)?)?;
    Ok(())
}
