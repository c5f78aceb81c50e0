//! `RunClosures` on a fake worker: the protocol's emulation ([`crate::rpc::client::emulated`])
//! driving the fake's closure runner, so a stream follows the real worker's rules (one at
//! a time in arrival order, hand-backs, halting). A worker that dies ends the stream with
//! `UNAVAILABLE`, as a broken connection does; queued closures die with it.

use tokio::sync::watch;

use super::transport::FakeTransport;
use super::worker::died;
use crate::rpc::client::emulated::{emulate, ClosureRunner};
use crate::rpc::{pb, ClosureChannel, RpcError};

/// Runs a stream's closures on one incarnation of a fake worker.
struct FakeRunner {
    transport: FakeTransport,
    incarnation: u64,
    live: watch::Receiver<u64>,
}

impl Drop for FakeRunner {
    fn drop(&mut self) {
        // The emulation has ended (and sent its last answer or error).
        self.transport
            .worker()
            .streams
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl ClosureRunner for FakeRunner {
    async fn run(
        &self,
        request: pb::RunClosureRequest,
    ) -> Result<pb::RunClosureResponse, RpcError> {
        self.transport.run(request).await
    }

    fn arrived(&self, closure_id: u64) {
        self.transport.worker().record_received(closure_id);
    }

    async fn gone(&self) -> RpcError {
        died(self.live.clone(), self.incarnation).await;
        self.transport.down()
    }
}

/// Opens a stream on `transport`'s worker (up, as `incarnation`); `first` is its first
/// message.
pub(super) fn open(
    transport: &FakeTransport,
    incarnation: u64,
    live: watch::Receiver<u64>,
    first: pb::RunClosuresRequest,
) -> ClosureChannel {
    transport
        .worker()
        .streams
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let runner = FakeRunner {
        transport: transport.clone(),
        incarnation,
        live,
    };
    emulate(runner, first)
}
