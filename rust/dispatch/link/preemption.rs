//! A worker's preemption notice as its link acts on it (`jaxcluster worker
//! --preemption-notice`; the worker side is `worker/preemption.rs`).
//!
//! The notice reaches the link on the `RunClosures` stream (the worker sends a message on
//! every open stream the moment it arrives, and stamps every later one) or in a
//! `GetStatus` answer. The link then, at once: sends nothing more (its pipeline is
//! `going_away`), asks for its queued closures back (`return_queued`; the worker's drain
//! hands them back too), and lets the running closure finish while the deadline allows.
//! None of this is charged to a closure: a closure handed back never started, and the
//! worker's death after a notice, or the deadline passing under a running closure, puts
//! the closure back without a death (`max_closure_retries` counts deaths). Once nothing is
//! outstanding the link recovers as from a drain, and a new incarnation on the same address
//! (the replacement VM or process) serves again with the notice forgotten.
//!
//! A worker that ends soon after its notice (nothing ran there: it drains at once) may be
//! gone before the link hears of it, e.g. while the link waits out a reconnection backoff.
//! Its launcher (the slice supervisor, `LocalCluster`) then tells the next process, which
//! reports `GetStatus.previous_exit` as [`PREEMPTED_EXIT`]`SOURCE)`: the link counts that
//! preemption when the new process answers, unless it heard the notice itself.

use std::time::{Duration, Instant};

use super::Link;
use crate::dispatch::transport::WorkerTransport;
use crate::log_target::DISPATCH;
use crate::rpc::{describe_deadline, pb, unix_now};

/// How `GetStatus.previous_exit` begins for a process that drained after a preemption
/// notice; the notice's source and `)` follow. Spelled by the worker's
/// `jaxcluster._task_process.describe_exit`.
pub(crate) const PREEMPTED_EXIT: &str = "drained after a preemption notice (";

/// The source of the notice the previous process drained after, when `previous_exit`
/// says it was preempted.
pub(crate) fn preempted_before(previous_exit: &str) -> Option<&str> {
    previous_exit
        .strip_prefix(PREEMPTED_EXIT)?
        .strip_suffix(')')
        .filter(|source| !source.is_empty())
}

/// A notice this link acted on: what the worker said, and its deadline on this clock.
pub(super) struct Noticed {
    pub notice: pb::PreemptionNotice,
    pub deadline: Option<Instant>,
}

/// When a notice's deadline (seconds since the Unix epoch) falls on this process's clock;
/// `None` when the notice gives none (0) or one no clock holds (NaN, infinite, centuries
/// away): a worker's report is input, and an absurd deadline is treated as unknown rather
/// than allowed to panic the link.
fn local_deadline(deadline_unix_seconds: f64, now_unix: f64) -> Option<Instant> {
    if deadline_unix_seconds.is_nan() || deadline_unix_seconds <= 0.0 {
        return None;
    }
    let left = Duration::try_from_secs_f64((deadline_unix_seconds - now_unix).max(0.0)).ok()?;
    Instant::now().checked_add(left)
}

impl<T: WorkerTransport> Link<T> {
    /// Acts on `notice` the first time this worker process reports one (see the module
    /// documentation); later reports change nothing.
    pub(super) fn noticed(&mut self, notice: &pb::PreemptionNotice) {
        if self.notice.is_some() {
            return;
        }
        let deadline = local_deadline(notice.deadline_unix_seconds, unix_now());
        self.notice = Some(Noticed {
            notice: notice.clone(),
            deadline,
        });
        self.status.set_preemption(Some(notice.clone()));
        self.shared.counters.count_preemption(&notice.source);
        let outstanding = self.pipeline.outstanding.len();
        tracing::warn!(
            target: DISPATCH,
            worker = self.address(),
            worker_index = self.index,
            source = notice.source.as_str(),
            deadline = notice.deadline_unix_seconds,
            "worker {} (worker {}) is being preempted ({}: {}; {}): it gets no new closure, \
             {} closure(s) outstanding on it are taken back or finish there, none charged \
             to max_closure_retries",
            self.address(),
            self.index,
            notice.source,
            notice.detail,
            describe_deadline(notice.deadline_unix_seconds),
            outstanding,
        );
        if self.pipeline.going_away.is_none() {
            self.pipeline.going_away = Some(self.preempted_reason());
        }
        if outstanding > 1 {
            if let Some(channel) = &self.pipeline.channel {
                channel.send(pb::RunClosuresRequest {
                    return_queued: true,
                    ..pb::RunClosuresRequest::default()
                });
            }
        }
    }

    /// Whether this worker process announced its preemption.
    pub(super) fn preempted(&self) -> bool {
        self.notice.is_some()
    }

    /// When the running closure stops being worth waiting for: the notice's deadline.
    pub(super) fn preemption_deadline(&self) -> Option<Instant> {
        self.notice.as_ref().and_then(|noticed| noticed.deadline)
    }

    /// A new worker process answers on this address: the notice was the old one's. When
    /// the link never heard a notice from the old process, `previous_exit` may still say
    /// a process ended preempted since (see the module documentation): counted here.
    pub(super) fn forget_notice(&mut self, previous_exit: &str) {
        if self.notice.take().is_some() {
            self.status.set_preemption(None);
            return;
        }
        let Some(source) = preempted_before(previous_exit) else {
            return;
        };
        self.shared.counters.count_preemption(source);
        tracing::warn!(
            target: DISPATCH,
            worker = self.address(),
            worker_index = self.index,
            source,
            "worker {} (worker {}) was preempted ({}) before this coordinator heard its \
             notice: its new process says its previous one {}",
            self.address(),
            self.index,
            source,
            previous_exit,
        );
    }

    /// Why the link stops using its worker, for `last_error` and log lines.
    pub(super) fn preempted_reason(&self) -> String {
        match &self.notice {
            Some(noticed) => format!(
                "the worker is being preempted ({}: {})",
                noticed.notice.source, noticed.notice.detail
            ),
            None => "the worker is being preempted".to_owned(),
        }
    }

    /// The deadline passed with the worker still running a closure: run it elsewhere,
    /// uncharged (the worker's answer, if it comes, goes nowhere).
    pub(super) fn preemption_deadline_passed(&mut self) {
        let reason = format!(
            "{}, and its deadline passed before its running closure finished",
            self.preempted_reason()
        );
        self.pipeline.drop_stream();
        self.worker_died(&reason, false, self.incarnation);
    }
}

#[cfg(test)]
mod tests {
    use super::{local_deadline, preempted_before, PREEMPTED_EXIT};
    use std::time::{Duration, Instant};

    #[test]
    fn a_notice_deadline_is_local_time_or_unknown_never_a_panic() {
        let now = 1_800_000_000.0;
        let soon = local_deadline(now + 30.0, now).unwrap();
        let left = soon.saturating_duration_since(Instant::now());
        assert!(
            left > Duration::from_secs(29) && left <= Duration::from_secs(30),
            "{left:?}"
        );
        let past = local_deadline(now - 5.0, now).unwrap();
        assert!(past <= Instant::now());
        for absurd in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e300] {
            assert!(local_deadline(absurd, now).is_none(), "{absurd}");
        }
    }

    #[test]
    fn only_a_preempted_previous_exit_names_a_source() {
        let exit = format!("{PREEMPTED_EXIT}gce)");
        assert_eq!(preempted_before(&exit), Some("gce"));
        assert_eq!(preempted_before("exit status 0"), None);
        assert_eq!(preempted_before(""), None);
        assert_eq!(preempted_before(&format!("{PREEMPTED_EXIT})")), None);
    }
}
