//! The coordinator <-> worker and ps protocol. Nothing here knows Python exists; `rust/py`
//! wraps it. The generated messages and service stubs ([`pb`]) and the protocol's small
//! shared facts (revision, hashes, incarnations) live in this file; the rest is in four
//! rooms, one job each:
//!
//! - [`wire`]: what crosses the wire and what it means: framing that never copies an
//!   array (`frames`), values above the message limit as chunks (`chunks`), size limits
//!   and flow-control windows (`limits`), the names of codes and kinds (`codes`), and the
//!   one mapping between `tonic::Status` and [`RpcError`] (`status`).
//! - [`security`]: who may talk to whom: the bearer token, checked by servers and sent by
//!   clients (`auth`), and optional TLS for both (`tls`).
//! - [`server`]: what the worker and ps servers share: binding and serving (`serve`) and
//!   the admission of connections (`connections`).
//! - [`client`]: what the coordinator calls with: the shared channel and deadline
//!   (`channel`), a call sent whole or in chunks (`chunked`), the [`WorkerClient`]
//!   (`worker`), its `RunClosures` stream (`closure_stream`) and that stream emulated over
//!   unary calls (`emulated`).
//!
//! The servers themselves are `crate::worker` and `crate::ps`, which build on these rooms.

pub mod client;
pub mod security;
pub mod server;
pub mod wire;

pub use client::{ClientConfig, ClosureChannel, WorkerClient};
pub use wire::status::RpcError;

/// Messages and service stubs generated from `protos/jaxcluster/v1/worker.proto`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod pb {
    tonic::include_proto!("jaxcluster.v1");
}

/// Length of a function's content hash (SHA-256) in bytes.
pub const HASH_LEN: usize = 32;

/// Revision of the v1 protocol this build speaks (`GetStatusResponse.protocol_revision`).
/// Revision 2 added `ClosureError.ps_task`; revision 3 added the `RunClosures` stream;
/// revision 4 added heartbeats and leases on `RunClosures`, `GetStatusResponse.previous_exit`
/// and the connection counters; revision 5 added the ps's `ApplyUpdate` (optimizers applied
/// on the parameter server); revision 6 added `OptimizerSpec.amsgrad` and made
/// `OptimizerSpec.weight_decay` apply to every kind, not only `AdamW`.
pub const PROTOCOL_REVISION: u32 = 6;

/// Response metadata of `RunClosures` naming the worker's protocol revision, so a client
/// knows before sending anything large whether the worker assembles chunked requests.
pub const REVISION_HEADER: &str = "jaxcluster-protocol-revision";

/// The HTTP/2 path of `RunClosures`, which both halves serve with `frames.rs` rather than
/// tonic's codec (the generated service keeps the method, for any other gRPC client).
pub const RUN_CLOSURES_PATH: &str = "/jaxcluster.v1.Worker/RunClosures";

/// The HTTP/2 paths of the two services' `CallChunked`, which clients send framed by
/// `frames.rs` (`rpc::client::framed`), so a chunk of an array is written from its memory.
pub const WORKER_CALL_CHUNKED_PATH: &str = "/jaxcluster.v1.Worker/CallChunked";
/// See [`WORKER_CALL_CHUNKED_PATH`].
pub const PS_CALL_CHUNKED_PATH: &str = "/jaxcluster.v1.ParameterServer/CallChunked";

/// A random number, never 0, drawn once per server (worker or ps) so that clients can
/// tell a restarted process from the one before: its `pid` cannot, since in a container
/// every task's main process is pid 1. `RandomState` is seeded from the operating
/// system's randomness; the pid and the clock are hashed in too, so two servers started
/// in one process differ as well.
pub fn new_incarnation() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    hasher.finish().max(1)
}

/// Seconds since the Unix epoch now: the clock a `PreemptionNotice` deadline is read
/// against (each side's own; clocks of one cluster agree to well under a second).
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// A preemption deadline (seconds since the Unix epoch, 0: none) for log lines:
/// `"deadline in 28.0 s"` or `"no deadline given"`.
pub fn describe_deadline(deadline: f64) -> String {
    if deadline > 0.0 {
        format!("deadline in {:.1} s", deadline - unix_now())
    } else {
        "no deadline given".to_owned()
    }
}

/// The content hash of a function payload: its SHA-256 digest.
///
/// ```
/// let h = _core::rpc::content_hash(b"abc");
/// assert_eq!(h[0], 0xba);
/// ```
pub fn content_hash(payload: &[u8]) -> [u8; HASH_LEN] {
    use sha2::Digest;
    sha2::Sha256::digest(payload).into()
}

/// Lowercase hex of `bytes`, for messages that name a hash or show a payload's first
/// bytes. Here because both ends of the protocol (the worker's checks, the dispatcher's
/// registry) quote hashes in their errors and must spell them alike.
///
/// ```
/// assert_eq!(_core::rpc::hex(&[0x0a, 0xff]), "0aff");
/// ```
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}
