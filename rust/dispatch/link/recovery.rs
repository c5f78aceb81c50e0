//! A link's worker state machine off the happy path: a worker found failed is probed with
//! exponential backoff until it answers (then rebuilt: functions forgotten, resources
//! recreated) or the recovery bound passes (given up); and once every link has given up,
//! whatever is scheduled fails instead of waiting forever.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Interruption, Link};
use crate::dispatch::closure::{Closure, Work};
use crate::dispatch::config::BackoffConfig;
use crate::dispatch::failure::ClosureFailure;
use crate::dispatch::metrics::Counters;
use crate::dispatch::resources::ResourceState;
use crate::dispatch::status::Incarnation;
use crate::dispatch::transport::WorkerTransport;
use crate::dispatch::LinkState;
use crate::log_target::DISPATCH;
use crate::rpc::{pb, RpcError};

/// Exponential reconnection delays: `initial`, doubling, capped at `max`.
#[derive(Debug, Clone)]
pub(super) struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    pub fn new(config: BackoffConfig) -> Self {
        Self {
            next: config.initial.min(config.max),
            max: config.max,
        }
    }

    /// The next delay to wait.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        delay
    }
}

/// How a recovery attempt ended.
pub(super) enum Recovery {
    Up,
    GaveUp,
    Stopped,
}

impl<T: WorkerTransport> Link<T> {
    /// Marks the worker failed: whatever was outstanding on it goes back to the queue, its
    /// resources are aborted and the link starts recovering.
    pub(super) fn worker_failed(&mut self, reason: &str) {
        self.worker_failed_with(reason, None);
    }

    /// [`worker_failed`](Self::worker_failed), putting `closure` (the one whose execution
    /// found the failure) back first.
    pub(super) fn worker_failed_with(&mut self, reason: &str, closure: Option<Closure>) {
        let mut put_back = usize::from(closure.is_some());
        if let Some(closure) = closure {
            self.put_back(closure);
        }
        put_back += self.forget_pipeline();
        Counters::bump(&self.shared.counters.worker_failures);
        Counters::bump(&self.status.counters.failures);
        self.recovering_since = Instant::now();
        self.status
            .set(LinkState::Recovering, Some(reason.to_owned()));
        for resource in self.shared.resources.live() {
            resource.worker_failed(self.index, self.address(), reason);
        }
        tracing::warn!(
            target: DISPATCH,
            worker = self.address(),
            worker_index = self.index,
            error = reason,
            "lost worker {} (worker {}): {}; {} closure(s) it had go back to the queue to \
             run on another worker; reconnecting with backoff",
            self.address(),
            self.index,
            reason,
            put_back,
        );
    }

    /// Probes with backoff until the worker answers (then rebuilds its resources and
    /// serves again), the recovery bound passes (given up), or the dispatcher stops.
    pub(super) async fn recover(&mut self) -> Recovery {
        let mut backoff = Backoff::new(self.shared.config.backoff);
        let bound = self.shared.config.recovery_timeout;
        let mut failed_probes = 0u32;
        let mut reported: Option<String> = None;
        loop {
            if self.status.is_retiring() {
                // Removed while down: its closures went back when it failed.
                return Recovery::Stopped;
            }
            let elapsed = self.recovering_since.elapsed();
            if elapsed >= bound {
                self.settle_doomed(true);
                self.give_up(bound);
                return Recovery::GaveUp;
            }
            let remaining = bound.saturating_sub(elapsed);
            let probe_timeout = self.shared.config.probe_timeout.min(remaining);
            let Some(answer) = self
                .call(self.transport.get_status(Some(probe_timeout)))
                .await
            else {
                return Recovery::Stopped;
            };
            let mut restarted = false;
            let rebuilt = match answer {
                Ok(status) if shutting_down(&status) => {
                    let now = Incarnation::of(&status);
                    if self.incarnation.is_some_and(|before| before != now) {
                        self.forget_notice(&status.previous_exit);
                    }
                    // Known from now on: a later probe of this same process neither
                    // forgets its notice nor counts its predecessor's preemption again.
                    self.incarnation = Some(now);
                    if let Some(notice) = &status.preemption {
                        self.noticed(notice);
                    }
                    self.explain_deaths(&status);
                    Err(Interruption::WorkerFailed(
                        "the worker is shutting down".to_owned(),
                    ))
                }
                Ok(status) => {
                    let expected = self.status.slice_size();
                    let own = self.shared.config.versions.as_ref();
                    let (address, index) = (self.address().to_owned(), self.index);
                    if let Some(reason) =
                        crate::dispatch::slices::mismatch(&status, expected, &address)
                            .or_else(|| self.versions.refusal(own, &status, &address, index))
                    {
                        Err(Interruption::WorkerFailed(reason))
                    } else {
                        restarted = self.observe(status);
                        self.reconnected().await
                    }
                }
                Err(error) if reachable(&error) => self.reconnected().await,
                Err(error) => Err(Interruption::WorkerFailed(error.message().to_owned())),
            };
            let pause = match rebuilt {
                Ok(rebuilt) => {
                    self.shared.reached.store(true, Ordering::Release);
                    self.settle_doomed(true);
                    self.status.set(LinkState::Up, None);
                    self.report_up(failed_probes, restarted, rebuilt);
                    self.connected_once = true;
                    return Recovery::Up;
                }
                Err(Interruption::Stopped) => return Recovery::Stopped,
                Err(Interruption::WorkerFailed(reason)) => {
                    failed_probes += 1;
                    let pause = backoff
                        .next_delay()
                        .min(bound.saturating_sub(self.recovering_since.elapsed()));
                    self.report_probe_failure(&reason, failed_probes, pause, &mut reported);
                    self.status.note_error(reason);
                    pause
                }
            };
            self.settle_doomed(false);
            let pause = match self.doomed_due() {
                Some(due) => pause.min(due),
                None => pause,
            };
            let slept = match self.shared.unreachable() {
                // Nothing was ever reachable: fail what is scheduled meanwhile, at once.
                Some(message) => self.fail_arrivals(&message, pause).await,
                None => self.sleep(pause).await,
            };
            if !slept {
                return Recovery::Stopped;
            }
        }
    }

