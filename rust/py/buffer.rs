//! `jaxcluster._core.Buffer`: bytes held by Rust, shown to Python through the buffer
//! protocol without a copy, and the one conversion of Python buffers into [`Bytes`].
//!
//! Why it exists: profiling a 16 MiB round trip (see `docs/ARCHITECTURE.md`, "Arrays at wire
//! speed") found most of its CPU time in copies at this boundary: `bytes(...)` of every
//! received buffer and `.tobytes()` of every buffer sent, each into fresh memory that the
//! kernel had to fault in page by page. A `Buffer` lets `numpy.frombuffer` read a received
//! array where it was received, and lets a buffer that is already immutable (a received
//! array sent back, a `jax.Array`'s host memory, `bytes`) be sent without being copied.
//!
//! This is the crate's `unsafe` code (besides the one forwarding `BufMut` implementation in
//! `rpc/wire/frames.rs`): exporting memory through the buffer protocol and reading an
//! exporter's memory are raw-pointer operations by definition. Both need
//! the limited API of Python 3.11 (`abi3-py311`).
#![allow(unsafe_code)]

use std::ffi::{c_int, c_void};

use bytes::Bytes;
use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::{PyBytes, PyList};

use crate::rpc::wire::recycle;

/// Read-only bytes owned by Rust, exposed through the buffer protocol (see `_core.pyi`).
#[pyclass(frozen, module = "jaxcluster._core", name = "Buffer")]
pub struct PyBuffer {
    bytes: Bytes,
}

impl PyBuffer {
    /// A buffer over `bytes` (no copy).
    pub(crate) fn new(bytes: Bytes) -> Self {
        Self { bytes }
    }
}

/// Memory of a Python object that never changes while the object is referenced: the
/// object, kept alive, and where its bytes are. Dropping it without the GIL defers the
/// reference count decrement to `PyO3`'s pool (done the next time any thread holds the GIL),
/// so tokio threads never wait for the GIL.
struct Borrowed {
    _owner: Py<PyAny>,
    ptr: *const u8,
    len: usize,
    /// Dropped with the last `Bytes` over this memory, which tells a [`Released`] waiting
    /// for that (its channel disconnects).
    _released: Option<std::sync::mpsc::Sender<()>>,
}

// SAFETY: the pointer is only read, and the memory it points to is immutable and kept
// alive by `_owner` (a `memoryview` holding an export of the exporter), whatever thread
// holds this.
unsafe impl Send for Borrowed {}

