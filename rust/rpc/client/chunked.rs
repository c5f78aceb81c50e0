//! A unary call sent whole or in chunks, by its size: the one place both clients (worker
//! and ps) decide that, so a request above the message limit goes through `CallChunked`
//! (protocol revision 4) the same way whichever server it is for.
//!
//! The generated clients differ (each service has its own `call_chunked`), so a client
//! passes its generated client and two functions that start the call on it: the unary
//! method, and its service's `CallChunked`. Cutting a message into chunks and assembling
//! the answer is `wire::chunks`.

use std::future::Future;
use std::time::Duration;

use super::channel::Callee;
use super::framed::Replies;
use crate::rpc::wire::chunks;
use crate::rpc::{pb, RpcError};

/// The request stream of a `CallChunked` call.
pub type ChunkStream = tokio_stream::Iter<std::vec::IntoIter<pb::Chunk>>;

/// What starting a `CallChunked` call resolves to: the answer's chunks, or a status.
pub type ChunkedAnswer = Result<tonic::Response<Replies<pb::Chunk>>, tonic::Status>;

impl Callee {
    /// Runs unary `method` with `request`: whole through `unary` when it fits one message
    /// for this callee, else in chunks through `chunked` (see [`Callee::call_chunked`]).
    /// Both get a clone of `client`, the generated client to start the call on.
    pub async fn call_sized<C, Req, Resp, U, UFut, K, KFut>(
        &self,
        client: &C,
        method: &str,
        timeout: Option<Duration>,
        request: Req,
        unary: U,
        chunked: K,
    ) -> Result<Resp, RpcError>
    where
        C: Clone,
        Req: prost::Message,
        Resp: prost::Message + Default,
        U: FnOnce(C, tonic::Request<Req>) -> UFut,
        UFut: Future<Output = Result<tonic::Response<Resp>, tonic::Status>>,
        K: FnOnce(C, tonic::Request<ChunkStream>) -> KFut,
        KFut: Future<Output = ChunkedAnswer>,
    {
        if request.encoded_len() > self.max_message_bytes() {
            return self
                .call_chunked(client, method, timeout, &request, chunked)
                .await;
        }
        let client = client.clone();
        self.call(method, timeout, request, |r| unary(client, r))
            .await
    }

    /// Runs unary `method` through `CallChunked` (protocol revision 4): `message`'s encoding
    /// goes out in chunks this callee accepts, and the chunked answer is decoded as `Resp`.
    /// `open` starts the call on a clone of `client`. A peer without `CallChunked`
    /// (revision 3 or older) fails with `RESOURCE_EXHAUSTED` saying so.
    pub async fn call_chunked<C, Req, Resp, K, KFut>(
        &self,
        client: &C,
        method: &str,
        timeout: Option<Duration>,
        message: &Req,
        open: K,
    ) -> Result<Resp, RpcError>
    where
        C: Clone,
        Req: prost::Message,
        Resp: prost::Message + Default,
        K: FnOnce(C, tonic::Request<ChunkStream>) -> KFut,
        KFut: Future<Output = ChunkedAnswer>,
    {
        let size = message.encoded_len();
        let limit = self.max_message_bytes();
        let pieces = chunks::split_message(message, limit, method);
        let kind = self.peer.kind;
        let client = client.clone();
        self.call(method, timeout, pieces, |request| async move {
            let response = match open(client, request.map(tokio_stream::iter)).await {
                Err(status) if status.code() == tonic::Code::Unimplemented => {
                    return Err(chunks::needs_revision_4(kind, method, size, limit));
                }
                other => other?,
            };
            let (metadata, incoming, extensions) = response.into_parts();
            let (_, encoded) = chunks::read_message(incoming).await?;
            let decoded = Resp::decode(encoded).map_err(|e| {
                tonic::Status::internal(format!(
                    "the chunked answer to {method} does not decode: {e} (a bug in the {kind})"
                ))
            })?;
            Ok(tonic::Response::from_parts(metadata, decoded, extensions))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use prost::Message;
    use tokio_stream::StreamExt;

    use super::*;
    use crate::rpc::client::channel::Peer;

    static PEER: Peer = Peer {
        kind: "worker",
        example_port: 8470,
        max_frame_bytes: None,
        status_error: RpcError::from,
    };

    const LIMIT: usize = 1024;

    fn request(payload_bytes: usize) -> pb::RegisterFunctionRequest {
        pb::RegisterFunctionRequest {
            payload: vec![7; payload_bytes].into(),
            ..pb::RegisterFunctionRequest::default()
        }
    }

    /// Which way a call went: "unary", or the chunks `CallChunked` was given.
    #[derive(Clone, Default)]
    struct Seen(Arc<Mutex<Vec<String>>>);

    impl Seen {
        fn note(&self, what: String) {
            self.0.lock().unwrap().push(what);
        }
        fn taken(&self) -> Vec<String> {
            std::mem::take(&mut self.0.lock().unwrap())
        }
    }

    /// Answers unary calls, notes each; refuses `CallChunked` as a revision-3 peer does,
    /// after noting how many chunks of how many bytes in all it was sent.
    async fn call(
        callee: &Callee,
        seen: &Seen,
        request: pb::RegisterFunctionRequest,
    ) -> Result<pb::RegisterFunctionResponse, RpcError> {
        callee
            .call_sized(
                seen,
                "RegisterFunction",
                None,
                request,
                |seen, r| async move {
                    seen.note(format!("unary {}", r.get_ref().payload.len()));
                    Ok(tonic::Response::new(pb::RegisterFunctionResponse::default()))
                },
                |seen, r| async move {
                    let pieces: Vec<pb::Chunk> = r.into_inner().collect().await;
                    let bytes: usize = pieces.iter().map(|c| c.data.len()).sum();
                    seen.note(format!("chunked {} {bytes}", pieces.len()));
                    Err(tonic::Status::unimplemented("no CallChunked"))
                },
            )
            .await
    }

    #[tokio::test]
    async fn a_request_that_fits_goes_whole_a_larger_one_in_chunks() {
        let callee = Callee::new(&PEER, "w:1".to_owned(), LIMIT);
        let seen = Seen::default();

        let fits = request(LIMIT - 16);
        assert!(fits.encoded_len() <= LIMIT);
        call(&callee, &seen, fits).await.unwrap();
        assert_eq!(seen.taken(), [format!("unary {}", LIMIT - 16)]);

        let large = request(4 * LIMIT);
        let size = large.encoded_len();
        let e = call(&callee, &seen, large).await.unwrap_err();
        // Chunks of at most half the limit, carrying the whole encoding.
        let pieces = size.div_ceil(LIMIT / 2);
        assert!(pieces > 1);
        assert_eq!(seen.taken(), [format!("chunked {pieces} {size}")]);
        assert!(matches!(e, RpcError::ResourceExhausted(_)), "{e:?}");
        assert!(
            e.message()
                .contains("older than 4, which cannot take it in chunks"),
            "{e}"
        );
        assert!(
            e.message().contains("RegisterFunction on worker w:1"),
            "{e}"
        );
    }
}