    /// The worker answers: forget what it held and rebuild every live resource before it
    /// serves closures. Returns how many resources were rebuilt.
    async fn reconnected(&mut self) -> Result<usize, Interruption> {
        self.sent.clear();
        let resources = self.shared.resources.live();
        for resource in &resources {
            self.create_resource(resource).await?;
        }
        Ok(resources.len())
    }

    /// Logs a failed probe: the first failure to reach a worker that never answered is a
    /// warning (a wrong address, a firewall, a worker not started: the user must know at
    /// once), a worker lost earlier was already warned about, so its failed reconnections
    /// are INFO when the error changes and DEBUG otherwise.
    fn report_probe_failure(
        &self,
        reason: &str,
        attempt: u32,
        pause: Duration,
        reported: &mut Option<String>,
    ) {
        let address = self.address();
        let elapsed = self.recovering_since.elapsed().as_secs_f64();
        let changed = reported.as_deref() != Some(reason);
        if attempt == 1 && !self.connected_once {
            tracing::warn!(
                target: DISPATCH,
                worker = address,
                worker_index = self.index,
                error = reason,
                "cannot reach worker {address} (worker {}): {reason}; retrying with backoff \
                 for up to {:.0} s (recovery_timeout= or JAXCLUSTER_WORKER_RECOVERY_SEC)",
                self.index,
                self.shared.config.recovery_timeout.as_secs_f64(),
            );
        } else if changed {
            tracing::info!(
                target: DISPATCH,
                worker = address,
                worker_index = self.index,
                error = reason,
                "reconnecting to worker {address} (worker {}), unreachable for {elapsed:.1} s: \
                 {reason}; next attempt in {:.1} s",
                self.index,
                pause.as_secs_f64(),
            );
        } else {
            tracing::debug!(
                target: DISPATCH,
                worker = address,
                worker_index = self.index,
                error = reason,
                "worker {address} (worker {}) still unreachable after {attempt} attempts \
                 ({elapsed:.1} s): {reason}; next attempt in {:.1} s",
                self.index,
                pause.as_secs_f64(),
            );
        }
        if changed {
            *reported = Some(reason.to_owned());
        }
    }

    /// Logs a worker answering: INFO when it had failed or kept us waiting, DEBUG for a
    /// first connection that simply worked.
    fn report_up(&self, failed_probes: u32, restarted: bool, rebuilt: usize) {
        let address = self.address();
        let elapsed = self.recovering_since.elapsed().as_secs_f64();
        if !self.connected_once && failed_probes == 0 {
            tracing::debug!(
                target: DISPATCH,
                worker = address,
                worker_index = self.index,
                "connected to worker {address} (worker {})",
                self.index,
            );
        } else if !self.connected_once {
            tracing::info!(
                target: DISPATCH,
                worker = address,
                worker_index = self.index,
                "worker {address} (worker {}) answered after {elapsed:.1} s and {failed_probes} \
                 failed attempt(s); it takes closures now",
                self.index,
            );
        } else {
            tracing::info!(
                target: DISPATCH,
                worker = address,
                worker_index = self.index,
                "worker {address} (worker {}) is back after {elapsed:.1} s ({}); rebuilt \
                 {rebuilt} per-worker resource(s); it takes closures again",
                self.index,
                if restarted {
                    "a new worker process"
                } else {
                    "the same worker process"
                },
            );
        }
    }