impl AsRef<[u8]> for Borrowed {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `ptr..ptr + len` is the memory of the export `_owner` holds (see
        // `memory_of`), which stays valid and unchanged until `_owner` is released.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// Where `obj`'s bytes are: the pointer and length of a C-contiguous export of it. The
/// export is released before returning, so the caller must hold something that keeps the
/// memory valid (an export of its own, e.g. a `memoryview`).
fn memory_of(obj: &Bound<'_, PyAny>) -> PyResult<(*const u8, usize)> {
    let mut view = std::mem::MaybeUninit::<ffi::Py_buffer>::uninit();
    // SAFETY: `view` is written by a successful PyObject_GetBuffer and released once read.
    unsafe {
        if ffi::PyObject_GetBuffer(obj.as_ptr(), view.as_mut_ptr(), ffi::PyBUF_C_CONTIGUOUS) != 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        let view = view.assume_init_mut();
        let memory = (
            view.buf as *const u8,
            usize::try_from(view.len).unwrap_or(0),
        );
        ffi::PyBuffer_Release(view);
        Ok(memory)
    }
}

/// `obj`'s memory as `Bytes`, without copying: the caller vouches that it never changes
/// while it is referenced (a `jax.Array`'s host view, `bytes`, an array made for this call
/// alone). The `Bytes` keep a `memoryview` of `obj`, which holds an export until released
/// and so pins the memory (a bytearray cannot be resized under it).
pub(crate) fn borrowed(obj: &Bound<'_, PyAny>) -> PyResult<Bytes> {
    borrowed_watched(obj, None)
}

/// `obj`'s memory as `Bytes` without copying, and a [`Released`] that says when no `Bytes`
/// over it is left: a caller lending memory that *can* change (a writable numpy array)
/// to one blocking call waits for that before returning, so the memory is never read
/// after the call returned, whatever ended it (an answer, a deadline, an interrupt).
pub(crate) fn borrowed_until_released(obj: &Bound<'_, PyAny>) -> PyResult<(Bytes, Released)> {
    let (sender, receiver) = std::sync::mpsc::channel();
    let bytes = borrowed_watched(obj, Some(sender))?;
    Ok((bytes, Released(receiver)))
}

fn borrowed_watched(
    obj: &Bound<'_, PyAny>,
    released: Option<std::sync::mpsc::Sender<()>>,
) -> PyResult<Bytes> {
    let py = obj.py();
    if let Ok(buffer) = obj.cast::<PyBuffer>() {
        return Ok(buffer.get().bytes.clone()); // immutable: nothing to wait for
    }
    let view = py
        .import(pyo3::intern!(py, "builtins"))?
        .getattr(pyo3::intern!(py, "memoryview"))?
        .call1((obj,))?;
    let (ptr, len) = memory_of(&view)?;
    if len == 0 {
        return Ok(Bytes::new());
    }
    Ok(Bytes::from_owner(Borrowed {
        _owner: view.unbind(),
        ptr,
        len,
        _released: released,
    }))
}

/// Tells when memory lent by [`borrowed_until_released`] is no longer referenced.
pub(crate) struct Released(std::sync::mpsc::Receiver<()>);

impl Released {
    /// Blocks until no `Bytes` over the lent memory is left, at most `limit` (call it with
    /// the GIL released); `false` if some still is. HTTP/2 lets go of a request's data
    /// once written, or at once when the call is cancelled, so this returns at once after
    /// an answer and within a frame's write after a deadline.
    pub(crate) fn wait(&self, limit: std::time::Duration) -> bool {
        !matches!(
            self.0.recv_timeout(limit),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout)
        )
    }
}

/// A copy of `obj`'s bytes (any C-contiguous buffer exporter).
fn copy_of(obj: &Bound<'_, PyAny>) -> PyResult<Bytes> {
    let mut view = std::mem::MaybeUninit::<ffi::Py_buffer>::uninit();
    // SAFETY: as in `memory_of`; the slice is copied before the export is released.
    unsafe {
        if ffi::PyObject_GetBuffer(obj.as_ptr(), view.as_mut_ptr(), ffi::PyBUF_C_CONTIGUOUS) != 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        let view = view.assume_init_mut();
        let len = usize::try_from(view.len).unwrap_or(0);
        let copied = if len == 0 {
            Bytes::new()
        } else {
            Bytes::copy_from_slice(std::slice::from_raw_parts(view.buf as *const u8, len))
        };
        ffi::PyBuffer_Release(view);
        Ok(copied)
    }
}

/// A copy of `obj`'s bytes (any C-contiguous buffer exporter) in a buffer of
/// `rpc::wire::recycle`: a large array sent again and again (a gradient each step) is
/// copied into memory already mapped, not into fresh pages the kernel faults in.
pub(crate) fn recycled_copy_of(obj: &Bound<'_, PyAny>) -> PyResult<Bytes> {
    let mut view = std::mem::MaybeUninit::<ffi::Py_buffer>::uninit();
    // SAFETY: as in `copy_of`.
    unsafe {
        if ffi::PyObject_GetBuffer(obj.as_ptr(), view.as_mut_ptr(), ffi::PyBUF_C_CONTIGUOUS) != 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        let view = view.assume_init_mut();
        let len = usize::try_from(view.len).unwrap_or(0);
        let mut copied = recycle::take(len);
        if len > 0 {
            copied.extend_from_slice(std::slice::from_raw_parts(view.buf as *const u8, len));
        }
        ffi::PyBuffer_Release(view);
        Ok(recycle::freeze(copied))
    }
}

#[pymethods]
impl PyBuffer {
    /// Wraps an object whose memory never changes while it is referenced (a `jax.Array`'s
    /// host view, `bytes`, a read-only mapping), without copying: sending the result sends
    /// that memory.
    #[staticmethod]
    fn borrow(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        borrowed(obj).map(Self::new)
    }

