//! The reading half of `RunClosures`: the task that turns a stream's request messages into
//! jobs of the one job queue, answered on the stream's [`ClosureStream`].
//!
//! When the worker begins shutting down, every reader stops reading: queued closures are
//! refused `UNAVAILABLE` (as unary ones are), the running one is answered, and then the
//! stream ends, so a graceful server stop does not wait for clients to close their streams.
//!
//! A reader registers its stream with the job queue while it reads, because only a reader
//! queues closures: the queue keeps the stream's halted state (`halt_on_error`) from then
//! until the reader stops.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tonic::{Status, Streaming};

use super::jobs::JobQueue;
use super::state::WorkerState;
use super::stream::{reply_channel, ClosureStream, Lease, Outgoing, Replies, ReplySender};
use crate::rpc::limits::malformed;
use crate::rpc::pb;

/// Starts serving one `RunClosures` call: spawns the task that queues the requests and
/// returns the stream of answers.
pub(super) fn serve(
    state: &Arc<WorkerState>,
    incoming: Streaming<pb::RunClosuresRequest>,
) -> Replies {
    let (sender, lease, replies) = reply_channel(state.max_message_bytes);
    tokio::spawn(read_requests(Arc::clone(state), incoming, sender, lease));
    replies
}

/// Queues every closure the client sends. The stream object lives while this task reads
/// and while any of its jobs is queued or running; once all are gone the answer channel
/// closes and the response stream ends.
async fn read_requests(
    state: Arc<WorkerState>,
    mut incoming: Streaming<pb::RunClosuresRequest>,
    sender: ReplySender,
    lease: Arc<Lease>,
) {
    // The stream's options come with its first message.
    let first = tokio::select! {
        message = incoming.message() => message,
        () = state.queue.drained() => return,
    };
    let first = match first {
        Ok(Some(first)) => first,
        Ok(None) => return,
        Err(status) => {
            if let Some(invalid) = malformed(&status) {
                state.stats.rejected.fetch_add(1, Ordering::Relaxed);
                let _ = sender.send(Outgoing::End(invalid));
            }
            return;
        }
    };
    lease.start(first.lease_ms);
    let stream = Arc::new(ClosureStream::new(
        sender,
        first.halt_on_error,
        state.max_message_bytes,
        lease,
    ));
    state.queue.open_stream(&stream);
    read_stream(&state, &stream, first, incoming).await;
    state.queue.close_stream(&stream);
}

/// Applies `first`, then every later message, until the client half-closes or goes away
/// or the worker begins shutting down.
async fn read_stream(
    state: &WorkerState,
    stream: &Arc<ClosureStream>,
    first: pb::RunClosuresRequest,
    mut incoming: Streaming<pb::RunClosuresRequest>,
) {
    queue_message(state, stream, first);
    loop {
        let message = tokio::select! {
            message = incoming.message() => message,
            // The client may cancel while sending nothing: stop waiting then.
            () = stream.abandoned() => Err(Status::cancelled("the client went away")),
            // Shutting down: read nothing more, so the stream ends (OK) once what is
            // running has been answered, and the server can stop. Closures the client
            // sends from now on are not answered; it sees the stream end without them.
            () = state.queue.drained() => return,
        };
        match message {
            Ok(Some(request)) => queue_message(state, stream, request),
            // A clean half-close: what is queued still runs and is answered.
            Ok(None) => return,
            Err(status) => {
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
        }
    }
}

/// Applies one request message: the heartbeat acknowledgement and ping, `resume`, then
/// `return_queued`, then its closures.
fn queue_message(
    state: &WorkerState,
    stream: &Arc<ClosureStream>,
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
    let mut jobs = Vec::with_capacity(request.closures.len());
    for closure in request.closures {
        let closure_id = closure.closure_id;
        match state.run_job(closure) {
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