    fn give_up(&mut self, bound: Duration) {
        // The last failure is what the user must fix (a wrong address, a TLS mismatch, a
        // crashed worker); keep it in the reason every failed closure will carry.
        let last =
            self.status
                .last_error()
                .map_or_else(String::new, |error| match hang_up_hint(&error) {
                    Some(hint) => format!("; last error: {error}; {hint}"),
                    None => format!("; last error: {error}"),
                });
        let reason = format!(
            "gave up on worker {} after it did not answer for {bound:?} \
             (recovery_timeout= or JAXCLUSTER_WORKER_RECOVERY_SEC){last}",
            self.address(),
        );
        tracing::error!(
            target: DISPATCH,
            worker = self.address(),
            worker_index = self.index,
            "{reason}; closures run on the other workers from now on",
        );
        for resource in self.shared.resources.live() {
            resource.worker_failed(self.index, self.address(), &reason);
        }
        self.status.set(LinkState::GivenUp, Some(reason.clone()));
        self.shared
            .fail_pinned(self.index, &format!("the worker was given up: {reason}"));
        self.shared.membership_changed();
        if self.shared.all_out_of_service() {
            tracing::error!(
                target: DISPATCH,
                "every worker ({}) was given up or removed: queued and future closures fail \
                 with UnavailableError until a worker is added",
                self.shared.num_links(),
            );
        }
    }

    /// A given-up link waits until every worker is out of service (given up or removed);
    /// from then on, until a worker joins, it fails whatever reaches the queue, so nothing
    /// scheduled hangs. Returns when the dispatcher stops or this worker is removed.
    pub(super) async fn drain_when_all_given_up(&mut self) {
        /// How often a draining link looks whether a worker joined meanwhile.
        const RECHECK: Duration = Duration::from_millis(100);
        loop {
            let shared = Arc::clone(&self.shared);
            let mut membership = self.shared.membership.subscribe();
            let mut retiring = self.retiring.clone();
            let all_gone = self
                .call(async move {
                    tokio::select! {
                        _ = membership.wait_for(|_| shared.all_out_of_service()) => true,
                        _ = retiring.wait_for(|retiring| *retiring) => false,
                    }
                })
                .await;
            if all_gone != Some(true) {
                return;
            }
            while self.shared.all_out_of_service() {
                if self.status.is_retiring() {
                    return;
                }
                let Some(work) = self
                    .call(self.shared.queue.get_async(Some(self.tag()), Some(RECHECK)))
                    .await
                    .flatten()
                else {
                    if self.shared.queue.is_stopped() {
                        return;
                    }
                    continue;
                };
                self.fail_given_up(work);
            }
        }
    }

    /// Settles `work` taken while every worker is out of service.
    fn fail_given_up(&mut self, work: Work) {
        match work {
            // Given up, this worker will never run it.
            Work::Closure(closure) if closure.pinned().is_some() => {
                let reason = self.status.last_error().unwrap_or_default();
                let message = format!(
                    "closure {} for worker {} ({}) did not run: the worker was given up: {reason}",
                    closure.id(),
                    self.index,
                    self.address(),
                );
                let failure = ClosureFailure::infra(tonic::Code::Aborted, message, self.address());
                self.finish(closure, Err(failure));
            }
            // A worker joined after this link looked: the closure is for it.
            Work::Closure(closure) if !self.shared.all_out_of_service() => self.requeue(closure),
            Work::Closure(closure) => {
                // This link's reason says how long it waited and what went wrong last.
                let reason = self.status.last_error().unwrap_or_else(|| {
                    format!(
                        "no answer for {:?} (recovery_timeout= or \
                         JAXCLUSTER_WORKER_RECOVERY_SEC)",
                        self.shared.config.recovery_timeout
                    )
                });
                let message = format!(
                    "closure {} could not run: all {} workers were given up or removed; {reason}",
                    closure.id(),
                    self.shared.num_links(),
                );
                let failure =
                    ClosureFailure::infra(tonic::Code::Unavailable, message, self.address());
                self.finish(closure, Err(failure));
            }
            Work::CreateResource { resource, worker } => {
                if let Some(resource) = resource.upgrade() {
                    resource.set_state(worker, ResourceState::Aborted);
                }
            }
            Work::ReleaseResource { .. } => {}
            Work::Retire => self.leaving = true,
        }
    }

