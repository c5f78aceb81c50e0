//! The client half of `RunClosures`: [`ClosureChannel`], an open stream to one worker, and
//! how [`WorkerClient`] opens one.
//!
//! Sending never waits: requests go into an unbounded channel that the connection drains
//! (the coordinator bounds what it sends by its pipeline depth). Answers are read with
//! [`ClosureChannel::next`], which decodes on the caller's thread.

use std::pin::Pin;

use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::{Stream, StreamExt};

use super::client::WorkerClient;
use super::emulated::{emulate, ClosureRunner};
use super::{pb, RpcError};

/// The answers of an open stream, as they arrive.
pub type Replies = Pin<Box<dyn Stream<Item = Result<pb::RunClosuresResponse, RpcError>> + Send>>;

/// An open `RunClosures` stream: send closures with [`send`](Self::send), read answers
/// with [`next`](Self::next). Dropping it cancels the stream; the worker then drops the
/// closures it had queued but not started.
pub struct ClosureChannel {
    requests: mpsc::UnboundedSender<pb::RunClosuresRequest>,
    replies: Replies,
}

impl ClosureChannel {
    /// A channel over a request sender and an answer stream (for transports other than
    /// the tonic client, e.g. an in-memory fake).
    pub fn new(requests: mpsc::UnboundedSender<pb::RunClosuresRequest>, replies: Replies) -> Self {
        Self { requests, replies }
    }

    /// Queues `request` for sending; `false` if the stream has already ended.
    pub fn send(&self, request: pb::RunClosuresRequest) -> bool {
        self.requests.send(request).is_ok()
    }

    /// The next message of answers; `None` once the worker ended the stream.
    pub async fn next(&mut self) -> Option<Result<pb::RunClosuresResponse, RpcError>> {
        self.replies.next().await
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
        first: pb::RunClosuresRequest,
    ) -> Result<ClosureChannel, RpcError> {
        let (requests, receiver) = mpsc::unbounded_channel();
        let _ = requests.send(first.clone());
        let context = format!("RunClosures on worker {}", self.address());
        let mut inner = self.inner();
        let response = match inner
            .run_closures(UnboundedReceiverStream::new(receiver))
            .await
        {
            Ok(response) => response,
            Err(status) if status.code() == tonic::Code::Unimplemented => {
                return Ok(emulate(UnaryRunner(self.clone()), first));
            }
            Err(status) => return Err(RpcError::from(status).with_context(&context)),
        };
        let replies = response
            .into_inner()
            .map(move |item| item.map_err(|status| RpcError::from(status).with_context(&context)));
        Ok(ClosureChannel::new(requests, Box::pin(replies)))
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
