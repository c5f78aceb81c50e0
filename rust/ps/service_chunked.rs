//! The unary calls a ps serves through `CallChunked` (those whose request or answer can
//! exceed one message): the request, assembled from its chunks by `chunks::serve`, decoded
//! and run as the call it names, and its answer cut into chunks.

use bytes::Bytes;
use prost::Message;
use tonic::Status;

use super::PsShared;
use crate::ps::dtype::Op;
use crate::ps::store::VariableStore;
use crate::rpc::pb;
use crate::rpc::wire::chunks::{self, answer};

impl PsShared {
    /// A chunked request decoded; a failure is counted as a rejected request.
    fn decoded<M: Message + Default>(&self, encoded: Bytes, what: &str) -> Result<M, Status> {
        chunks::decode(encoded, what).map_err(|s| self.reject(s))
    }

    /// Runs one unary call that came through `CallChunked`, whose answer may be of any
    /// size (it leaves in chunks).
    pub(super) fn chunked(
        &self,
        store: &VariableStore,
        method: &str,
        encoded: Bytes,
    ) -> Result<Vec<pb::Chunk>, Status> {
        let what = format!("a chunked {method} request");
        let what = what.as_str();
        let any = usize::MAX;
        let limit = self.max_message_bytes;
        Ok(match method {
            "CreateVariable" => answer(&self.create(store, &self.decoded(encoded, what)?)?, limit),
            "Read" => answer(
                &self.read(store, &self.decoded(encoded, what)?, any)?,
                limit,
            ),
            "Assign" => answer(
                &self.update(store, &self.decoded(encoded, what)?, Op::Assign, any)?,
                limit,
            ),
            "AssignAdd" => answer(
                &self.update(store, &self.decoded(encoded, what)?, Op::Add, any)?,
                limit,
            ),
            "AssignSub" => answer(
                &self.update(store, &self.decoded(encoded, what)?, Op::Sub, any)?,
                limit,
            ),
            "ScatterAdd" => answer(
                &self.scatter_add(store, &self.decoded(encoded, what)?, any)?,
                limit,
            ),
            "ReadMany" => answer(
                &self.read_many(store, &self.decoded(encoded, what)?, any)?,
                limit,
            ),
            "AssignMany" => answer(
                &self.assign_many(store, &self.decoded(encoded, what)?)?,
                limit,
            ),
            "ApplyUpdate" => answer(
                &self.apply_update(store, &self.decoded(encoded, what)?, any)?,
                limit,
            ),
            other => return Err(self.reject(chunks::unknown_method(other, &CHUNKED_METHODS))),
        })
    }
}

/// The unary methods `CallChunked` carries (those whose messages can be large).
const CHUNKED_METHODS: [&str; 9] = [
    "CreateVariable",
    "Read",
    "Assign",
    "AssignAdd",
    "AssignSub",
    "ScatterAdd",
    "ReadMany",
    "AssignMany",
    "ApplyUpdate",
];
