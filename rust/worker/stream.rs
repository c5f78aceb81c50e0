//! The worker's side of `RunClosures`: one [`ClosureStream`] per open stream, the task that
//! reads its requests into the [`JobQueue`], and the response stream that batches answers.
//!
//! Closures of a stream are ordinary jobs of the one [`JobQueue`] (so they interleave with
//! unary calls in arrival order and run one at a time); only their answer goes elsewhere: a
//! [`pb::ClosureReply`] on the stream's channel instead of a oneshot. The response stream
//! drains that channel, sending every answer that is ready in one message, so a busy worker
//! answers a run of short closures with a few HTTP/2 frames rather than one per closure.
//!
//! When the worker begins shutting down, every stream stops reading: queued closures are
//! refused `UNAVAILABLE` (as unary ones are), the running one is answered, and then the
//! stream ends, so a graceful server stop does not wait for clients to close their streams.
//!
//! Halting (`halt_on_error`) and hand-backs (`return_queued`) take the queue's lock, so
//! they are atomic with respect to the executor popping its next job: a closure is either
//! started or handed back, never both. A halt is recorded *before* the error that caused it
//! is sent, so the coordinator's `resume`, which it sends only after reading that error,
//! always finds the halt in place.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tonic::{Status, Streaming};

use super::jobs::JobQueue;
use super::service::Shared;
use crate::rpc::limits::too_large;
use crate::rpc::pb;

/// Most answers sent in one response message; a bound on how long the first answer of a
/// batch can wait behind the encoding of the others.
const MAX_REPLIES_PER_MESSAGE: usize = 256;
/// Upper bound of what wrapping one reply in a `RunClosuresResponse` adds (tag, length).
const REPLY_FRAMING: usize = 16;

/// Stream ids are unique in the process, for matching a stream's jobs in the queue.
static NEXT_STREAM_ID: AtomicU64 = AtomicU64::new(1);

/// One open `RunClosures` stream, shared by its reader task and its queued jobs.
pub struct ClosureStream {
    id: u64,
    replies: mpsc::UnboundedSender<pb::ClosureReply>,
    halt_on_error: bool,
    /// Set after an error while `halt_on_error`; read and written under the queue's lock.
    halted: AtomicBool,
    max_message_bytes: usize,
}

impl ClosureStream {
    /// A stream answering into `replies`.
    fn new(
        replies: mpsc::UnboundedSender<pb::ClosureReply>,
        halt_on_error: bool,
        max_message_bytes: usize,
    ) -> Self {
        Self {
            id: NEXT_STREAM_ID.fetch_add(1, Ordering::Relaxed),
            replies,
            halt_on_error,
            halted: AtomicBool::new(false),
            max_message_bytes,
        }
    }

    /// Whether `other` is this stream.
    pub(super) fn is(&self, other: &ClosureStream) -> bool {
        self.id == other.id
    }

    /// Whether the client stopped listening (its answers would go nowhere).
    pub(super) fn is_abandoned(&self) -> bool {
        self.replies.is_closed()
    }

    /// Whether an error halts this stream.
    pub(super) fn halts_on_error(&self) -> bool {
        self.halt_on_error
    }

    /// Whether the stream is halted. Call with the queue's lock held.
    pub(super) fn is_halted(&self) -> bool {
        self.halted.load(Ordering::Relaxed)
    }

    /// Halts or resumes the stream. Call with the queue's lock held.
    pub(super) fn set_halted(&self, halted: bool) {
        self.halted.store(halted, Ordering::Relaxed);
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

/// Starts serving one `RunClosures` call: spawns the task that queues the requests and
/// returns the stream of answers.
pub(super) fn serve(shared: &Arc<Shared>, incoming: Streaming<pb::RunClosuresRequest>) -> Replies {
    let (sender, receiver) = mpsc::unbounded_channel();
    tokio::spawn(read_requests(Arc::clone(shared), incoming, sender));
    Replies {
        receiver,
        held: None,
        max_message_bytes: shared.max_message_bytes,
    }
}

/// Queues every closure the client sends. The stream object lives while this task reads
/// and while any of its jobs is queued or running; once all are gone the answer channel
/// closes and the response stream ends.
async fn read_requests(
    shared: Arc<Shared>,
    mut incoming: Streaming<pb::RunClosuresRequest>,
    sender: mpsc::UnboundedSender<pb::ClosureReply>,
) {
    // The stream's options come with its first message.
    let first = tokio::select! {
        message = incoming.message() => message,
        () = shared.queue.drained() => return,
    };
    let Ok(Some(first)) = first else {
        return;
    };
    let stream = Arc::new(ClosureStream::new(
        sender,
        first.halt_on_error,
        shared.max_message_bytes,
    ));
    queue_message(&shared, &stream, first);
    loop {
        let message = tokio::select! {
            message = incoming.message() => message,
            // The client may cancel while sending nothing: stop waiting then.
            () = stream.replies.closed() => Err(Status::cancelled("the client went away")),
            // Shutting down: read nothing more, so the stream ends (OK) once what is
            // running has been answered, and the server can stop. Closures the client
            // sends from now on are not answered; it sees the stream end without them.
            () = shared.queue.drained() => return,
        };
        match message {
            Ok(Some(request)) => queue_message(&shared, &stream, request),
            // A clean half-close: what is queued still runs and is answered.
            Ok(None) => return,
            Err(_) => {
                shared
                    .queue
                    .hand_back_stream(&stream, "the client cancelled the stream");
                return;
            }
        }
    }
}

/// Applies one request message: `resume`, then `return_queued`, then its closures.
fn queue_message(shared: &Shared, stream: &Arc<ClosureStream>, request: pb::RunClosuresRequest) {
    let queue: &JobQueue = &shared.queue;
    if request.resume {
        queue.resume_stream(stream);
    }
    if request.return_queued {
        queue.hand_back_stream(stream, "the coordinator asked for its queued closures back");
    }
    let mut jobs = Vec::with_capacity(request.closures.len());
    for closure in request.closures {
        let closure_id = closure.closure_id;
        match shared.run_job(closure) {
            Ok(job) => jobs.push((closure_id, job)),
            Err(status) => {
                // Queue what came before, in order, then refuse (and maybe halt) here.
                queue.push_streamed(std::mem::take(&mut jobs), stream);
                queue.refuse_streamed(stream, closure_id, &status);
            }
        }
    }
    queue.push_streamed(jobs, stream);
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
        Poll::Ready(Some(Ok(pb::RunClosuresResponse { replies })))
    }
}
