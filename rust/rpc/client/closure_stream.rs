//! The client half of `RunClosures`: [`ClosureChannel`], an open stream to one worker, and
//! how [`WorkerClient`] opens one.
//!
//! Sending never waits: requests go into an unbounded channel that the connection drains
//! (the coordinator bounds what it sends by its pipeline depth). Answers are read with
//! [`ClosureChannel::next`], which decodes on the caller's thread.
//!
//! Messages above the size limit (protocol revision 4): a request too large for one
//! message leaves in chunks when the worker says (response metadata) that it assembles
//! them, and a closure too large for one message is refused locally, `RESOURCE_EXHAUSTED`
//! saying why, when it does not. Chunked answers are assembled before they are handed on,
//! so a caller only ever sees whole messages.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::{Stream, StreamExt};

use super::emulated::{emulate, ClosureRunner};
use super::worker::WorkerClient;
use crate::rpc::wire::chunks::{self, Assembler};
use crate::rpc::wire::frames::{Ending, FramedBody, Unframed};
use crate::rpc::{pb, RpcError};

/// How a channel treats messages above the size limit.
#[derive(Debug, Clone, Copy)]
struct Large {
    /// The worker's message limit (the client's own setting, which both sides share).
    max_message_bytes: usize,
    /// The worker assembles chunked requests (revision 4 or later).
    chunks: bool,
}

/// The answers of an open stream, as they arrive.
pub type Replies = Pin<Box<dyn Stream<Item = Result<pb::RunClosuresResponse, RpcError>> + Send>>;

/// An open `RunClosures` stream: send closures with [`send`](Self::send), read answers
/// with [`next`](Self::next). Dropping it cancels the stream; the worker then drops the
/// closures it had queued but not started.
pub struct ClosureChannel {
    requests: mpsc::UnboundedSender<pb::RunClosuresRequest>,
    replies: Replies,
    large: Option<Large>,
    /// Answers made here (closures refused before sending), handed out before the
    /// worker's.
    local: Mutex<VecDeque<pb::ClosureReply>>,
    assembler: Assembler,
    /// When the worker's last message (a whole answer or one chunk of one) arrived: a large
    /// chunked answer takes a while, and its chunks show the worker alive meanwhile.
    last_received: Option<Instant>,
}

impl ClosureChannel {
    /// A channel over a request sender and an answer stream (for transports other than
    /// the tonic client, e.g. an in-memory fake).
    pub fn new(requests: mpsc::UnboundedSender<pb::RunClosuresRequest>, replies: Replies) -> Self {
        Self {
            requests,
            replies,
            large: None,
            local: Mutex::new(VecDeque::new()),
            assembler: Assembler::default(),
            last_received: None,
        }
    }

    /// Queues `request` for sending; `false` if the stream has already ended. A request
    /// above the size limit leaves in chunks, or its oversized closures are refused here
    /// when the worker cannot assemble chunks.
    pub fn send(&self, request: pb::RunClosuresRequest) -> bool {
        let Some(large) = self.large else {
            return self.requests.send(request).is_ok();
        };
        let size = request.encoded_len();
        if size <= large.max_message_bytes {
            return self.requests.send(request).is_ok();
        }
        if large.chunks {
            return chunks::split_message(&request, large.max_message_bytes, "")
                .into_iter()
                .all(|chunk| {
                    self.requests
                        .send(pb::RunClosuresRequest {
                            chunk: Some(chunk),
                            ..pb::RunClosuresRequest::default()
                        })
                        .is_ok()
                });
        }
        self.send_each(request, large.max_message_bytes)
    }

    /// Sends the closures of an oversized `request` one message each (the first with the
    /// request's flags), refusing those too large alone: a worker older than revision 4
    /// would end the whole stream on an oversized message.
    fn send_each(&self, mut request: pb::RunClosuresRequest, limit: usize) -> bool {
        let closures = std::mem::take(&mut request.closures);
        let mut open = self.requests.send(request).is_ok();
        for closure in closures {
            let size = closure.encoded_len();
            if size + 16 > limit {
                let status =
                    chunks::needs_revision_4("worker", "closure's RunClosures", size, limit);
                self.local
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push_back(pb::ClosureReply {
                        closure_id: closure.closure_id,
                        outcome: Some(pb::closure_reply::Outcome::Refused(pb::Refusal {
                            code: status.code() as i32,
                            message: status.message().to_owned(),
                        })),
                    });
                continue;
            }
            open &= self
                .requests
                .send(pb::RunClosuresRequest {
                    closures: vec![closure],
                    ..pb::RunClosuresRequest::default()
                })
                .is_ok();
        }
        open
    }

    /// When the worker's last message arrived (a chunk counts), if any did.
    pub fn last_received(&self) -> Option<Instant> {
        self.last_received
    }

