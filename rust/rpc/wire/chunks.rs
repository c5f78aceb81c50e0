//! Messages above the size limit as sequences of [`pb::Chunk`]s (protocol revision 4).
//!
//! A gRPC message is bounded (64 MiB by default, 4 GiB by the frame format), so a large
//! value travels as the encoding of its message cut into chunks: inside a `RunClosures`
//! stream, and through `CallChunked` for the unary calls of the worker and ps services.
//! The receiver appends the chunks and decodes the whole, so the limit bounds one HTTP/2
//! message and never a value. Chunks are a few MiB: small enough that the receiver copies
//! one while the next is in flight, large enough that per-message costs vanish.
//!
//! What a chunk sequence may claim is checked before anything is allocated for it: a total
//! above [`MAX_CHUNKED_MESSAGE_BYTES`] is `RESOURCE_EXHAUSTED`, every inconsistency
//! `INVALID_ARGUMENT`, and the connection keeps serving.

use std::future::Future;

use bytes::{Buf, Bytes};
use prost::Message;
use tokio_stream::{Stream, StreamExt};
use tonic::Status;

use super::frames::{Rope, Segments};
use super::recycle;
use crate::rpc::pb;

/// Largest message a chunk sequence may assemble: 16 GiB, far above any value a closure
/// should move, low enough that a corrupt size cannot ask for absurd memory.
pub const MAX_CHUNKED_MESSAGE_BYTES: u64 = 16 << 30;

/// Data carried by one chunk at most.
pub const CHUNK_BYTES: usize = 4 << 20;

/// Memory reserved up front for a sequence; beyond it the buffer grows with the data that
/// actually arrives. Reserving is not using: an allocation this large is mapped, not
/// touched, so a sequence that announces much and sends little costs address space, not
/// memory. Below it a value is never reallocated while it arrives (a 768 MiB value grew
/// 64 → 1,024 MiB before, and copying 512 MiB at the last step held up the reader, and so
/// the worker's heartbeats, for a few tenths of a second).
const INITIAL_RESERVE: usize = 1 << 30;

/// The chunk size for a peer that accepts messages up to `max_message_bytes`: a chunk
/// message (data plus a few bytes of framing) always fits.
pub fn chunk_bytes(max_message_bytes: usize) -> usize {
    CHUNK_BYTES.min(max_message_bytes / 2).max(1)
}

/// `message` encoded and cut into chunks for a peer accepting `max_message_bytes`; the
/// first chunk names `method` (empty inside a stream). Its large `bytes` fields are never
/// copied: the encoding is kept as segments (`frames::Segments`) and a chunk never
/// spans two, so every chunk of a large array is a slice of the array. A 1 GiB value costs
/// no whole-message encode (0.3–0.5 s per GiB here, during which nothing was sent, not
/// even heartbeats).
pub fn split_message<M: Message>(
    message: &M,
    max_message_bytes: usize,
    method: &str,
) -> Vec<pb::Chunk> {
    let mut encoded = Segments::default();
    message.encode_raw(&mut encoded);
    encoded.seal();
    let mut rope = Rope::default();
    while let Some(segment) = encoded.take() {
        rope.push(segment);
    }
    cut(rope, max_message_bytes, method)
}

/// The chunks of `encoded`, each at most [`chunk_bytes`] and never spanning two of the
/// rope's parts (each is a slice of one); the first carries the total and `method`.
fn cut(mut encoded: Rope, max_message_bytes: usize, method: &str) -> Vec<pb::Chunk> {
    let size = chunk_bytes(max_message_bytes);
    let total = encoded.remaining();
    let mut chunks = Vec::with_capacity(total / size + 2);
    loop {
        let first = chunks.is_empty();
        let take = encoded.chunk().len().min(size);
        chunks.push(pb::Chunk {
            total_bytes: first.then_some(total as u64),
            data: encoded.copy_to_bytes(take),
            method: if first {
                method.to_owned()
            } else {
                String::new()
            },
        });
        if !encoded.has_remaining() {
            return chunks;
        }
    }
}

/// Decodes an assembled message; `what` names it in the error.
pub fn decode<M: Message + Default>(encoded: Bytes, what: &str) -> Result<M, Status> {
    let size = encoded.len();
    M::decode(encoded).map_err(|e| {
        Status::invalid_argument(format!(
            "the chunks of {what} ({size} bytes) do not decode as one message: {e}; expected \
             the chunks of one encoded message, in order"
        ))
    })
}

