//! The one bridge from Rust `tracing` events to Python `logging`.
//!
//! The dispatcher, the worker and ps servers (and tonic, h2 and hyper underneath) report
//! through `tracing`. Installed as the process's global `tracing` subscriber when `_core`
//! is imported, [`LoggingBridge`] hands each event to the Python logger its target names,
//! so a user configures Rust events exactly like the package's Python log records:
//!
//! | target | Python logger |
//! |---|---|
//! | `jaxcluster.dispatch` (the constants in [`crate::log_target`]) | the same name |
//! | `_core::dispatch::link` (a module path: the default target) | `jaxcluster.dispatch.link` |
//! | `h2::proto`, `tonic::transport`, ... (dependencies) | `jaxcluster.deps.h2.proto`, ... |
//!
//! # Cost
//!
//! Taking the GIL is what an event costs, so most are refused before it:
//!
//! - TRACE is never forwarded ([`Subscriber::max_level_hint`]), so `tracing`'s macros skip
//!   those events on one atomic load; dependencies' DEBUG and INFO callsites are marked
//!   `never` once, when first hit. What is left are this crate's own events (none per
//!   closure above DEBUG) and dependencies' warnings and errors.
//! - Those are checked against the Python logger's effective level, cached per target for
//!   [`LEVEL_TTL`], so a DEBUG event that nobody listens to costs a mutex and a map lookup.
//!   The cache is refreshed (under the GIL) by the first event that finds it stale, or at
//!   once by `_core.refresh_log_levels()`, which Python calls when a coordinator, worker or
//!   ps starts. A level lowered mid-run therefore takes effect within [`LEVEL_TTL`].
//! - An event that passes takes the GIL with `Python::try_attach` (nothing is logged while
//!   the interpreter finalizes), and the logger's own `isEnabledFor` decides last, so
//!   `logging.disable()` and filters hold exactly.
//!
//! # Deadlocks
//!
//! Forwarding takes the GIL on the emitting thread, so this crate emits events only when
//! it holds no lock of its own (the same rule as for Python callbacks, see
//! `docs/ARCHITECTURE.md`). The level cache's mutex is never held while the GIL is taken.
//!
//! `pyo3-log` bridges the `log` crate, not `tracing`, which is what tonic and this crate
//! use; `tracing-subscriber`'s layers add nothing this needs (no spans are kept), so the
//! subscriber is written against `tracing`'s trait directly.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use pyo3::prelude::*;
use pyo3::types::PyDict;
use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber};

/// How long a Python logger's effective level is trusted before it is read again.
pub(crate) const LEVEL_TTL: Duration = Duration::from_secs(1);

/// Where dependencies' events go: under the package's logger, so that configuring
/// `jaxcluster` covers them and nothing lands on unrelated top-level loggers.
const DEPENDENCY_PREFIX: &str = "jaxcluster.deps.";

/// The Python logger name for a `tracing` target.
fn logger_name(target: &str) -> String {
    if target == "jaxcluster" || target.starts_with("jaxcluster.") {
        return target.to_owned();
    }
    if let Some(rest) = target.strip_prefix("_core::") {
        return format!("jaxcluster.{}", rest.replace("::", "."));
    }
    if target == "_core" {
        return "jaxcluster".to_owned();
    }
    format!("{DEPENDENCY_PREFIX}{}", target.replace("::", "."))
}

/// Whether `target` is this crate's (forwarded at every level but TRACE).
fn is_ours(target: &str) -> bool {
    target.starts_with("jaxcluster") || target == "_core" || target.starts_with("_core::")
}

/// Python's number for a `tracing` level.
fn python_level(level: Level) -> i32 {
    match level {
        Level::ERROR => 40,
        Level::WARN => 30,
        Level::INFO => 20,
        Level::DEBUG => 10,
        Level::TRACE => 5,
    }
}

