//! The reading half of `RunClosures`: the task that turns a stream's request messages into
//! jobs of the one job queue, answered on the stream's [`ClosureStream`].
//!
//! When the worker begins shutting down, queued closures are refused `UNAVAILABLE` (as
//! unary ones are, and so is every closure that arrives later), the running one is
//! answered, and the stream ends once the coordinator has acknowledged every answer
//! (`acks.rs`) or the drain deadline released it, so a graceful server stop does not wait
//! for clients to close their streams, and no answer is lost to the exit.
//!
//! A reader registers its stream with the job queue while it reads, because only a reader
//! queues closures: the queue keeps the stream's halted state (`halt_on_error`) from then
//! until the reader stops.
//!
//! A request too large for one message arrives as chunks (protocol revision 4), which the
//! reader assembles before applying the request; a malformed chunk sequence ends the call
//! with its status (`INVALID_ARGUMENT` or `RESOURCE_EXHAUSTED`) after handing back what the
//! stream had queued. Large answers are cut into chunks on the way out (`outgoing.rs`).

use crate::rpc::wire::session::SessionId;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::pin::Pin;
use tokio::sync::oneshot;

use tokio_stream::{Stream, StreamExt};
use tonic::Status;

use super::jobs::JobQueue;
use super::outgoing::Outgoing;
use super::state::WorkerState;
use super::stream::{reply_channel, ClosureStream, Lease, Outbound, ReplySender};
use crate::rpc::pb;
use crate::rpc::wire::chunks::{self, Assembler, MAX_CHUNKED_MESSAGE_BYTES};
use crate::rpc::wire::limits::malformed;

/// Heartbeats while a large request arrives are sent at most this often.
const PROGRESS_HEARTBEAT: Duration = Duration::from_millis(100);

/// The request messages of one `RunClosures` call, decoded (by `route.rs`'s framing, or
/// tonic's for the generated service).
pub(super) type Incoming =
    Pin<Box<dyn Stream<Item = Result<pb::RunClosuresRequest, Status>> + Send>>;

/// Starts serving one `RunClosures` call: spawns the task that queues the requests and
/// returns the stream of answers.
pub(super) fn serve(state: &Arc<WorkerState>, incoming: Incoming, session: SessionId) -> Outgoing {
    let (sender, lease, replies) = reply_channel(state.max_message_bytes, &state.preemption);
    let (fail, failed) = oneshot::channel();
    let requests = Requests {
        incoming,
        assembler: Assembler::default(),
        fail: Some(fail),
        session,
    };
    tokio::spawn(read_requests(Arc::clone(state), requests, sender, lease));
    Outgoing::new(replies, failed, state.max_message_bytes)
}

/// The requests of one stream, whole: chunked ones assembled.
struct Requests {
    incoming: Incoming,
    assembler: Assembler,
    /// Ends the call with a status (taken once).
    fail: Option<oneshot::Sender<Status>>,
    /// The session of the call (its metadata): every closure it sends runs in it.
    session: SessionId,
}

/// What reading the next request gave.
enum Next {
    Request(pb::RunClosuresRequest),
    /// The client half-closed.
    End,
    /// The client went away or the transport failed.
    Broken(Status),
    /// A malformed or oversized chunk sequence: the call ends with this status.
    Refused(Status),
    /// A chunk of a large request arrived and more are to come.
    Progress,
}

impl Requests {
    async fn next(&mut self) -> Next {
        let message = match self.incoming.next().await.transpose() {
            Ok(Some(message)) => message,
            Ok(None) if self.assembler.in_progress() => {
                return Next::Refused(Status::invalid_argument(
                    "the stream ended inside a chunked request; expected chunks adding up to \
                     its total_bytes",
                ))
            }
            Ok(None) => return Next::End,
            Err(status) => return Next::Broken(status),
        };
        let Some(chunk) = message.chunk else {
            if self.assembler.in_progress() {
                return Next::Refused(Status::invalid_argument(
                    "a request arrived inside a chunked request; expected its remaining chunks \
                     first",
                ));
            }
            return Next::Request(message);
        };
        match self.assembler.push(chunk) {
            Ok(None) => Next::Progress,
            Ok(Some(encoded)) => {
                match chunks::decode::<pb::RunClosuresRequest>(encoded, "a request") {
                    Ok(request) if request.chunk.is_some() => Next::Refused(
                        Status::invalid_argument("a chunked request holds another chunk"),
                    ),
                    Ok(request) => Next::Request(request),
                    Err(status) => Next::Refused(status),
                }
            }
            Err(status) => Next::Refused(status),
        }
    }

    /// Ends the call with `status` (counted as a rejected request).
    fn refuse(&mut self, state: &WorkerState, status: Status) {
        let status = state.stats.reject(status);
        if let Some(fail) = self.fail.take() {
            let _ = fail.send(status);
        }
    }
}

