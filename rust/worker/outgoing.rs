//! What a `RunClosures` call sends back: the batched answers of [`Replies`], each
//! `RunClosuresResponse` above the message limit cut into chunks (protocol revision 4; only
//! a client that set `accepts_chunks` is ever given one, see `reader.rs`), and the status
//! that ends the call when the reader refused a malformed chunk sequence.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use prost::Message;
use tokio::sync::oneshot;
use tokio_stream::Stream;
use tonic::Status;

use super::stream::Replies;
use crate::rpc::pb;
use crate::rpc::wire::chunks;

/// The response stream of one `RunClosures` call.
pub struct Outgoing {
    replies: Replies,
    /// Chunks of a large response not sent yet.
    pending: VecDeque<pb::Chunk>,
    /// A status from the reader ends the call.
    failed: Option<oneshot::Receiver<Status>>,
    max_message_bytes: usize,
    done: bool,
}

impl Outgoing {
    /// The answers of `replies`, ended early by a status on `failed`.
    pub(super) fn new(
        replies: Replies,
        failed: oneshot::Receiver<Status>,
        max_message_bytes: usize,
    ) -> Self {
        Self {
            replies,
            pending: VecDeque::new(),
            failed: Some(failed),
            max_message_bytes,
            done: false,
        }
    }

    fn chunk_message(chunk: pb::Chunk) -> pb::RunClosuresResponse {
        pb::RunClosuresResponse {
            chunk: Some(chunk),
            ..pb::RunClosuresResponse::default()
        }
    }
}

impl Stream for Outgoing {
    type Item = Result<pb::RunClosuresResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        if let Some(failed) = self.failed.as_mut() {
            match Pin::new(failed).poll(cx) {
                Poll::Ready(Ok(status)) => {
                    self.done = true;
                    return Poll::Ready(Some(Err(status)));
                }
                // The reader finished without refusing anything.
                Poll::Ready(Err(_)) => self.failed = None,
                Poll::Pending => {}
            }
        }
        if let Some(chunk) = self.pending.pop_front() {
            return Poll::Ready(Some(Ok(Self::chunk_message(chunk))));
        }
        match Pin::new(&mut self.replies).poll_next(cx) {
            Poll::Ready(Some(Ok(response))) if response.encoded_len() > self.max_message_bytes => {
                let limit = self.max_message_bytes;
                self.pending = chunks::split_message(&response, limit, "").into();
                let first = self.pending.pop_front().map(Self::chunk_message);
                Poll::Ready(first.map(Ok))
            }
            Poll::Ready(None) => {
                self.done = true;
                Poll::Ready(None)
            }
            other => other,
        }
    }
}