/// One target's cached Python logger and effective level.
struct Cached {
    logger: Py<PyAny>,
    level: i32,
    read_at: Instant,
}

/// The `tracing` subscriber that forwards to Python `logging`; see the module docs.
#[derive(Default)]
pub(crate) struct LoggingBridge {
    /// By `tracing` target (static strings, so the key costs no allocation).
    cache: Mutex<HashMap<&'static str, Cached>>,
}

impl LoggingBridge {
    /// The cached effective level of `target`'s logger if it is fresh.
    fn fresh_level(&self, target: &str) -> Option<i32> {
        let cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        cache
            .get(target)
            .filter(|cached| cached.read_at.elapsed() < LEVEL_TTL)
            .map(|cached| cached.level)
    }

    /// Reads `target`'s logger and level from Python and caches them; `None` when Python
    /// cannot be used (finalizing) or the lookup failed.
    fn refresh(&self, py: Python<'_>, target: &'static str) -> Option<(Py<PyAny>, i32)> {
        let logger = py
            .import("logging")
            .and_then(|logging| logging.call_method1("getLogger", (logger_name(target),)))
            .ok()?;
        let level: i32 = logger
            .call_method0("getEffectiveLevel")
            .and_then(|level| level.extract())
            .ok()?;
        let logger = logger.unbind();
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        let replaced = cache.insert(
            target,
            Cached {
                logger: logger.clone_ref(py),
                level,
                read_at: Instant::now(),
            },
        );
        // A Python object is released only after the lock is: no Python code under it.
        drop(cache);
        drop(replaced);
        Some((logger, level))
    }

    /// The logger for `target`, refreshing a stale cache entry.
    fn logger(&self, py: Python<'_>, target: &'static str) -> Option<Py<PyAny>> {
        {
            let cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(cached) = cache.get(target) {
                if cached.read_at.elapsed() < LEVEL_TTL {
                    return Some(cached.logger.clone_ref(py));
                }
            }
        }
        self.refresh(py, target).map(|(logger, _)| logger)
    }

    /// Marks every cached level stale, so the next event of each target reads it again.
    fn invalidate(&self) {
        let cached =
            std::mem::take(&mut *self.cache.lock().unwrap_or_else(PoisonError::into_inner));
        // Released after the lock is, as in `refresh`.
        drop(cached);
    }

    /// Hands `event` to its Python logger.
    fn forward(&self, event: &Event<'_>) {
        let metadata = event.metadata();
        let mut fields = Fields::default();
        event.record(&mut fields);
        let level = python_level(*metadata.level());
        let ours = is_ours(metadata.target());
        Python::try_attach(|py| {
            let Some(logger) = self.logger(py, metadata.target()) else {
                return;
            };
            // Failures here (a broken handler, a finalizing interpreter) must not reach
            // the Rust thread that logged: the event is dropped, as `logging` itself
            // reports handler errors through `logging.raiseExceptions`.
            let _ = emit(py, logger.bind(py), level, metadata, fields, ours);
        });
    }
}

/// Builds the `LogRecord` (pathname and line of the Rust source, fields as attributes)
/// and hands it to the logger's handlers.
fn emit(
    py: Python<'_>,
    logger: &Bound<'_, PyAny>,
    level: i32,
    metadata: &Metadata<'_>,
    fields: Fields,
    ours: bool,
) -> PyResult<()> {
    if !logger.call_method1("isEnabledFor", (level,))?.is_truthy()? {
        return Ok(());
    }
    let mut message = fields.message;
    if !ours {
        // A dependency's fields are its message's context: keep them visible.
        for (name, value) in &fields.values {
            let _ = write!(message, " {name}={value}");
        }
    }
    let name = logger.getattr("name")?;
    let record = logger.call_method1(
        "makeRecord",
        (
            name,
            level,
            metadata.file().unwrap_or("<rust>"),
            metadata.line().unwrap_or(0),
            message,
            (),
            py.None(),
            metadata.module_path().unwrap_or(""),
        ),
    )?;
    if ours {
        // Structured fields (worker, error, ...) as record attributes, for filters and
        // formatters; never overwriting one `logging` sets itself.
        let attributes = record.getattr("__dict__")?.cast_into::<PyDict>()?;
        for (name, value) in fields.values {
            if !attributes.contains(name)? {
                attributes.set_item(name, value)?;
            }
        }
    }
    logger.call_method1("handle", (record,))?;
    Ok(())
}

