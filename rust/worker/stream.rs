//! Where a `RunClosures` stream's answers go: one [`ClosureStream`] per open stream (the
//! sink its closures are answered into) and [`Replies`], the response stream that batches
//! those answers.
//!
//! A pure reply sink: it knows nothing of the job queue or the service. Closures of a
//! stream are ordinary jobs of the one job queue (so they interleave with unary calls in
//! arrival order and run one at a time); only their answer goes here, a
//! [`pb::ClosureReply`] on the stream's channel instead of a oneshot. [`Replies`] drains
//! that channel, sending every answer that is ready in one message, so a busy worker
//! answers a run of short closures with a few HTTP/2 frames rather than one per closure.
//! Reading the stream's requests is `reader.rs`; whether a stream is halted is the job
//! queue's to know (`jobs.rs`), under the lock its executor pops under.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tonic::Status;

use crate::rpc::limits::too_large;
use crate::rpc::pb;

/// Most answers sent in one response message; a bound on how long the first answer of a
/// batch can wait behind the encoding of the others.
const MAX_REPLIES_PER_MESSAGE: usize = 256;
/// Upper bound of what wrapping one reply in a `RunClosuresResponse` adds (tag, length).
const REPLY_FRAMING: usize = 16;

/// Stream ids are unique in the process, for matching a stream's jobs in the queue.
static NEXT_STREAM_ID: AtomicU64 = AtomicU64::new(1);

/// The sending half of a stream's answer channel, kept by its [`ClosureStream`].
pub(super) type ReplySender = mpsc::UnboundedSender<pb::ClosureReply>;

/// A new stream's answer channel: the sender its [`ClosureStream`] will own once the
/// stream's options arrive, and the response stream that sends what goes into it.
pub(super) fn reply_channel(max_message_bytes: usize) -> (ReplySender, Replies) {
    let (sender, receiver) = mpsc::unbounded_channel();
    let replies = Replies {
        receiver,
        held: None,
        max_message_bytes,
    };
    (sender, replies)
}

/// One open `RunClosures` stream's answer sink, shared by its reader task and its queued
/// jobs.
pub struct ClosureStream {
    id: u64,
    replies: ReplySender,
    halt_on_error: bool,
    max_message_bytes: usize,
}

impl ClosureStream {
    /// A stream answering into `replies`.
    pub(super) fn new(replies: ReplySender, halt_on_error: bool, max_message_bytes: usize) -> Self {
        Self {
            id: NEXT_STREAM_ID.fetch_add(1, Ordering::Relaxed),
            replies,
            halt_on_error,
            max_message_bytes,
        }
    }

    /// The stream's id, unique in the process: the job queue keys its halted set by it.
    pub(super) fn id(&self) -> u64 {
        self.id
    }

    /// Whether `other` is this stream.
    pub(super) fn is(&self, other: &ClosureStream) -> bool {
        self.id == other.id
    }

    /// Whether the client stopped listening (its answers would go nowhere).
    pub(super) fn is_abandoned(&self) -> bool {
        self.replies.is_closed()
    }

    /// Resolves once the client stopped listening, so a reader waiting on a silent client
    /// can stop.
    pub(super) async fn abandoned(&self) {
        self.replies.closed().await;
    }

    /// Whether an error halts this stream (`halt_on_error`, from its first message).
    pub(super) fn halts_on_error(&self) -> bool {
        self.halt_on_error
    }

    /// The answer to send for a closure the executor ran; an answer above the size limit
    /// is the `RESOURCE_EXHAUSTED` status unary `RunClosure` would fail with instead.
    pub(super) fn prepare(
        &self,
        response: pb::RunClosureResponse,
    ) -> Result<pb::ClosureReply, Status> {
        use pb::closure_reply::Outcome as Reply;
        use pb::run_closure_response::Outcome as Ran;
        let outcome = match response.outcome {
            Some(Ran::Result(value)) => Some(Reply::Result(value)),
            Some(Ran::Error(error)) => Some(Reply::Error(error)),
            None => None,
        };
        let reply = pb::ClosureReply {
            closure_id: response.closure_id,
            outcome,
        };
        // The reply travels inside a RunClosuresResponse: a few bytes of framing more.
        let size = reply.encoded_len() + REPLY_FRAMING;
        if size > self.max_message_bytes {
            return Err(too_large(
                "the closure's result",
                size,
                self.max_message_bytes,
            ));
        }
        Ok(reply)
    }

    /// Sends `reply`; a client that went away loses nothing it still wanted.
    pub(super) fn send(&self, reply: pb::ClosureReply) {
        let _ = self.replies.send(reply);
    }

    /// Answers `closure_id` with the status unary `RunClosure` would have failed with.
    pub(super) fn refuse(&self, closure_id: u64, status: &Status) {
        self.send(pb::ClosureReply {
            closure_id,
            outcome: Some(pb::closure_reply::Outcome::Refused(pb::Refusal {
                code: status.code() as i32,
                message: status.message().to_owned(),
            })),
        });
    }

    /// Hands `closure_id` back unstarted.
    pub(super) fn hand_back(&self, closure_id: u64, reason: &str) {
        self.send(pb::ClosureReply {
            closure_id,
            outcome: Some(pb::closure_reply::Outcome::Returned(pb::Returned {
                reason: reason.to_owned(),
            })),
        });
    }
}

impl std::fmt::Debug for ClosureStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClosureStream")
            .field("id", &self.id)
            .field("halt_on_error", &self.halt_on_error)
            .finish_non_exhaustive()
    }
}

/// The response half of a `RunClosures` call: every answer ready when polled, in one
/// message (up to the size limit).
pub struct Replies {
    receiver: mpsc::UnboundedReceiver<pb::ClosureReply>,
    /// An answer that did not fit in the previous message.
    held: Option<pb::ClosureReply>,
    max_message_bytes: usize,
}

impl Stream for Replies {
    type Item = Result<pb::RunClosuresResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let first = match self.held.take() {
            Some(reply) => reply,
            None => match self.receiver.poll_recv(cx) {
                Poll::Ready(Some(reply)) => reply,
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            },
        };
        let mut size = first.encoded_len() + REPLY_FRAMING;
        let mut replies = vec![first];
        while replies.len() < MAX_REPLIES_PER_MESSAGE {
            let Ok(reply) = self.receiver.try_recv() else {
                break;
            };
            let more = reply.encoded_len() + REPLY_FRAMING;
            if size + more > self.max_message_bytes {
                self.held = Some(reply);
                break;
            }
            size += more;
            replies.push(reply);
        }
        Poll::Ready(Some(Ok(pb::RunClosuresResponse {
            replies,
            chunk: None,
        })))
    }
}
