//! Python arguments to Rust values, for the settings and payloads several bindings take.

use std::time::{Duration, Instant};

use bytes::Bytes;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;

use crate::rpc::server::connections::ServerLimits;
use crate::rpc::ClientConfig;

/// The longest time in seconds a binding waits (about 3,170 years): longer than any real
/// wait, and within what every consumer of a deadline holds (tonic's `grpc-timeout` header
/// panics past 99,999,999 hours, `Instant + Duration` past the clock's range). A longer
/// finite time is taken as this one, which is what it means in practice: forever.
pub(crate) const LONGEST_SECONDS: f64 = 1e11;

/// Converts a Python timeout in seconds (`None`: no limit) to a `Duration`, at most
/// [`LONGEST_SECONDS`].
pub(crate) fn duration(seconds: Option<f64>, what: &str) -> PyResult<Option<Duration>> {
    match seconds {
        None => Ok(None),
        Some(s) if s.is_finite() && s >= 0.0 => {
            Ok(Some(Duration::from_secs_f64(s.min(LONGEST_SECONDS))))
        }
        Some(s) => Err(PyValueError::new_err(format!(
            "{what}={s} is not a valid timeout; expected a non-negative number of seconds or None"
        ))),
    }
}

/// The connection settings every client constructor takes (`WorkerClient`, `PsClient`), so
/// they are checked the same way and in the same order.
pub(crate) fn client_config(
    address: String,
    auth_token: Option<String>,
    connect_timeout: f64,
    max_message_bytes: usize,
    tls_ca: Option<Vec<u8>>,
    tls_domain: Option<String>,
) -> PyResult<ClientConfig> {
    let mut config = ClientConfig::new(address);
    config.tls =
        crate::rpc::security::tls::client_tls(tls_ca, tls_domain).map_err(PyValueError::new_err)?;
    config.auth_token = auth_token;
    config.max_message_bytes = max_message_bytes;
    config.connect_timeout =
        duration(Some(connect_timeout), "connect_timeout")?.unwrap_or_default();
    Ok(config)
}

/// Hands an argument's buffer to `Bytes` without another copy; the buffer stays alive as
/// long as the `Bytes` does.
pub(crate) fn to_bytes(data: PyBackedBytes) -> Bytes {
    Bytes::from_owner(data)
}

/// A server's [`ServerLimits`] from the Python arguments, checked.
pub(crate) fn server_limits(
    max_connections: usize,
    max_streams_per_connection: u32,
    handshake_timeout: f64,
) -> PyResult<ServerLimits> {
    let handshake_timeout =
        duration(Some(handshake_timeout), "handshake_timeout")?.unwrap_or_default();
    ServerLimits {
        max_connections,
        max_streams_per_connection,
        handshake_timeout,
    }
    .validate()
    .map_err(PyValueError::new_err)
}

/// A Python timeout in seconds as a deadline; `None` means none.
pub(crate) fn deadline_after(timeout: Option<f64>, what: &str) -> PyResult<Option<Instant>> {
    if timeout == Some(f64::INFINITY) {
        return Ok(None);
    }
    let timeout = duration(timeout, &format!("{what}(): timeout"))?;
    Ok(timeout.and_then(|timeout| Instant::now().checked_add(timeout)))
}