/// An event's message and other fields, as text.
#[derive(Default)]
struct Fields {
    message: String,
    values: Vec<(&'static str, String)>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            value.clone_into(&mut self.message);
        } else {
            self.values.push((field.name(), value.to_owned()));
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        } else {
            self.values.push((field.name(), format!("{value:?}")));
        }
    }
}

impl Subscriber for LoggingBridge {
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        // Spans are not forwarded (nothing here keeps them), nor are dependencies' events
        // below WARN: the callsite remembers `never`, so they cost nothing afterwards.
        if metadata.is_span() || (!is_ours(metadata.target()) && *metadata.level() > Level::WARN) {
            Interest::never()
        } else {
            Interest::sometimes()
        }
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(LevelFilter::DEBUG)
    }

    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        if metadata.is_span() {
            return false;
        }
        let level = python_level(*metadata.level());
        match self.fresh_level(metadata.target()) {
            Some(threshold) => level >= threshold,
            // Stale or never read: `event` reads the level and decides there.
            None => true,
        }
    }

    fn event(&self, event: &Event<'_>) {
        let metadata = event.metadata();
        if self.fresh_level(metadata.target()).is_none() {
            // A fresh read, then the pre-filter again (the event may be below it).
            let target = metadata.target();
            let level = python_level(*metadata.level());
            let refreshed = Python::try_attach(|py| self.refresh(py, target).map(|(_, l)| l));
            match refreshed.flatten() {
                Some(threshold) if level >= threshold => {}
                _ => return,
            }
        }
        self.forward(event);
    }

    fn new_span(&self, _span: &Attributes<'_>) -> Id {
        // Never called for a disabled span; spans are all disabled (see `enabled`).
        Id::from_u64(1)
    }

    fn record(&self, _span: &Id, _values: &Record<'_>) {}

    fn record_follows_from(&self, _span: &Id, _follows: &Id) {}

    fn enter(&self, _span: &Id) {}

    fn exit(&self, _span: &Id) {}
}

/// The installed bridge, for [`refresh_log_levels`].
static BRIDGE: OnceLock<Arc<LoggingBridge>> = OnceLock::new();

/// Installs the bridge as the process's global `tracing` subscriber, once. If another
/// library installed one first, events go there instead and this is a no-op.
pub(crate) fn install() {
    BRIDGE.get_or_init(|| {
        let bridge = Arc::new(LoggingBridge::default());
        let _ = tracing::subscriber::set_global_default(Arc::clone(&bridge));
        bridge
    });
}

/// `_core.refresh_log_levels()`: forget the cached Python logger levels, so a logging
/// configuration made just now applies to the next Rust event (not only after
/// [`LEVEL_TTL`]).
#[pyfunction]
pub(crate) fn refresh_log_levels() {
    if let Some(bridge) = BRIDGE.get() {
        bridge.invalidate();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_map_into_the_package_hierarchy() {
        assert_eq!(logger_name("jaxcluster.dispatch"), "jaxcluster.dispatch");
        assert_eq!(
            logger_name("_core::dispatch::link"),
            "jaxcluster.dispatch.link"
        );
        assert_eq!(
            logger_name("h2::proto::streams"),
            "jaxcluster.deps.h2.proto.streams"
        );
        assert!(is_ours("jaxcluster.worker") && is_ours("_core::rpc"));
        assert!(!is_ours("tonic::transport"));
    }
}
