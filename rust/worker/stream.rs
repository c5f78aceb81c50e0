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
//!
//! # Heartbeats and the lease (protocol revision 4)
//!
//! A stream whose first message sets `lease_ms` is *leased* ([`Lease`]): every response
//! message carries a heartbeat (the worker's clock, in microseconds since the stream
//! opened) and the id of the stream's closure running then; the coordinator echoes the
//! highest heartbeat it received in `heartbeat_ack`, and pings while it waits. The job
//! queue starts a closure of a leased stream only while `now < acked heartbeat + lease_ms`.
//!
//! Why that is safe: the coordinator declares the worker failed (and gives its queued
//! closures to other workers) only after hearing nothing for at least `lease_ms`. A
//! heartbeat stamped at worker time `w` reached it no earlier than `w`, so it declares no
//! earlier than `w + lease_ms`; a worker that starts a closure before `w + lease_ms`
//! therefore starts it before the coordinator could have withdrawn it. A worker that was
//! frozen (SIGSTOP, a stalled VM) or cut off comes back with every lease expired: acks
//! read from its socket after the freeze still carry old heartbeats, so its queued closures
//! stay unstarted until the cancelled stream drops them. The stamp is taken when the
//! message is built, before it is written, which only makes the lease shorter.
//!
//! The same acknowledgements tell a draining worker which of its answers arrived: the
//! lease keeps the stream's [`Ledger`] (see `acks.rs`), and once it is [`Lease::close`]d
//! every message asks for an acknowledgement at once.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tonic::Status;

use super::acks::Ledger;
use crate::rpc::pb;
use crate::rpc::wire::limits::{too_large, BATCH_MESSAGE_BYTES};
use crate::worker::jobs::Ran;
use crate::worker::preemption::Preemption;

/// Most answers sent in one response message; a bound on how long the first answer of a
/// batch can wait behind the encoding of the others.
const MAX_REPLIES_PER_MESSAGE: usize = 256;
/// Upper bound of what wrapping one reply in a `RunClosuresResponse` adds (tag, length).
const REPLY_FRAMING: usize = 16;

/// Stream ids are unique in the process, for matching a stream's jobs in the queue.
static NEXT_STREAM_ID: AtomicU64 = AtomicU64::new(1);

/// What goes out on a stream's response: an answer, or a request to send a message now
/// (a heartbeat) even with no answer due.
#[derive(Debug)]
pub(super) enum Outbound {
    Reply(Answer),
    Heartbeat,
    /// End the response with this error (e.g. a request that was not a valid message).
    End(Status),
}

/// One closure's answer as it goes out: the `ClosureReply`, built once, and its size inside
/// a `RunClosuresResponse`, measured once (checked against the limit when a closure ran,
/// then used to batch it).
#[derive(Debug)]
pub(super) struct Answer {
    reply: pb::ClosureReply,
    size: usize,
}

impl Answer {
    /// `reply`, measured.
    pub(super) fn new(reply: pb::ClosureReply) -> Self {
        // The reply travels inside a RunClosuresResponse: a few bytes of framing more.
        let size = reply.encoded_len() + REPLY_FRAMING;
        Self { reply, size }
    }

    /// Whether the closure ran and gave a result.
    pub(super) fn is_success(&self) -> bool {
        matches!(
            self.reply.outcome,
            Some(pb::closure_reply::Outcome::Result(_))
        )
    }
}

/// The sending half of a stream's answer channel, kept by its [`ClosureStream`].
pub(super) type ReplySender = mpsc::UnboundedSender<Outbound>;

/// A new stream's answer channel: the sender its [`ClosureStream`] will own once the
/// stream's options arrive, the stream's [`Lease`], and the response stream that sends
/// what goes into the channel.
/// Every message it sends carries the worker's preemption notice once there is one.
pub(super) fn reply_channel(
    max_message_bytes: usize,
    preemption: &Arc<Preemption>,
) -> (ReplySender, Arc<Lease>, Replies) {
    let (sender, receiver) = mpsc::unbounded_channel();
    preemption.watch(&sender);
    let lease = Arc::new(Lease::new());
    let replies = Replies {
        receiver,
        held: None,
        batch_bytes: max_message_bytes.min(BATCH_MESSAGE_BYTES),
        lease: Arc::clone(&lease),
        preemption: Arc::clone(preemption),
        end: None,
        ended: false,
    };
    (sender, lease, replies)
}

