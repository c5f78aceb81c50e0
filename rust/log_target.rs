//! Targets of the `tracing` events this crate emits. Each is also the name of the Python
//! logger that `rust/py/log.rs` forwards its events to, so a target is chosen for the
//! reader of the log, not after the Rust module that emits it.
//!
//! Events are emitted only while the emitting thread holds no lock (forwarding takes the
//! GIL), and never per closure above DEBUG.

/// The coordinator's dispatcher: workers lost, reconnecting, back, given up; closures
/// retried; parameter-server failures.
pub const DISPATCH: &str = "jaxcluster.dispatch";
/// A worker server: draining, refused requests.
pub const WORKER: &str = "jaxcluster.worker";
/// A parameter-server task.
pub const PS: &str = "jaxcluster.ps";
/// Settings read from environment variables (`crate::setting`): a value refused. Any
/// process, coordinator, worker or ps, reads them.
pub const SETTINGS: &str = "jaxcluster.settings";
/// A server's token check (workers and ps tasks): refused requests.
pub const AUTH: &str = "jaxcluster.auth";
