//! gRPC message framing for the `RunClosures` stream that never copies an array.
//!
//! tonic's codec encodes each outgoing message into one contiguous buffer and assembles
//! each incoming message in another, so an argument or result crossed the wire with a copy
//! into the encoder and a copy out of the decoder on each side (profile of 64 KiB closures:
//! a fifth of the coordinator's CPU in those copies and the decoder's buffer growth). Here:
//!
//! - [`Segments`] encodes a message with prost, but a `bytes` field of at least
//!   [`SHARED_FIELD_BYTES`] is kept by reference as its own segment, so HTTP/2 writes the
//!   array's own memory ([`FramedBody`] yields the segments as data chunks, batching small
//!   messages up to [`BATCH_BYTES`] as tonic does);
//! - [`Unframer`] keeps received data chunks as they came and decodes each message from them
//!   in place ([`Rope`]): a field that lies inside one HTTP/2 data frame is a slice of that
//!   frame. Only a field spread over several frames is copied, once; a message above
//!   [`ASSEMBLE_BYTES`] that has not arrived whole is copied as its frames arrive, so that
//!   copy overlaps the transfer.
//!
//! The bytes on the wire are standard gRPC framing (5-byte prefix, `grpc-status` trailers),
//! so tonic's codec and grpcio read and write them unchanged. The `RunClosures` halves
//! (`closure_stream.rs`, the worker's `route.rs`) frame with this module, and `chunks.rs`
//! cuts large values into chunks through [`Segments`] and [`Rope`], so a chunk of an array
//! is a slice of it.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http_body::Frame;
use prost::Message;
use tokio_stream::Stream;
use tonic::codegen::http::HeaderMap;
use tonic::Status;

use super::limits::{too_large, BATCH_MESSAGE_BYTES};

/// A `bytes` field at least this large is sent by reference, as data chunks of its own.
/// Below it, copying into the batch is cheaper than the two extra HTTP/2 frames (and the
/// receiver's wake-ups for them) that a field of its own costs. Measured with
/// `benches/cpu_breakdown.py`, CPU per closure of all three processes against tonic's
/// codec: 64 KiB arrays 235–255 µs copied vs 270–315 µs by reference (tonic 325–365);
/// 256 KiB arrays 655–950 µs by reference vs 1,300–1,650 µs copied (tonic 1,520–1,960).
pub const SHARED_FIELD_BYTES: usize = 128 * 1024;

/// Small messages ready together are written as one data chunk of up to this size (tonic
/// batches alike), so a burst of trivial closures is one write, not one per closure.
pub const BATCH_BYTES: usize = 32 * 1024;

/// The server whose `--max-message-bytes` sets the limit a refusal names: the framed
/// stream is the worker's `RunClosures`.
const PEER: &str = "worker";

/// The gRPC message prefix: a compression flag and a big-endian `u32` length.
const PREFIX_BYTES: usize = 5;

pub use segments::Segments;

mod segments {
    //! The one `BufMut` implementation: `unsafe` only because the trait is (its callers
    //! trust `remaining_mut`/`advance_mut`); every raw method forwards to the `BytesMut`
    //! being filled, so the contract is `BytesMut`'s own.
    #![allow(unsafe_code)]

    use bytes::buf::UninitSlice;
    use bytes::{Buf, BufMut, Bytes, BytesMut};
    use std::collections::VecDeque;

    use super::SHARED_FIELD_BYTES;

    /// Encoded bytes as segments: small writes go into the current buffer, a large `Bytes`
    /// becomes a segment of its own without a copy (prost writes a `bytes` field with
    /// `put(field.clone())`, and `Bytes::copy_to_bytes` is a reference count).
    #[derive(Debug, Default)]
    pub struct Segments {
        pub(super) done: VecDeque<Bytes>,
        pub(super) current: BytesMut,
    }

    impl Segments {
        /// Ends the current buffer: what it holds becomes a segment.
        pub fn seal(&mut self) {
            if !self.current.is_empty() {
                self.done.push_back(self.current.split().freeze());
            }
        }

        /// Bytes written and not taken yet, sealed or not.
        pub fn len(&self) -> usize {
            self.done.iter().map(Bytes::len).sum::<usize>() + self.current.len()
        }

        /// Whether nothing is waiting to be taken.
        pub fn is_empty(&self) -> bool {
            self.done.is_empty() && self.current.is_empty()
        }

        /// The next sealed segment, oldest first.
        pub fn take(&mut self) -> Option<Bytes> {
            self.done.pop_front()
        }
    }

    unsafe impl BufMut for Segments {
        fn remaining_mut(&self) -> usize {
            self.current.remaining_mut()
        }