/// A stream's heartbeats and lease (see the module documentation). Shared by the stream,
/// its response and the job queue, which asks [`Lease::allows_start`] before starting one
/// of the stream's closures.
#[derive(Debug)]
pub struct Lease {
    opened: Instant,
    /// `lease_ms` from the first message; unset: not leased.
    length: OnceLock<Duration>,
    /// Microseconds since `opened` until which closures may start; 0: none yet.
    valid_until: AtomicU64,
    /// The highest heartbeat this stream has sent: an acknowledgement above it cannot be
    /// of this stream (a coordinator echoing another stream's clock), so it renews nothing.
    stamped: AtomicU64,
    /// The stream's closure running now; 0 if none.
    running: AtomicU64,
    /// Closures wait for a lease: ask the coordinator to acknowledge at once.
    wants_ack: AtomicBool,
    /// The worker is draining: every message asks for an acknowledgement.
    closing: AtomicBool,
    /// Answers sent and not acknowledged (kept only on a leased stream: no other gets
    /// acknowledgements).
    ledger: Ledger,
}

impl Lease {
    fn new() -> Self {
        Self {
            opened: Instant::now(),
            length: OnceLock::new(),
            valid_until: AtomicU64::new(0),
            stamped: AtomicU64::new(0),
            running: AtomicU64::new(0),
            wants_ack: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            ledger: Ledger::default(),
        }
    }

    fn micros(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.opened).as_micros()).unwrap_or(u64::MAX)
    }

    /// Makes the stream leased, `lease_ms` long (0: not leased); from the first message.
    pub(super) fn start(&self, lease_ms: u32) {
        if lease_ms > 0 {
            let _ = self.length.set(Duration::from_millis(u64::from(lease_ms)));
        }
    }

    /// Whether the stream is leased.
    pub(super) fn is_leased(&self) -> bool {
        self.length.get().is_some()
    }

    /// The heartbeat for a message built now (never 0).
    fn heartbeat(&self) -> u64 {
        self.micros(Instant::now()) + 1
    }

    /// Extends the lease from the acknowledged heartbeat `ack`; returns whether that made
    /// it valid now where it was not (closures may have been waiting). An `ack` this stream
    /// never sent is ignored: honouring it would grant a lease no heartbeat vouches for.
    pub(super) fn acknowledge(&self, ack: u64) -> bool {
        let Some(length) = self.length.get() else {
            return false;
        };
        if ack == 0 || ack > self.stamped.load(Ordering::Acquire) {
            return false;
        }
        self.ledger.acknowledged(ack);
        let until = (ack - 1).saturating_add(u64::try_from(length.as_micros()).unwrap_or(u64::MAX));
        let now = self.micros(Instant::now());
        let before = self.valid_until.fetch_max(until, Ordering::AcqRel);
        before <= now && until > now
    }

    /// Whether one of the stream's closures may start at `now`. When not, the next
    /// message asks the coordinator for an acknowledgement; the returned flag says whether
    /// that request is new (then the caller makes a message go out).
    pub(super) fn allows_start(&self, now: Instant) -> (bool, bool) {
        if self.length.get().is_none()
            || self.micros(now) < self.valid_until.load(Ordering::Acquire)
        {
            return (true, false);
        }
        (false, !self.wants_ack.swap(true, Ordering::AcqRel))
    }

    /// Records which of the stream's closures runs now (0: none).
    pub(super) fn set_running(&self, closure_id: u64) {
        self.running.store(closure_id, Ordering::Release);
    }

    /// Whether one of the stream's closures runs now.
    pub(super) fn is_running(&self) -> bool {
        self.running.load(Ordering::Acquire) != 0
    }

    /// The worker is draining: from now on every message says so, and (on a leased
    /// stream) asks for an acknowledgement.
    pub(super) fn close(&self) {
        self.closing.store(true, Ordering::Release);
    }

    /// An answer to `closure_id` is about to enter the response.
    fn owe(&self, closure_id: u64) {
        if self.is_leased() {
            self.ledger.owe(closure_id);
        }
    }

    /// Whether every answer sent on the stream was acknowledged.
    pub(super) fn is_settled(&self) -> bool {
        self.ledger.is_settled()
    }

    /// The closures whose answers were not acknowledged, oldest first.
    pub(super) fn unacknowledged(&self) -> Vec<u64> {
        self.ledger.unacknowledged()
    }

    /// The heartbeat fields of a message built now, and whether the worker drains.
    fn stamp(&self, message: &mut pb::RunClosuresResponse) {
        message.draining = self.closing.load(Ordering::Acquire);
        if self.is_leased() {
            message.heartbeat = self.heartbeat();
            self.stamped.fetch_max(message.heartbeat, Ordering::AcqRel);
            self.ledger.sent(message.replies.len(), message.heartbeat);
            message.running_closure_id = self.running.load(Ordering::Acquire);
            message.wants_ack = self.wants_ack.swap(false, Ordering::AcqRel)
                || self.closing.load(Ordering::Acquire);
        }
    }
}