    /// The next message of answers; `None` once the worker ended the stream.
    pub async fn next(&mut self) -> Option<Result<pb::RunClosuresResponse, RpcError>> {
        let refused: Vec<_> = self
            .local
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
            .collect();
        if !refused.is_empty() {
            return Some(Ok(pb::RunClosuresResponse {
                replies: refused,
                ..pb::RunClosuresResponse::default()
            }));
        }
        loop {
            let received = self.replies.next().await;
            self.last_received = Some(Instant::now());
            let response = match received? {
                Ok(response) => response,
                Err(e) => return Some(Err(e)),
            };
            let Some(chunk) = response.chunk else {
                return Some(Ok(response));
            };
            let assembled = self.assembler.push(chunk).and_then(|done| {
                done.map(|encoded| chunks::decode(encoded, "an answer"))
                    .transpose()
            });
            match assembled {
                Ok(Some(response)) => return Some(Ok(response)),
                Ok(None) => {}
                Err(status) => {
                    return Some(Err(RpcError::Internal(format!(
                        "the worker sent a malformed chunked answer: {}",
                        status.message()
                    ))))
                }
            }
        }
    }

    /// What [`next`](Self::next) would return if it did not have to wait; `None` if it
    /// would wait. Must run inside the tokio runtime.
    #[allow(clippy::option_option)] // "would wait" vs "the stream ended"
    pub fn try_next(&mut self) -> Option<Option<Result<pb::RunClosuresResponse, RpcError>>> {
        let waker = std::task::Waker::from(std::sync::Arc::new(NoWake));
        let mut context = std::task::Context::from_waker(&waker);
        match self.replies.as_mut().poll_next(&mut context) {
            std::task::Poll::Ready(item) => Some(item),
            std::task::Poll::Pending => None,
        }
    }
}

/// A waker for a poll that will not wait: the next real poll registers its own.
struct NoWake;

impl std::task::Wake for NoWake {
    fn wake(self: std::sync::Arc<Self>) {}
}

impl std::fmt::Debug for ClosureChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClosureChannel")
            .field("open", &!self.requests.is_closed())
            .finish_non_exhaustive()
    }
}

impl WorkerClient {
    /// Opens a `RunClosures` stream whose first message is `first` (which carries the
    /// stream's options, e.g. `halt_on_error`). Resolves once the worker has accepted the
    /// call: a missing or wrong token fails here with `UNAUTHENTICATED`, before anything
    /// was queued. A worker of protocol revision 1, which does not know the call, gets the
    /// stream emulated over unary `RunClosure` calls (see [`super::emulated`]).
    pub async fn run_closures(
        &self,
        mut first: pb::RunClosuresRequest,
    ) -> Result<ClosureChannel, RpcError> {
        let (requests, receiver) = mpsc::unbounded_channel();
        first.accepts_chunks = true;
        // The worker's revision is known only once it answers: an oversized first message
        // waits until then, behind one carrying the stream's options.
        let limit = self.max_message_bytes();
        let held = (first.encoded_len() > limit).then(|| {
            let closures = std::mem::take(&mut first.closures);
            pb::RunClosuresRequest {
                closures,
                ..pb::RunClosuresRequest::default()
            }
        });
        let _ = requests.send(first.clone());
        let context = format!("RunClosures on worker {}", self.address());
        let body = FramedBody::new(
            UnboundedReceiverStream::new(receiver).map(Ok::<_, tonic::Status>),
            limit,
            "a RunClosures request",
            Ending::Request,
        );
        let opened = match self.open_run_closures(body).await {
            Ok(opened) => opened,
            Err(status) if status.code() == tonic::Code::Unimplemented => {
                return Ok(emulate(UnaryRunner(self.clone()), first));
            }
            Err(status) => return Err(RpcError::from(status).with_context(&context)),
        };
        let revision = opened
            .headers()
            .get(crate::rpc::REVISION_HEADER)
            .and_then(|v| v.to_str().ok()?.parse::<u32>().ok())
            .unwrap_or(0);
        // A worker that ended the call at once with OK (trailers-only) sends no body.
        let ended = tonic::Status::from_header_map(opened.headers()).is_some();
        let replies = Unframed::<_, pb::RunClosuresResponse>::new(
            opened.into_body(),
            limit,
            "a RunClosures response from the worker",
            Ending::Response,
        )
        .take_while(move |_| !ended)
        .map(move |item| item.map_err(|status| RpcError::from(status).with_context(&context)));
        let mut channel = ClosureChannel::new(requests, Box::pin(replies));
        channel.large = Some(Large {
            max_message_bytes: limit,
            chunks: revision >= 4,
        });
        if let Some(held) = held {
            channel.send(held);
        }
        Ok(channel)
    }
}

/// Runs an emulated stream's closures with unary `RunClosure` calls.
struct UnaryRunner(WorkerClient);

impl ClosureRunner for UnaryRunner {
    async fn run(
        &self,
        request: pb::RunClosureRequest,
    ) -> Result<pb::RunClosureResponse, RpcError> {
        self.0.run_closure(request, None).await
    }
}