/// Appends the chunks of one message at a time and hands out each message's encoding once
/// its last chunk is in.
#[derive(Debug)]
pub struct Assembler {
    /// From [`recycle::take`]: a large message reuses mapped memory instead of faulting
    /// in fresh pages.
    buffer: Vec<u8>,
    /// Size of the message being assembled; `None` between messages.
    total: Option<usize>,
    limit: u64,
}

impl Default for Assembler {
    fn default() -> Self {
        Self::new(MAX_CHUNKED_MESSAGE_BYTES)
    }
}

impl Assembler {
    /// An assembler refusing messages above `limit` bytes.
    pub fn new(limit: u64) -> Self {
        Self {
            buffer: Vec::new(),
            total: None,
            limit,
        }
    }

    /// Whether a message has begun and is not complete yet.
    pub fn in_progress(&self) -> bool {
        self.total.is_some()
    }

    /// Adds `chunk`; returns the message's encoding once `chunk` completes it.
    pub fn push(&mut self, chunk: pb::Chunk) -> Result<Option<Bytes>, Status> {
        let total = match (chunk.total_bytes, self.total) {
            (Some(_), Some(total)) => {
                return Err(Status::invalid_argument(format!(
                    "a chunk sequence began before the previous one was complete ({} of {total} \
                     bytes received); expected the remaining chunks of the previous message \
                     first",
                    self.buffer.len()
                )))
            }
            (None, None) => {
                return Err(Status::invalid_argument(format!(
                    "a continuation chunk ({} bytes) arrived with no chunk sequence begun; \
                     expected a first chunk carrying total_bytes",
                    chunk.data.len()
                )))
            }
            (Some(total), None) => {
                if total > self.limit {
                    return Err(Status::resource_exhausted(format!(
                        "a chunked message of {total} bytes is above the limit of {} bytes; \
                         send smaller values",
                        self.limit
                    )));
                }
                // Below the limit, which fits in usize on every platform this runs on.
                let total = usize::try_from(total).unwrap_or(usize::MAX);
                if chunk.data.len() == total {
                    return Ok(Some(chunk.data)); // one chunk: nothing to copy
                }
                self.total = Some(total);
                self.buffer = recycle::take(total.min(INITIAL_RESERVE));
                total
            }
            (None, Some(total)) => total,
        };
        let received = self.buffer.len() + chunk.data.len();
        if received > total {
            self.reset();
            return Err(Status::invalid_argument(format!(
                "chunks carry {received} bytes or more for a message announced as {total} \
                 bytes; expected exactly total_bytes"
            )));
        }
        self.buffer.extend_from_slice(&chunk.data);
        if received < total {
            return Ok(None);
        }
        self.total = None;
        Ok(Some(recycle::freeze(std::mem::take(&mut self.buffer))))
    }

    fn reset(&mut self) {
        self.total = None;
        recycle::give(std::mem::take(&mut self.buffer));
    }
}

/// Reads a whole chunked message from `incoming`, which must hold exactly one; returns the
/// method its first chunk names and its encoding. A stream that ends early or errors is
/// refused with its status.
pub async fn read_message<S>(mut incoming: S) -> Result<(String, Bytes), Status>
where
    S: Stream<Item = Result<pb::Chunk, Status>> + Unpin,
{
    let mut assembler = Assembler::default();
    let mut method = None;
    while let Some(chunk) = incoming.next().await {
        let chunk = chunk?;
        if method.is_none() {
            method = Some(chunk.method.clone());
        }
        if let Some(encoded) = assembler.push(chunk)? {
            return Ok((method.unwrap_or_default(), encoded));
        }
    }
    Err(Status::invalid_argument(if assembler.in_progress() {
        "the chunk stream ended before its message was complete; expected chunks adding up \
         to total_bytes"
    } else {
        "the chunk stream ended without a chunk; expected one message's chunks"
    }))
}

/// The answer stream of a `CallChunked` call.
pub type AnswerStream = tokio_stream::Iter<std::vec::IntoIter<Result<pb::Chunk, Status>>>;

/// A `CallChunked` answer: `response` cut into chunks for a peer accepting
/// `max_message_bytes`. Encoded into segments, so a large array in it is cut by reference,
/// never copied into one encoding first (a ps `Read` of a 256 MiB variable).
pub fn answer<M: Message>(response: &M, max_message_bytes: usize) -> Vec<pb::Chunk> {
    split_message(response, max_message_bytes, "")
}

