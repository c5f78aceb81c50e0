//! What the coordinator calls with: the channel and per-call deadline every client shares
//! ([`channel`]), a unary call sent whole or in chunks by its size ([`chunked`]), the
//! [`WorkerClient`] the dispatcher holds per worker ([`worker`]), its `RunClosures` stream
//! ([`closure_stream`]) and that stream emulated over unary calls for old workers and the
//! fake one ([`emulated`]); calls whose messages `wire::frames` frames ([`framed`]:
//! `RunClosures` and `CallChunked`). The parameter-server client (`crate::ps::client`) is built on
//! the same [`channel`] and [`chunked`].

pub mod channel;
pub mod chunked;
pub mod closure_stream;
pub mod emulated;
pub mod framed;
pub mod worker;

pub use closure_stream::ClosureChannel;
pub use worker::{ClientConfig, WorkerClient};