/// One open `RunClosures` stream's answer sink, shared by its reader task and its queued
/// jobs.
pub struct ClosureStream {
    id: u64,
    replies: ReplySender,
    halt_on_error: bool,
    max_message_bytes: usize,
    lease: Arc<Lease>,
    /// Woken when one of the stream's closures has been answered (a draining reader waits
    /// for that).
    answered: tokio::sync::Notify,
}

impl ClosureStream {
    /// A stream answering into `replies`, under `lease`.
    pub(super) fn new(
        replies: ReplySender,
        halt_on_error: bool,
        max_message_bytes: usize,
        lease: Arc<Lease>,
    ) -> Self {
        Self {
            id: NEXT_STREAM_ID.fetch_add(1, Ordering::Relaxed),
            replies,
            halt_on_error,
            max_message_bytes,
            lease,
            answered: tokio::sync::Notify::new(),
        }
    }

    /// The stream's heartbeats and lease.
    pub(super) fn lease(&self) -> &Lease {
        &self.lease
    }

    /// The stream's lease, shared (for the list of streams a drain waits on).
    pub(super) fn shared_lease(&self) -> Arc<Lease> {
        Arc::clone(&self.lease)
    }

    /// Wakes [`Self::wait_answered`]: a closure of the stream was answered.
    pub(super) fn notify_answered(&self) {
        self.answered.notify_one();
    }

    /// Resolves after [`Self::notify_answered`] (at once if it was called since the last
    /// wait).
    pub(super) async fn wait_answered(&self) {
        self.answered.notified().await;
    }

    /// Sends a message now (carrying a heartbeat), with or without answers.
    pub(super) fn heartbeat(&self) {
        let _ = self.replies.send(Outbound::Heartbeat);
    }

