//! What crosses the wire and what it means, the same for every client and server: the
//! framing that never copies an array ([`frames`]), values above the message limit as
//! chunk sequences ([`chunks`]), the size limits and flow-control windows ([`limits`]),
//! the names of the protocol's codes and kinds ([`codes`]), the session a call belongs to
//! ([`session`]), large buffers kept for the next message ([`recycle`]) and the one mapping between
//! `tonic::Status` and [`RpcError`](status::RpcError) ([`status`]).
//!
//! Nothing here opens a connection; the client and server rooms do, through this.

pub mod chunks;
pub mod codes;
pub mod frames;
pub mod limits;
pub mod recycle;
pub mod session;
pub mod status;