    /// The part of this buffer that `view` (a buffer exporter over this buffer's memory,
    /// e.g. a numpy array made by `numpy.frombuffer(self)`) covers, without copying.
    fn within(&self, view: &Bound<'_, PyAny>) -> PyResult<Self> {
        let (ptr, len) = memory_of(view)?;
        let start = self.bytes.as_ptr() as usize;
        let offset = (ptr as usize).wrapping_sub(start);
        if ptr as usize >= start && offset + len <= self.bytes.len() {
            return Ok(Self::new(self.bytes.slice(offset..offset + len)));
        }
        Err(PyValueError::new_err(format!(
            "Buffer.within(): the {len}-byte view does not lie inside this {}-byte buffer; \
             expected a view of this buffer's memory",
            self.bytes.len()
        )))
    }

    fn __len__(&self) -> usize {
        self.bytes.len()
    }

    fn __bytes__<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.bytes)
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        if let Ok(buffer) = other.cast::<PyBuffer>() {
            return buffer.get().bytes == self.bytes;
        }
        copy_of(other).is_ok_and(|bytes| bytes == self.bytes)
    }

    fn __repr__(&self) -> String {
        format!("Buffer(<{} bytes>)", self.bytes.len())
    }

    /// Exports the bytes read-only; a request for a writable buffer fails.
    #[allow(clippy::needless_pass_by_value)] // the signature PyO3 requires
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        if flags & ffi::PyBUF_WRITABLE != 0 {
            return Err(PyBufferError::new_err(
                "a jaxcluster Buffer is read-only (it may be shared with the network layer); \
                 copy it (e.g. numpy.array(numpy.frombuffer(buf))) to modify it",
            ));
        }
        let bytes = &slf.get().bytes;
        // SAFETY: `view` is the caller's Py_buffer to fill; PyBuffer_FillInfo takes a new
        // reference to `slf`, which owns `bytes`, so the memory outlives the export, and
        // it is exported read-only (never written through).
        let filled = unsafe {
            ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                bytes.as_ptr().cast_mut().cast::<c_void>(),
                isize::try_from(bytes.len()).unwrap_or(isize::MAX),
                1,
                flags,
            )
        };
        if filled != 0 {
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }
}

/// `Buffer`s over `items`, for a value's out-of-band buffers (no copy).
pub(crate) fn buffer_list<'py>(py: Python<'py>, items: &[Bytes]) -> PyResult<Bound<'py, PyList>> {
    PyList::new(
        py,
        items
            .iter()
            .map(|bytes| PyBuffer::new(bytes.clone()))
            .collect::<Vec<_>>(),
    )
}

/// A buffer to send, as `Bytes`: a `Buffer` or `bytes` without copying (their memory never
/// changes), any other bytes-like object (numpy array, `memoryview`, `PickleBuffer`,
/// `bytearray`) copied, so that changing it after the call cannot change what is sent.
/// `what` names the argument in the error for an object that is not bytes-like.
pub(crate) fn bytes_of(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Bytes> {
    if let Ok(buffer) = obj.cast::<PyBuffer>() {
        return Ok(buffer.get().bytes.clone());
    }
    if obj.is_instance_of::<PyBytes>() {
        return Ok(Bytes::from_owner(obj.extract::<PyBackedBytes>()?));
    }
    copy_of(obj).map_err(|e| {
        PyValueError::new_err(format!(
            "{what} must be bytes-like (bytes, bytearray, memoryview, PickleBuffer, a \
             C-contiguous array, jaxcluster Buffer), got an object of type {}: {e}",
            obj.get_type()
                .name()
                .map_or_else(|_| "<unknown>".to_owned(), |n| n.to_string())
        ))
    })
}

/// [`bytes_of`] for every item of a sequence.
pub(crate) fn bytes_of_all(items: &[Bound<'_, PyAny>], what: &str) -> PyResult<Vec<Bytes>> {
    items.iter().map(|item| bytes_of(item, what)).collect()
}
