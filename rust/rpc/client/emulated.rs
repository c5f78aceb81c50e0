//! `RunClosures` emulated on top of one-closure-at-a-time calls, with the worker's rules:
//! closures run one at a time in arrival order, `return_queued` hands back what has not
//! started, `halt_on_error` / `resume` as documented in the proto.
//!
//! Two users: [`WorkerClient::run_closures`](crate::rpc::WorkerClient::run_closures) against a
//! worker of protocol revision 1 (which answers the stream `UNIMPLEMENTED`), driving unary
//! `RunClosure` calls, so a newer coordinator keeps working with an older worker; and the
//! dispatcher's in-memory fake worker. A call failing `UNAVAILABLE` ends the stream with
//! that error, as a broken connection does (the queued closures end with it); any other
//! error refuses that closure with its code.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;

use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::rpc::{pb, ClosureChannel, RpcError};

/// Runs single closures for an emulated stream.
pub trait ClosureRunner: Send + Sync + 'static {
    /// Runs one closure as unary `RunClosure` would.
    fn run(
        &self,
        request: pb::RunClosureRequest,
    ) -> impl Future<Output = Result<pb::RunClosureResponse, RpcError>> + Send;

    /// Called as each closure arrives on the stream (before it is queued).
    fn arrived(&self, _closure_id: u64) {}

    /// Resolves, with the error to end the stream with, once the peer is known to be gone
    /// (even while no closure runs); never, by default.
    fn gone(&self) -> impl Future<Output = RpcError> + Send {
        std::future::pending()
    }
}

type Running =
    Pin<Box<dyn Future<Output = (u64, Result<pb::RunClosureResponse, RpcError>)> + Send>>;

/// Opens an emulated stream whose first message is `first`; must be called inside the
/// tokio runtime, which runs the emulation.
pub fn emulate<R: ClosureRunner>(runner: R, first: pb::RunClosuresRequest) -> ClosureChannel {
    let (requests, incoming) = mpsc::unbounded_channel();
    let (replies, outgoing) = mpsc::unbounded_channel();
    let stream = Emulation {
        runner: std::sync::Arc::new(runner),
        replies,
        queued: VecDeque::new(),
        halt_on_error: first.halt_on_error,
        halted: false,
    };
    let _ = requests.send(first);
    tokio::spawn(stream.serve(incoming));
    ClosureChannel::new(requests, Box::pin(UnboundedReceiverStream::new(outgoing)))
}

/// One emulated stream's state.
struct Emulation<R> {
    runner: std::sync::Arc<R>,
    replies: mpsc::UnboundedSender<Result<pb::RunClosuresResponse, RpcError>>,
    queued: VecDeque<pb::RunClosureRequest>,
    halt_on_error: bool,
    halted: bool,
}

impl<R: ClosureRunner> Emulation<R> {
    async fn serve(mut self, mut incoming: mpsc::UnboundedReceiver<pb::RunClosuresRequest>) {
        let mut running: Option<Running> = None;
        let mut half_closed = false;
        let runner = std::sync::Arc::clone(&self.runner);
        let gone = runner.gone();
        tokio::pin!(gone);
        loop {
            if running.is_none() {
                if let Some(request) = self.queued.pop_front() {
                    let runner = std::sync::Arc::clone(&self.runner);
                    running = Some(Box::pin(async move {
                        let id = request.closure_id;
                        (id, runner.run(request).await)
                    }));
                } else if half_closed {
                    return;
                }
            }
            tokio::select! {
                biased;
                error = &mut gone => {
                    let _ = self.replies.send(Err(error));
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
            self.runner.arrived(closure.closure_id);
            if self.halted {
                self.send(returned(closure.closure_id, "the stream is halted"));
            } else {
                self.queued.push_back(closure);
            }
        }
    }

    /// Sends one closure's answer; `false` when the stream has ended (peer unavailable).
    fn answer(&mut self, id: u64, answer: Result<pb::RunClosureResponse, RpcError>) -> bool {
        use pb::closure_reply::Outcome;
        use pb::run_closure_response::Outcome as Ran;
        let outcome = match answer {
            Ok(response) => match response.outcome {
                Some(Ran::Result(value)) => Outcome::Result(value),
                Some(Ran::Error(error)) => Outcome::Error(error),
                None => Outcome::Refused(refusal(&RpcError::Internal(
                    "RunClosure answered with neither a result nor an error".into(),
                ))),
            },
            Err(error @ RpcError::Unavailable(_)) => {
                let _ = self.replies.send(Err(error));
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
            ..pb::RunClosuresResponse::default()
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