        unsafe fn advance_mut(&mut self, cnt: usize) {
            // SAFETY: forwarded unchanged; the caller initialised `cnt` bytes of the slice
            // `chunk_mut` returned, which is the current buffer's.
            unsafe { self.current.advance_mut(cnt) }
        }

        fn chunk_mut(&mut self) -> &mut UninitSlice {
            self.current.chunk_mut()
        }

        fn put<T: Buf>(&mut self, mut src: T)
        where
            Self: Sized,
        {
            if src.remaining() >= SHARED_FIELD_BYTES {
                self.seal();
                self.done.push_back(src.copy_to_bytes(src.remaining()));
            } else {
                self.current.put(src);
            }
        }

        fn put_slice(&mut self, src: &[u8]) {
            self.current.put_slice(src);
        }
    }
}

/// Appends `message` to `out` as one gRPC message (prefix and encoding), its large `bytes`
/// fields as segments of their own. A message above `limit` bytes is refused with
/// `RESOURCE_EXHAUSTED` naming `what` and both sizes, and nothing is appended.
pub fn encode<M: Message>(
    message: &M,
    out: &mut Segments,
    limit: usize,
    what: &str,
) -> Result<(), Status> {
    let len = message.encoded_len();
    let len32 = u32::try_from(len)
        .ok()
        .filter(|_| len <= limit)
        .ok_or_else(|| too_large(PEER, what, len, limit))?;
    // Room for the whole of a gathered batch at once (growing by doubling copied 0.75 of
    // a 512 KiB batch of 64 KiB arrays again); a larger message is mostly fields kept as
    // segments, which take no room here.
    out.current
        .reserve(PREFIX_BYTES + len.min(BATCH_MESSAGE_BYTES));
    out.put_u8(0);
    out.put_u32(len32);
    message.encode_raw(out);
    Ok(())
}

/// Received bytes as the data chunks they arrived in, read as one buffer. Taking a range
/// that lies inside one chunk ([`Buf::copy_to_bytes`], which prost uses for `bytes`
/// fields) is a slice of that chunk; only a range over several chunks is copied.
#[derive(Debug, Default)]
pub struct Rope {
    parts: VecDeque<Bytes>,
    remaining: usize,
}

impl Rope {
    /// Appends `data` (nothing if it is empty).
    pub fn push(&mut self, data: Bytes) {
        if !data.is_empty() {
            self.remaining += data.len();
            self.parts.push_back(data);
        }
    }

    /// The first `len` bytes as a rope of their own (sharing memory with this one).
    ///
    /// # Panics
    /// If fewer than `len` bytes are held.
    #[must_use = "the bytes taken are in the returned rope"]
    pub fn split_to(&mut self, len: usize) -> Rope {
        assert!(
            len <= self.remaining,
            "split_to({len}) of {} bytes",
            self.remaining
        );
        let mut head = Rope::default();
        while head.remaining < len {
            let wanted = len - head.remaining;
            let Some(front) = self.parts.front_mut() else {
                unreachable!("remaining counted {} bytes more", wanted)
            };
            if front.len() > wanted {
                head.push(front.split_to(wanted));
            } else if let Some(whole) = self.parts.pop_front() {
                head.push(whole);
            }
        }
        self.remaining -= len;
        head
    }
}

impl Buf for Rope {
    fn remaining(&self) -> usize {
        self.remaining
    }

    fn chunk(&self) -> &[u8] {
        self.parts.front().map_or(&[], |b| b.as_ref())
    }

    fn advance(&mut self, mut cnt: usize) {
        assert!(
            cnt <= self.remaining,
            "advance({cnt}) past {} bytes",
            self.remaining
        );
        self.remaining -= cnt;
        while cnt > 0 {
            let Some(front) = self.parts.front_mut() else {
                return;
            };
            if front.len() > cnt {
                front.advance(cnt);
                return;
            }
            cnt -= front.len();
            self.parts.pop_front();
        }
    }

    fn copy_to_bytes(&mut self, len: usize) -> Bytes {
        assert!(
            len <= self.remaining,
            "copy_to_bytes({len}) of {} bytes",
            self.remaining
        );
        if let Some(front) = self.parts.front_mut() {
            if front.len() >= len {
                let out = front.split_to(len);
                if front.is_empty() {
                    self.parts.pop_front();
                }
                self.remaining -= len;
                return out;
            }
        }
        let mut out = BytesMut::with_capacity(len);
        out.put(self.take(len));
        out.freeze()
    }
}

/// Reads gRPC messages out of data chunks as they arrive, refusing a message above the
/// limit before any of it is kept, and a compressed one (none was negotiated).
#[derive(Debug)]
pub struct Unframer {
    received: Rope,
    /// Length of the message whose prefix was read; `None` between messages.
    expected: Option<usize>,
    /// The message being copied together as it arrives (one larger than
    /// [`ASSEMBLE_BYTES`] that had not arrived whole when its prefix was read).
    assembling: Option<BytesMut>,
    limit: usize,
    /// Names the messages in errors (`"a RunClosures response from the worker"`).
    what: &'static str,
}

