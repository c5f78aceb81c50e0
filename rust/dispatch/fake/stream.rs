//! `RunClosures` on a fake worker: a task per stream that runs its closures one at a time
//! in arrival order, as a real worker's executor does, with the same halting and
//! hand-back rules (`halt_on_error`, `resume`, `return_queued`). A worker that dies ends
//! the stream with `UNAVAILABLE`, as a broken connection does; queued closures die with it.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;

use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::transport::FakeTransport;
use super::worker::died;
use crate::rpc::{pb, ClosureChannel, RpcError};

type Running =
    Pin<Box<dyn Future<Output = (u64, Result<pb::RunClosureResponse, RpcError>)> + Send>>;

/// One stream's state on the fake worker.
struct FakeStream {
    transport: FakeTransport,
    replies: mpsc::UnboundedSender<Result<pb::RunClosuresResponse, RpcError>>,
    queued: VecDeque<pb::RunClosureRequest>,
    halt_on_error: bool,
    halted: bool,
}

/// Opens a stream on `transport`'s worker (which must be up); `first` is its first message.
pub(super) fn open(
    transport: &FakeTransport,
    incarnation: u64,
    live: tokio::sync::watch::Receiver<u64>,
    first: pb::RunClosuresRequest,
) -> ClosureChannel {
    let (requests, incoming) = mpsc::unbounded_channel();
    let (replies, outgoing) = mpsc::unbounded_channel();
    let stream = FakeStream {
        transport: transport.clone(),
        replies,
        queued: VecDeque::new(),
        halt_on_error: first.halt_on_error,
        halted: false,
    };
    let _ = requests.send(first);
    tokio::spawn(stream.serve(incoming, incarnation, live));
    ClosureChannel::new(requests, Box::pin(UnboundedReceiverStream::new(outgoing)))
}

impl FakeStream {
    async fn serve(
        mut self,
        mut incoming: mpsc::UnboundedReceiver<pb::RunClosuresRequest>,
        incarnation: u64,
        live: tokio::sync::watch::Receiver<u64>,
    ) {
        let mut running: Option<Running> = None;
        let mut half_closed = false;
        let death = died(live, incarnation);
        tokio::pin!(death);
        loop {
            if running.is_none() {
                if let Some(request) = self.queued.pop_front() {
                    let transport = self.transport.clone();
                    running = Some(Box::pin(async move {
                        let id = request.closure_id;
                        (id, transport.run(request).await)
                    }));
                } else if half_closed {
                    return;
                }
            }
            tokio::select! {
                biased;
                () = &mut death => {
                    let _ = self.replies.send(Err(self.transport.down()));
                    return;
                }
                message = incoming.recv(), if !half_closed => match message {
                    Some(message) => self.apply(message),
                    None => half_closed = true,
                },
                (id, answer) = async { running.as_mut().expect("guarded").await },
                    if running.is_some() =>
                {
                    running = None;
                    if !self.answer(id, answer) {
                        return;
                    }
                }
            }
            if self.replies.is_closed() {
                return; // the client dropped the stream: queued closures die unrun
            }
        }
    }

    fn apply(&mut self, message: pb::RunClosuresRequest) {
        if message.resume {
            self.halted = false;
        }
        if message.return_queued {
            self.hand_back_queued("the coordinator asked for its queued closures back");
        }
        for closure in message.closures {
            self.transport.worker().record_received(closure.closure_id);
            if self.halted {
                self.send(returned(closure.closure_id, "the stream is halted"));
            } else {
                self.queued.push_back(closure);
            }
        }
    }

    /// Sends one closure's answer; `false` when the worker died (the stream has ended).
    fn answer(&mut self, id: u64, answer: Result<pb::RunClosureResponse, RpcError>) -> bool {
        use pb::closure_reply::Outcome;
        use pb::run_closure_response::Outcome as Ran;
        let outcome = match answer {
            Ok(response) => match response.outcome {
                Some(Ran::Result(value)) => Outcome::Result(value),
                Some(Ran::Error(error)) => Outcome::Error(error),
                None => Outcome::Refused(refusal(&RpcError::Internal("no outcome".into()))),
            },
            Err(RpcError::Unavailable(message)) => {
                let _ = self.replies.send(Err(RpcError::Unavailable(message)));
                return false;
            }
            Err(error) => Outcome::Refused(refusal(&error)),
        };
        let failed = !matches!(outcome, Outcome::Result(_));
        if failed && self.halt_on_error {
            self.halted = true;
        }
        self.send(pb::ClosureReply {
            closure_id: id,
            outcome: Some(outcome),
        });
        if failed && self.halt_on_error {
            self.hand_back_queued("a closure before it failed and the stream halts on errors");
        }
        true
    }

    fn hand_back_queued(&mut self, reason: &str) {
        for closure in std::mem::take(&mut self.queued) {
            self.send(returned(closure.closure_id, reason));
        }
    }

    fn send(&self, reply: pb::ClosureReply) {
        let _ = self.replies.send(Ok(pb::RunClosuresResponse {
            replies: vec![reply],
        }));
    }
}

fn refusal(error: &RpcError) -> pb::Refusal {
    pb::Refusal {
        code: error.code() as i32,
        message: error.message().to_owned(),
    }
}

fn returned(closure_id: u64, reason: &str) -> pb::ClosureReply {
    pb::ClosureReply {
        closure_id,
        outcome: Some(pb::closure_reply::Outcome::Returned(pb::Returned {
            reason: reason.to_owned(),
        })),
    }
}