    /// Records a `GetStatus` answer; returns whether it comes from a different worker
    /// process than the previous one (the worker restarted and lost its state).
    pub(super) fn observe(&mut self, status: pb::GetStatusResponse) -> bool {
        let now = Incarnation::of(&status);
        let restarted = self.incarnation.is_some_and(|before| before != now);
        if restarted {
            self.forget_notice(&status.previous_exit);
        }
        if let Some(notice) = &status.preemption {
            self.noticed(notice);
        }
        self.explain_deaths(&status);
        self.incarnation = Some(now);
        self.heartbeats = status.protocol_revision >= 4;
        self.previous_exit.clone_from(&status.previous_exit);
        self.shared.record_status(&self.status, status);
        restarted
    }

    /// Whether a failed call means the worker is gone (put the work back, recover) rather
    /// than a definite refusal of this request.
    pub(super) async fn is_worker_failure(&mut self, error: &RpcError) -> bool {
        match error {
            RpcError::Unavailable(_) | RpcError::DeadlineExceeded(_) => true,
            // A connection cut mid-call surfaces as one of these; ask the worker.
            RpcError::Internal(_) | RpcError::Cancelled(_) | RpcError::Aborted(_) => {
                self.worker_lost().await
            }
            _ => false,
        }
    }

    /// Asks the worker whether it is still the process we knew: `true` if it does not
    /// answer, is shutting down, or restarted.
    pub(super) async fn worker_lost(&mut self) -> bool {
        let probe = self
            .transport
            .get_status(Some(self.shared.config.probe_timeout));
        match self.call(probe).await {
            None => true,
            Some(Ok(status)) if shutting_down(&status) => {
                if let Some(notice) = &status.preemption {
                    self.noticed(notice);
                }
                true
            }
            Some(Ok(status)) => self.observe(status),
            Some(Err(error)) => !reachable(&error),
        }
    }
}

/// Whether a `GetStatus` answer says the worker is going away: draining for shutdown, or
/// preempted (which drains too).
fn shutting_down(status: &pb::GetStatusResponse) -> bool {
    status.state == pb::ServingState::Draining as i32
        || status.state == pb::ServingState::Preempting as i32
}

/// A port that accepts connections and then hangs up on every probe for the whole
/// recovery bound is not a crashed worker (that refuses connections): it is most often a
/// TLS/plaintext mismatch, whose raw error ("broken pipe", "connection reset", "connection
/// closed") depends on which side noticed first and names neither TLS nor the fix.
pub(crate) fn hang_up_hint(error: &str) -> Option<&'static str> {
    let hung_up = [
        "broken pipe",
        "connection reset",
        "reset by peer",
        "connection closed",
    ]
    .iter()
    .any(|sign| error.contains(sign));
    (hung_up && !error.contains("may be serving")).then_some(
        "the worker's port accepted connections but closed them: check that both sides \
         agree on TLS (tls_ca= or JAXCLUSTER_TLS_CA here, --tls-cert/--tls-key on the \
         worker) and that the address is a jaxcluster worker",
    )
}

/// Whether an RPC error is a definite answer from a live worker (so it is reachable).
fn reachable(error: &RpcError) -> bool {
    matches!(
        error,
        RpcError::Unauthenticated(_)
            | RpcError::InvalidArgument(_)
            | RpcError::NotFound(_)
            | RpcError::FailedPrecondition(_)
            | RpcError::ResourceExhausted(_)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let mut backoff = Backoff::new(BackoffConfig {
            initial: Duration::from_millis(50),
            max: Duration::from_millis(300),
        });
        let delays: Vec<u128> = (0..6).map(|_| backoff.next_delay().as_millis()).collect();
        assert_eq!(delays, [50, 100, 200, 300, 300, 300]);
    }

    #[test]
    fn the_default_backoff_is_capped_at_ten_seconds() {
        let mut backoff = Backoff::new(BackoffConfig::default());
        let last = (0..40).map(|_| backoff.next_delay()).last().unwrap();
        assert_eq!(last, Duration::from_secs(10));
    }

    #[test]
    fn only_a_port_that_hangs_up_gets_the_tls_hint() {
        let reset = "GetStatus on worker w: transport error (connection reset by peer)";
        assert!(hang_up_hint(reset).unwrap().contains("tls_ca="));
        assert!(hang_up_hint("GetStatus: transport error (broken pipe)").is_some());
        assert!(hang_up_hint("canceled (transport error: connection closed)").is_some());
        // A crashed worker refuses connections: no TLS advice there.
        assert!(hang_up_hint("tcp connect error: Connection refused (os error 111)").is_none());
        // Already explained by the status hint: not said twice.
        assert!(hang_up_hint("broken pipe; the peer may be serving TLS: ...").is_none());
    }
}