/// A message at least this large that has not arrived whole when its prefix is read is
/// copied into one buffer frame by frame as the frames arrive, rather than kept as frames
/// and copied at the end: the copy overlaps the transfer (a 16 MiB array is 16 frames of
/// 1 MiB, and its copy is then mostly done when the last frame comes), and each frame's
/// memory is released at once. Below it, frames are kept and only a field spread over
/// several is copied.
pub const ASSEMBLE_BYTES: usize = 1024 * 1024;

impl Unframer {
    /// An unframer of messages up to `limit` bytes; `what` names them in errors.
    pub fn new(limit: usize, what: &'static str) -> Self {
        Self {
            received: Rope::default(),
            expected: None,
            assembling: None,
            limit,
            what,
        }
    }

    /// Adds a received data chunk.
    pub fn push(&mut self, mut data: Bytes) {
        if let (Some(buffer), Some(len)) = (self.assembling.as_mut(), self.expected) {
            let wanted = len - buffer.len();
            let rest = data.split_off(wanted.min(data.len()));
            buffer.extend_from_slice(&data);
            data = rest;
        }
        self.received.push(data);
    }

    /// Whether bytes of a message are held that no complete message accounts for yet (the
    /// stream ending now would cut a message).
    pub fn mid_message(&self) -> bool {
        self.expected.is_some() || self.received.remaining() > 0
    }

    /// Reads a message's prefix: its length, checked against the limit.
    fn prefix(&mut self) -> Result<Option<usize>, Status> {
        if self.received.remaining() < PREFIX_BYTES {
            return Ok(None);
        }
        let flag = self.received.get_u8();
        let len = self.received.get_u32() as usize;
        if flag != 0 {
            return Err(Status::internal(format!(
                "{} arrived compressed (flag {flag}), but no compression was negotiated; \
                 expected uncompressed gRPC messages",
                self.what
            )));
        }
        if len > self.limit {
            return Err(too_large(PEER, self.what, len, self.limit));
        }
        if len >= ASSEMBLE_BYTES && self.received.remaining() < len {
            let mut buffer = BytesMut::with_capacity(len);
            buffer.put(&mut self.received);
            self.assembling = Some(buffer);
        }
        self.expected = Some(len);
        Ok(Some(len))
    }

    /// The next complete message, if its bytes are all in. A malformed prefix or encoding,
    /// or a message above the limit, is an error; the stream cannot go on after one.
    pub fn next_message<M: Message + Default>(&mut self) -> Result<Option<M>, Status> {
        let len = match self.expected {
            Some(len) => len,
            None => match self.prefix()? {
                Some(len) => len,
                None => return Ok(None),
            },
        };
        // Worded as tonic words it, so the one rewrite of decode failures
        // (`limits::malformed`) recognises it on either path.
        let failed = |e: prost::DecodeError| {
            Status::internal(format!(
                "failed to decode Protobuf message: {} ({len} bytes): {e}",
                self.what
            ))
        };
        if let Some(buffer) = self.assembling.as_ref() {
            if buffer.len() < len {
                return Ok(None);
            }
            let whole = self
                .assembling
                .take()
                .map(BytesMut::freeze)
                .unwrap_or_default();
            self.expected = None;
            return M::decode(whole).map(Some).map_err(failed);
        }
        if self.received.remaining() < len {
            return Ok(None);
        }
        self.expected = None;
        M::decode(self.received.split_to(len))
            .map(Some)
            .map_err(failed)
    }
}

/// How a [`FramedBody`] ends: a request body just ends; a response body ends with the
/// call's status as trailers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// A client's request stream: the half-close is the end.
    Request,
    /// A server's response stream: `grpc-status` trailers, `0` unless the messages ended
    /// with an error.
    Response,
}

/// An HTTP/2 body of the gRPC messages of `messages`, encoded with [`encode`]: large fields
/// are data chunks of their own, small messages ready at once are batched.
pub struct FramedBody<S> {
    messages: Option<S>,
    out: Segments,
    limit: usize,
    what: &'static str,
    ending: Ending,
    /// Trailers to send once every data chunk is out (responses only).
    trailers: Option<HeaderMap>,
    /// A request stream's error, reported once its data is out.
    failed: Option<Status>,
}

impl<S> FramedBody<S> {
    /// The body of `messages`, each at most `limit` bytes (`what` names them in errors).
    pub fn new(messages: S, limit: usize, what: &'static str, ending: Ending) -> Self {
        Self {
            messages: Some(messages),
            out: Segments::default(),
            limit,
            what,
            ending,
            trailers: None,
            failed: None,
        }
    }

