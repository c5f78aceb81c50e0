//! [`Preemption`]: the preemption notice a worker holds (`jaxcluster worker
//! --preemption-notice`), and telling every open `RunClosures` stream at once when it
//! arrives.
//!
//! The watchers (metadata servers, signals) live in Python
//! (`jaxcluster/worker/preemption.py`); they call `WorkerServer.preempt`, which records the
//! notice here and then begins the drain. From then on `GetStatus` reports
//! `SERVING_STATE_PREEMPTING` with the notice, and every `RunClosuresResponse` carries it.
//! A stream with nothing to answer would say so only at the coordinator's next ping, so
//! each open stream is sent a message (a heartbeat) the moment the notice arrives: the
//! coordinator stops sending within one round trip.

use std::sync::{Mutex, OnceLock, PoisonError};

use tokio::sync::mpsc::WeakUnboundedSender;

use super::stream::{Outbound, ReplySender};
use crate::rpc::pb;

/// The notice, once one arrived, and the open streams to tell.
#[derive(Debug, Default)]
pub struct Preemption {
    /// The first notice; later ones (a SIGTERM after a metadata notice) change nothing.
    notice: OnceLock<pb::PreemptionNotice>,
    /// Answer channels of the streams opened so far, weakly: a stream's response ends when
    /// its last sender goes, which this must not prevent. Gone ones are pruned as streams
    /// open.
    streams: Mutex<Vec<WeakUnboundedSender<Outbound>>>,
}

impl Preemption {
    /// The notice, if one arrived.
    pub fn notice(&self) -> Option<&pb::PreemptionNotice> {
        self.notice.get()
    }

    /// Records `notice` and sends a message on every open stream; `false` (nothing
    /// changes) if a notice had arrived already.
    pub fn announce(&self, notice: pb::PreemptionNotice) -> bool {
        if self.notice.set(notice).is_err() {
            return false;
        }
        let streams = std::mem::take(&mut *self.lock());
        for stream in streams.iter().filter_map(WeakUnboundedSender::upgrade) {
            let _ = stream.send(Outbound::Heartbeat);
        }
        true
    }

    /// Remembers a new stream's answer channel, to tell it when a notice arrives.
    pub(super) fn watch(&self, stream: &ReplySender) {
        if self.notice.get().is_some() {
            return; // its messages carry the notice from the first
        }
        let mut streams = self.lock();
        streams.retain(|open| open.strong_count() > 0);
        streams.push(stream.downgrade());
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<WeakUnboundedSender<Outbound>>> {
        self.streams.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notice(source: &str) -> pb::PreemptionNotice {
        pb::PreemptionNotice {
            source: source.to_owned(),
            deadline_unix_seconds: 12.5,
            detail: String::new(),
        }
    }

    #[test]
    fn the_first_notice_wins_and_every_open_stream_is_told_once() {
        let preemption = Preemption::default();
        let (open, mut open_rx) = tokio::sync::mpsc::unbounded_channel();
        let (gone, _gone_rx) = tokio::sync::mpsc::unbounded_channel();
        preemption.watch(&open);
        preemption.watch(&gone);
        drop(gone);
        assert!(preemption.notice().is_none());
        assert!(preemption.announce(notice("gce")));
        assert!(!preemption.announce(notice("signal")));
        assert_eq!(preemption.notice().map(|n| n.source.as_str()), Some("gce"));
        assert!(matches!(open_rx.try_recv(), Ok(Outbound::Heartbeat)));
        assert!(open_rx.try_recv().is_err(), "told once");
        // Watching holds no sender: the stream's response still ends when its own goes.
        drop(open);
        assert!(matches!(
            open_rx.try_recv(),
            Err(tokio::sync::mpsc::error::TryRecvError::Disconnected)
        ));
    }
}