/// Serves one `CallChunked` call: reads the request, lets `handle` answer it (by method
/// name and encoding; it decodes with [`decode`], runs the unary handler's code and cuts
/// the response with [`answer`]) and streams the answer's chunks. `refused` sees every
/// refusal of the request itself (to count it).
pub async fn serve<S, F, Fut, R>(incoming: S, refused: R, handle: F) -> Result<AnswerStream, Status>
where
    S: Stream<Item = Result<pb::Chunk, Status>> + Unpin,
    F: FnOnce(String, Bytes) -> Fut,
    Fut: Future<Output = Result<Vec<pb::Chunk>, Status>>,
    R: FnOnce(Status) -> Status,
{
    let (method, encoded) = read_message(incoming).await.map_err(refused)?;
    let chunks = handle(method, encoded).await?;
    Ok(tokio_stream::iter(
        chunks.into_iter().map(Ok).collect::<Vec<_>>(),
    ))
}

/// The `UNIMPLEMENTED` answer for a method `CallChunked` does not carry.
pub fn unknown_method(method: &str, known: &[&str]) -> Status {
    Status::unimplemented(format!(
        "CallChunked does not carry method {method:?}; expected one of {known:?}"
    ))
}

/// The status a client reports when a peer of revision 3 or older (which has no
/// `CallChunked`) was sent a request above the size limit.
pub fn needs_revision_4(kind: &str, method: &str, size: usize, limit: usize) -> Status {
    Status::resource_exhausted(format!(
        "the {method} request is {size} bytes, above the message limit of {limit} bytes, and \
         this {kind} speaks a protocol revision older than 4, which cannot take it in chunks; \
         upgrade the {kind} (jaxcluster >= the coordinator's version) or send smaller values"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(total: Option<u64>, data: &'static [u8]) -> pb::Chunk {
        pb::Chunk {
            total_bytes: total,
            data: Bytes::from_static(data),
            method: String::new(),
        }
    }

    #[test]
    fn split_and_assemble_round_trip_at_the_boundaries() {
        let limit = 64; // chunks of 32 bytes
        for size in [0_usize, 1, 31, 32, 33, 64, 65, 1000] {
            let encoded: Bytes = (0..size)
                .map(|i| (i % 251) as u8)
                .collect::<Vec<_>>()
                .into();
            let mut rope = Rope::default();
            rope.push(encoded.clone());
            let chunks = cut(rope, limit, "M");
            assert_eq!(chunks.len(), size.div_ceil(32).max(1), "{size}");
            assert_eq!(chunks[0].method, "M");
            assert!(chunks.iter().all(|c| c.data.len() <= 32));
            let mut assembler = Assembler::default();
            let mut done = None;
            for (i, c) in chunks.into_iter().enumerate() {
                assert!(
                    done.is_none(),
                    "completed early at chunk {i} of size {size}"
                );
                done = assembler.push(c).unwrap();
            }
            assert_eq!(done.unwrap(), encoded, "{size}");
            assert!(!assembler.in_progress());
        }
    }

    #[test]
    fn malformed_sequences_are_refused_and_the_assembler_recovers() {
        let mut a = Assembler::default();
        let e = a.push(chunk(None, b"xy")).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(
            e.message().contains("no chunk sequence begun"),
            "{}",
            e.message()
        );

        assert!(a.push(chunk(Some(4), b"ab")).unwrap().is_none());
        let e = a.push(chunk(Some(4), b"cd")).unwrap_err();
        assert!(e.message().contains("2 of 4 bytes"), "{}", e.message());

        let mut a = Assembler::default();
        assert!(a.push(chunk(Some(4), b"ab")).unwrap().is_none());
        let e = a.push(chunk(None, b"cde")).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().contains("announced as 4"), "{}", e.message());
        // A fresh sequence works after the refusal.
        assert_eq!(a.push(chunk(Some(2), b"ok")).unwrap().unwrap(), "ok");
    }

    #[test]
    fn oversized_totals_are_refused_before_allocating() {
        let mut a = Assembler::new(10);
        let e = a.push(chunk(Some(11), b"")).unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        assert!(e.message().contains("11 bytes"), "{}", e.message());
        let mut a = Assembler::default();
        let e = a.push(chunk(Some(u64::MAX), b"")).unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
    }

    #[test]
    fn a_large_field_is_chunked_as_slices_of_itself() {
        let big = Bytes::from(
            (0..CHUNK_BYTES * 2 + 77)
                .map(|i| (i % 249) as u8)
                .collect::<Vec<_>>(),
        );
        let value = pb::Value {
            pickle: Bytes::from_static(b"\x80\x05N."),
            buffers: vec![Bytes::from(vec![3u8; 500]), big.clone()],
        };
        let chunks = split_message(&value, usize::MAX, "RunClosure");
        assert_eq!(chunks[0].method, "RunClosure");
        assert_eq!(chunks[0].total_bytes, Some(value.encoded_len() as u64));
        assert!(chunks.iter().all(|c| c.data.len() <= CHUNK_BYTES));
        let inside = |c: &pb::Chunk| {
            let (start, end) = (big.as_ptr() as usize, big.as_ptr() as usize + big.len());
            let at = c.data.as_ptr() as usize;
            at >= start && at + c.data.len() <= end
        };
        let shared: usize = chunks
            .iter()
            .filter(|c| inside(c))
            .map(|c| c.data.len())
            .sum();
        assert_eq!(
            shared,
            big.len(),
            "every byte of the array is sent from the array"
        );
        let mut a = Assembler::default();
        let encoded = chunks.into_iter().find_map(|c| a.push(c).unwrap()).unwrap();
        assert_eq!(encoded, value.encode_to_vec());
    }

    #[test]
    fn chunks_of_a_message_decode_back() {
        let value = pb::Value {
            pickle: Bytes::from_static(b"\x80\x05N."),
            buffers: vec![Bytes::from(vec![7u8; 1000])],
        };
        let chunks = split_message(&value, 100, "");
        assert!(chunks.len() > 10);
        let mut a = Assembler::default();
        let encoded = chunks.into_iter().find_map(|c| a.push(c).unwrap()).unwrap();
        let back: pb::Value = decode(encoded, "a value").unwrap();
        assert_eq!(back, value);
        let e = decode::<pb::Value>(Bytes::from_static(b"\xff\xff"), "a value").unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
    }

    #[tokio::test]
    async fn serve_reads_the_request_and_streams_the_answer_by_reference() {
        use tokio_stream::StreamExt as _;
        let request = pb::Value {
            pickle: Bytes::from_static(b"\x80\x05N."),
            buffers: vec![Bytes::from(vec![5u8; 300])],
        };
        let incoming = tokio_stream::iter(split_message(&request, 100, "Read").into_iter().map(Ok));
        let big = Bytes::from(vec![9u8; CHUNK_BYTES + 10]);
        let response = pb::Value {
            pickle: Bytes::from_static(b"\x80\x05N."),
            buffers: vec![big.clone()],
        };
        let answer = serve(
            incoming,
            |status| status,
            |method, encoded| {
                let (request, response) = (request.clone(), response.clone());
                async move {
                    assert_eq!(method, "Read");
                    assert_eq!(decode::<pb::Value>(encoded, "a request")?, request);
                    Ok(answer(&response, usize::MAX))
                }
            },
        )
        .await
        .unwrap();
        let chunks: Vec<pb::Chunk> = answer.map(Result::unwrap).collect().await;
        assert!(chunks.len() >= 2, "{} chunks", chunks.len());
        assert!(
            chunks.iter().any(|c| c.data.as_ptr() == big.as_ptr()),
            "the array's first chunk is the array itself, not a copy"
        );
        let mut a = Assembler::default();
        let encoded = chunks.into_iter().find_map(|c| a.push(c).unwrap()).unwrap();
        assert_eq!(decode::<pb::Value>(encoded, "an answer").unwrap(), response);

        // A request stream that ends early is refused through `refused`, before `handle`.
        let mut cut = split_message(&request, 100, "Read");
        cut.pop();
        let refusal = serve(
            tokio_stream::iter(cut.into_iter().map(Ok)),
            |status| Status::aborted(format!("counted: {}", status.message())),
            |_, _| async { panic!("a refused request reached its handler") },
        )
        .await
        .unwrap_err();
        assert_eq!(refusal.code(), tonic::Code::Aborted);
        assert!(
            refusal.message().contains("ended before"),
            "{}",
            refusal.message()
        );
    }
}