/// Queues every closure the client sends. The stream object lives while this task reads
/// and while any of its jobs is queued or running; once all are gone the answer channel
/// closes and the response stream ends.
async fn read_requests(
    state: Arc<WorkerState>,
    mut requests: Requests,
    sender: ReplySender,
    lease: Arc<Lease>,
) {
    // The stream's options come with its first message.
    let first = loop {
        let next = tokio::select! {
            next = requests.next() => next,
            () = state.queue.drained() => return,
        };
        if !matches!(next, Next::Progress) {
            break next;
        }
    };
    let first = match first {
        Next::Request(first) => first,
        Next::Refused(status) => return requests.refuse(&state, status),
        Next::End | Next::Progress => return,
        Next::Broken(status) => {
            if let Some(invalid) = malformed(&status) {
                state.stats.rejected.fetch_add(1, Ordering::Relaxed);
                let _ = sender.send(Outbound::End(invalid));
            }
            return;
        }
    };
    // A client that assembles chunks may be answered with results above the message
    // limit (cut into chunks on the way out); others are refused them.
    let largest_answer = if first.accepts_chunks {
        usize::try_from(MAX_CHUNKED_MESSAGE_BYTES).unwrap_or(usize::MAX)
    } else {
        state.max_message_bytes
    };
    lease.start(first.lease_ms);
    let stream = Arc::new(ClosureStream::new(
        sender,
        first.halt_on_error,
        largest_answer,
        lease,
    ));
    state.queue.open_stream(&stream);
    state.farewells.open(stream.id(), stream.shared_lease());
    read_stream(&state, &stream, first, requests).await;
    state.farewells.close(stream.id());
    state.queue.close_stream(&stream);
}

/// Applies `first`, then every later message, until the client half-closes or goes away,
/// or the worker drains and owes the stream nothing more.
async fn read_stream(
    state: &WorkerState,
    stream: &Arc<ClosureStream>,
    first: pb::RunClosuresRequest,
    mut requests: Requests,
) {
    let session = requests.session.clone();
    queue_message(state, stream, &session, first);
    let mut progress_heartbeat: Option<Instant> = None;
    let mut draining = false;
    loop {
        if draining && !stream.lease().is_running() && stream.lease().is_settled() {
            // Nothing runs and every answer arrived: the stream ends (OK) and the
            // server can stop.
            return;
        }
        let next = tokio::select! {
            next = requests.next() => next,
            // The client may cancel while sending nothing: stop waiting then.
            () = stream.abandoned() => Next::Broken(Status::cancelled("the client went away")),
            // Shutting down: keep reading, for the coordinator's acknowledgements of what
            // was answered and its pings (closures it sends from now on are refused
            // `UNAVAILABLE` by the queue), until the running closure is answered and
            // every answer acknowledged (`acks.rs`).
            () = state.queue.drained(), if !draining => {
                draining = true;
                stream.lease().close();
                // Says so, and asks for an acknowledgement of what was sent.
                stream.heartbeat();
                continue;
            }
            () = stream.wait_answered(), if draining => continue,
            // The drain deadline passed: the shutdown stopped waiting.
            () = state.farewells.released(), if draining => return,
        };
        match next {
            Next::Request(request) => queue_message(state, stream, &session, request),
            // A large request takes a while to arrive, and the pings sent after it wait
            // behind its chunks: its chunks are the worker's sign of life meanwhile, or a
            // coordinator with a heartbeat bound shorter than the upload would declare this
            // worker silent and send the closure to another one, again and again.
            Next::Progress => {
                if stream.lease().is_leased()
                    && progress_heartbeat.map_or(true, |at| at.elapsed() >= PROGRESS_HEARTBEAT)
                {
                    progress_heartbeat = Some(Instant::now());
                    stream.heartbeat();
                }
            }
            // A clean half-close: what is queued still runs and is answered.
            Next::End => return,
            Next::Broken(status) => {
                state
                    .queue
                    .hand_back_stream(stream, "the client cancelled the stream");
                if let Some(invalid) = malformed(&status) {
                    // A message that does not decode: say so, rather than end as if the
                    // client had gone away.
                    state.stats.rejected.fetch_add(1, Ordering::Relaxed);
                    stream.end_with(invalid);
                }
                return;
            }
            Next::Refused(status) => {
                state
                    .queue
                    .hand_back_stream(stream, "the stream sent a malformed chunk sequence");
                requests.refuse(state, status);
                return;
            }
        }
    }
}

/// Applies one request message: the heartbeat acknowledgement and ping, `resume`, then
/// `return_queued`, then its closures.
fn queue_message(
    state: &WorkerState,
    stream: &Arc<ClosureStream>,
    session: &SessionId,
    request: pb::RunClosuresRequest,
) {
    let queue: &JobQueue = &state.queue;
    if stream.lease().acknowledge(request.heartbeat_ack) {
        queue.notify();
    }
    if request.ping && stream.lease().is_leased() {
        stream.heartbeat();
    }
    if request.resume {
        queue.resume_stream(stream);
    }
    if request.return_queued {
        queue.hand_back_stream(stream, "the coordinator asked for its queued closures back");
    }
    if !request.closures.is_empty() {
        // Their answers are due within a round trip.
        crate::runtime::awake::expect();
    }
    let mut jobs = Vec::with_capacity(request.closures.len());
    for closure in request.closures {
        let closure_id = closure.closure_id;
        match state.run_job(closure) {
            Ok(job) => jobs.push((closure_id, job)),
            Err(status) => {
                // Queue what came before, in order, then refuse (and maybe halt) here.
                queue.push_streamed(std::mem::take(&mut jobs), stream, session);
                queue.refuse_streamed(stream, closure_id, &status);
            }
        }
    }
    queue.push_streamed(jobs, stream, session);
}
