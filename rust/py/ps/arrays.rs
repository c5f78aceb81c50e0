//! numpy arrays <-> protocol tensors, for the ps bindings.
//!
//! An array goes out as one copy into recycled memory (`rpc::wire::recycle`; tonic then
//! frames it without another), or lent without a copy for the length of one blocking call
//! ([`to_tensor_borrowing`]), and
//! comes back as a `bytearray` wrapped by `numpy.frombuffer` (one copy, and the result is
//! writable, as a variable's value read by the user should be). `bfloat16` arrays are the
//! `ml_dtypes` type JAX uses.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::sync::PyOnceLock;
use pyo3::types::{IntoPyDict, PyByteArray, PyTuple};

use super::super::buffer::{borrowed_until_released, recycled_copy_of, Released};
use super::super::errors::new_error;
use crate::ps::tensor::TensorView;
use crate::ps::DType;
use crate::rpc::pb;

static NUMPY: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// The `numpy` module, imported once.
pub(crate) fn numpy(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    Ok(NUMPY
        .get_or_try_init(py, || py.import("numpy").map(Bound::unbind))?
        .bind(py))
}

fn supported() -> String {
    let names: Vec<&str> = DType::ALL.iter().map(|d| d.name()).collect();
    names.join(", ")
}

/// The numpy dtype object for `dtype`.
fn numpy_dtype(py: Python<'_>, dtype: DType) -> PyResult<Bound<'_, PyAny>> {
    if dtype == DType::BF16 {
        let ml_dtypes = py.import("ml_dtypes").map_err(|e| {
            PyTypeError::new_err(format!(
                "reading a bfloat16 variable needs the ml_dtypes package (installed with \
                 JAX): {e}"
            ))
        })?;
        return numpy(py)?
            .getattr("dtype")?
            .call1((ml_dtypes.getattr("bfloat16")?,));
    }
    numpy(py)?.getattr("dtype")?.call1((dtype.name(),))
}

/// Converts any array-like (numpy, JAX, Python numbers and lists) to a tensor. `what` names
/// the value in errors, e.g. "the value for 'w'".
pub(crate) fn to_tensor(value: &Bound<'_, PyAny>, what: &str) -> PyResult<pb::Tensor> {
    Ok(to_tensor_borrowing(value, what, false)?.0)
}

/// [`to_tensor`], sending the array's own memory when `borrow` (no copy), with the
/// [`Released`] the caller must wait on before it returns to Python (so the memory is
/// never read after the call returned). A 64 MiB gradient's copy was a third of the
/// caller's CPU per update, and on a 16-core machine the difference between 0.40–0.45×
/// and 0.54–0.65× a TCP echo of its bytes.
pub(crate) fn to_tensor_borrowing(
    value: &Bound<'_, PyAny>,
    what: &str,
    borrow: bool,
) -> PyResult<(pb::Tensor, Option<Released>)> {
    let py = value.py();
    // asarray(order="C"), not ascontiguousarray: the latter turns a 0-d array into 1-d.
    let kwargs = [("order", "C")].into_py_dict(py)?;
    let array = numpy(py)?.call_method("asarray", (value,), Some(&kwargs))?;
    let dtype_obj = array.getattr("dtype")?;
    let name: String = dtype_obj.getattr("name")?.extract()?;
    let Some(dtype) = DType::from_name(&name) else {
        return Err(PyTypeError::new_err(format!(
            "{what} has dtype {name}; a ps variable holds one of {} (convert the value, e.g. \
             with .astype('float32'))",
            supported()
        )));
    };
    // The wire is little-endian; only a '>'-ordered array needs a byte swap.
    let order: String = dtype_obj.getattr("str")?.extract()?;
    let array = if order.starts_with('>') {
        let little = dtype_obj.call_method1("newbyteorder", ("<",))?;
        array.call_method1("astype", (little,))?
    } else {
        array
    };
    let shape: Vec<u64> = array.getattr("shape")?.extract()?;
    // Copied into recycled memory unless borrowed (the caller may change the array after
    // the call), or lent until the call is done with it.
    let take = |obj: &Bound<'_, PyAny>| {
        if borrow {
            borrowed_until_released(obj).map(|(bytes, released)| (bytes, Some(released)))
        } else {
            recycled_copy_of(obj).map(|bytes| (bytes, None))
        }
    };
    let (data, released) = match take(&array) {
        Ok(taken) => taken,
        // numpy exports no buffer of an extension dtype (bfloat16); its bytes as uint8 it does.
        Err(_) => take(
            &array
                .call_method1("reshape", (-1,))?
                .call_method1("view", ("u1",))?,
        )?,
    };
    let tensor = pb::Tensor {
        dtype: dtype.to_pb().into(),
        shape,
        data,
    };
    Ok((tensor, released))
}

/// Row indices for `scatter_add`: an integer scalar or 1-D array-like, as `i64`s.
pub(crate) fn to_indices(indices: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
    let py = indices.py();
    let array = numpy(py)?.call_method1("asarray", (indices,))?;
    let kind: String = array.getattr("dtype")?.getattr("kind")?.extract()?;
    let ndim: usize = array.getattr("ndim")?.extract()?;
    let size: usize = array.getattr("size")?.extract()?;
    if size == 0 && ndim == 1 {
        return Ok(Vec::new());
    }
    if !matches!(kind.as_str(), "i" | "u") || ndim > 1 {
        let described: String = array.getattr("dtype")?.getattr("name")?.extract()?;
        return Err(PyTypeError::new_err(format!(
            "scatter_add indices are {described} with {ndim} dimensions; expected an integer \
             scalar or 1-D integer array of row numbers"
        )));
    }
    let flat = array
        .call_method1("astype", ("<i8",))?
        .call_method1("reshape", (-1,))?;
    let raw: PyBackedBytes = flat.call_method0("tobytes")?.extract()?;
    Ok(raw
        .chunks_exact(8)
        .map(|c| {
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(c);
            i64::from_le_bytes(bytes)
        })
        .collect())
}

/// A writable numpy array holding a copy of `tensor`.
pub(crate) fn to_array<'py>(py: Python<'py>, tensor: &pb::Tensor) -> PyResult<Bound<'py, PyAny>> {
    let view = TensorView::from_pb(tensor, "the ps's answer").map_err(|e| {
        new_error(
            py,
            "InternalError",
            format!("the ps answered with a malformed tensor: {e}"),
        )
    })?;
    let buffer = PyByteArray::new(py, view.data);
    let flat = numpy(py)?.call_method1("frombuffer", (buffer, numpy_dtype(py, view.dtype)?))?;
    flat.call_method1("reshape", (PyTuple::new(py, &view.shape)?,))
}

/// A protocol tensor missing from an answer that must carry one.
pub(crate) fn missing(py: Python<'_>, what: &str) -> PyErr {
    new_error(
        py,
        "InternalError",
        format!("the ps answered without {what} (a bug in the ps)"),
    )
}

/// `ValueError` for a name that cannot be a variable.
pub(crate) fn check_name(name: &str) -> PyResult<()> {
    if name.is_empty() {
        return Err(PyValueError::new_err(
            "a variable name is empty; expected a non-empty string",
        ));
    }
    Ok(())
}