    /// Ends the response with `status` once what was answered before has gone out.
    pub(super) fn end_with(&self, status: Status) {
        let _ = self.replies.send(Outbound::End(status));
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

    /// The answer to send for closure `closure_id`, which the executor ran: built here,
    /// once, from what it gave. An answer above the size limit is the `RESOURCE_EXHAUSTED`
    /// status unary `RunClosure` would fail with instead.
    pub(super) fn prepare(&self, closure_id: u64, ran: Ran) -> Result<Answer, Status> {
        use pb::closure_reply::Outcome as Reply;
        let outcome = match ran {
            Ran::Result(value) => Reply::Result(value),
            Ran::Error(error) => Reply::Error(error),
        };
        let answer = Answer::new(pb::ClosureReply {
            closure_id,
            outcome: Some(outcome),
        });
        if answer.size > self.max_message_bytes {
            return Err(too_large(
                "worker",
                "the closure's result",
                answer.size,
                self.max_message_bytes,
            ));
        }
        Ok(answer)
    }

    /// Sends `answer`; a client that went away loses nothing it still wanted.
    pub(super) fn send(&self, answer: Answer) {
        self.lease.owe(answer.reply.closure_id);
        let _ = self.replies.send(Outbound::Reply(answer));
    }

    /// Sends `reply`, measured here (it did not come from the executor).
    fn send_reply(&self, reply: pb::ClosureReply) {
        self.send(Answer::new(reply));
    }

    /// Answers `closure_id` with the status unary `RunClosure` would have failed with.
    pub(super) fn refuse(&self, closure_id: u64, status: &Status) {
        self.send_reply(pb::ClosureReply {
            closure_id,
            outcome: Some(pb::closure_reply::Outcome::Refused(pb::Refusal {
                code: status.code() as i32,
                message: status.message().to_owned(),
            })),
        });
    }

    /// Hands `closure_id` back unstarted.
    pub(super) fn hand_back(&self, closure_id: u64, reason: &str) {
        self.send_reply(pb::ClosureReply {
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

/// The response half of a `RunClosures` call: every answer ready when polled, gathered
/// into messages of at most `BATCH_MESSAGE_BYTES` (or the message limit, if lower).
pub struct Replies {
    receiver: mpsc::UnboundedReceiver<Outbound>,
    /// An answer that did not fit in the previous message.
    held: Option<Answer>,
    /// Largest message answers are gathered into (one larger answer goes alone).
    batch_bytes: usize,
    lease: Arc<Lease>,
    /// The worker's preemption notice, stamped on every message once it arrived.
    preemption: Arc<Preemption>,
    /// An error to end the response with, after the message being sent.
    end: Option<Status>,
    /// An error ended the response.
    ended: bool,
}

/// Room left in a message for the heartbeat fields.
const HEARTBEAT_FRAMING: usize = 32;

impl Stream for Replies {
    type Item = Result<pb::RunClosuresResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.ended {
            return Poll::Ready(None);
        }
        if let Some(status) = self.end.take() {
            self.ended = true;
            return Poll::Ready(Some(Err(status)));
        }
        let mut replies = Vec::new();
        let notice = self.preemption.notice().cloned();
        let mut size = HEARTBEAT_FRAMING + notice.as_ref().map_or(0, Message::encoded_len);
        if let Some(answer) = self.held.take() {
            size += answer.size;
            replies.push(answer.reply);
        } else {
            match self.receiver.poll_recv(cx) {
                Poll::Ready(Some(Outbound::Reply(answer))) => {
                    size += answer.size;
                    replies.push(answer.reply);
                }
                Poll::Ready(Some(Outbound::Heartbeat)) => {}
                Poll::Ready(Some(Outbound::End(status))) => {
                    self.ended = true;
                    return Poll::Ready(Some(Err(status)));
                }
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            }
        }
        while replies.len() < MAX_REPLIES_PER_MESSAGE {
            let answer = match self.receiver.try_recv() {
                Ok(Outbound::Reply(answer)) => answer,
                Ok(Outbound::Heartbeat) => continue,
                Ok(Outbound::End(status)) => {
                    // Sent after what is in this message.
                    self.end = Some(status);
                    break;
                }
                Err(_) => break,
            };
            if size + answer.size > self.batch_bytes {
                self.held = Some(answer);
                break;
            }
            size += answer.size;
            replies.push(answer.reply);
        }
        if !replies.is_empty() {
            // A serial loop's next closure is due within a round trip of these answers.
            crate::runtime::awake::expect();
        }
        let mut message = pb::RunClosuresResponse {
            replies,
            preemption: notice,
            ..pb::RunClosuresResponse::default()
        };
        self.lease.stamp(&mut message);
        Poll::Ready(Some(Ok(message)))
    }
}