    /// Stops reading messages: a response ends with `status` (OK or not) as trailers; a
    /// request ends (with the error, if there was one).
    fn finish(&mut self, status: Option<Status>) {
        self.messages = None;
        self.out.seal();
        match self.ending {
            Ending::Response => {
                let status = status.unwrap_or_else(|| Status::ok(""));
                let mut trailers = HeaderMap::new();
                // Fails only for a message that cannot be a header value, which
                // `add_header` percent-encodes; an empty map still ends the call.
                let _ = status.add_header(&mut trailers);
                self.trailers = Some(trailers);
            }
            Ending::Request => self.failed = status,
        }
    }
}

impl<S, M> http_body::Body for FramedBody<S>
where
    S: Stream<Item = Result<M, Status>> + Unpin,
    M: Message,
{
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        loop {
            if let Some(segment) = this.out.take() {
                return Poll::Ready(Some(Ok(Frame::data(segment))));
            }
            let Some(messages) = this.messages.as_mut() else {
                if let Some(status) = this.failed.take() {
                    return Poll::Ready(Some(Err(status)));
                }
                return Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))));
            };
            match Pin::new(messages).poll_next(cx) {
                Poll::Ready(Some(Ok(message))) => {
                    if let Err(status) = encode(&message, &mut this.out, this.limit, this.what) {
                        this.finish(Some(status));
                    } else if this.out.current.len() >= BATCH_BYTES {
                        this.out.seal();
                    }
                }
                Poll::Ready(Some(Err(status))) => this.finish(Some(status)),
                Poll::Ready(None) => this.finish(None),
                Poll::Pending => {
                    if this.out.current.is_empty() {
                        return Poll::Pending;
                    }
                    this.out.seal();
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.messages.is_none()
            && self.out.is_empty()
            && self.trailers.is_none()
            && self.failed.is_none()
    }
}

/// The gRPC messages of a received HTTP/2 body, decoded with an [`Unframer`]. A response
/// ends with the call's status from its trailers (an error status is the last item); a
/// request ends when the client half-closes.
pub struct Unframed<B, M> {
    body: B,
    unframer: Unframer,
    ending: Ending,
    done: bool,
    _message: std::marker::PhantomData<fn() -> M>,
}

impl<B, M> Unframed<B, M> {
    /// The messages of `body`, each at most `limit` bytes (`what` names them in errors),
    /// which is a request or a response as `ending` says.
    pub fn new(body: B, limit: usize, what: &'static str, ending: Ending) -> Self {
        Self {
            body,
            unframer: Unframer::new(limit, what),
            ending,
            done: false,
            _message: std::marker::PhantomData,
        }
    }

    fn end(&mut self, status: Option<Status>) -> Poll<Option<Result<M, Status>>> {
        self.done = true;
        Poll::Ready(status.map(Err))
    }
}

impl<B, M> Stream for Unframed<B, M>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    M: Message + Default,
{
    type Item = Result<M, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            match this.unframer.next_message() {
                Ok(Some(message)) => return Poll::Ready(Some(Ok(message))),
                Ok(None) => {}
                Err(status) => return this.end(Some(status)),
            }
            let frame = match std::task::ready!(Pin::new(&mut this.body).poll_frame(cx)) {
                Some(Ok(frame)) => frame,
                Some(Err(e)) => return this.end(Some(Status::from_error(e.into()))),
                None if this.ending == Ending::Request && !this.unframer.mid_message() => {
                    return this.end(None);
                }
                None => {
                    let cut = this.unframer.mid_message();
                    if this.ending == Ending::Request {
                        return this.end(Some(Status::invalid_argument(
                            "the request stream ended in the middle of a message; expected \
                             whole gRPC messages",
                        )));
                    }
                    return this.end(Some(Status::internal(format!(
                        "the stream ended without a gRPC status{}; expected grpc-status \
                         trailers (the peer or a proxy cut the call)",
                        if cut {
                            " in the middle of a message"
                        } else {
                            ""
                        }
                    ))));
                }
            };
            match frame.into_data() {
                Ok(data) => this.unframer.push(data),
                Err(frame) => {
                    let Ok(trailers) = frame.into_trailers() else {
                        continue; // an unknown frame kind: nothing to read in it
                    };
                    let status = Status::from_header_map(&trailers);
                    return match status {
                        Some(status) if status.code() != tonic::Code::Ok => this.end(Some(status)),
                        _ if this.unframer.mid_message() => this.end(Some(Status::internal(
                            "the stream ended in the middle of a message; expected whole gRPC \
                             messages before the trailers",
                        ))),
                        Some(_) => this.end(None),
                        None => this.end(Some(Status::internal(
                            "the stream's trailers carry no grpc-status; expected a gRPC peer",
                        ))),
                    };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
