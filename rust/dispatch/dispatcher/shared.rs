//! [`Shared`]: the state the links and the [`Dispatcher`](super::Dispatcher) share, and
//! the views of it that both read (links by index, who is in service, reachability).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Instant;

use tokio::sync::watch;

use crate::dispatch::closure::{CancelContext, Work};
use crate::dispatch::config::DispatcherConfig;
use crate::dispatch::failure::ClosureFailure;
use crate::dispatch::functions::FunctionRegistry;
use crate::dispatch::link::balance::Balance;
use crate::dispatch::metrics::{Counters, Histogram};
use crate::dispatch::ps_failures::PsFailures;
use crate::dispatch::resources::ResourceRegistry;
use crate::dispatch::result_cell::Outcome;
use crate::dispatch::status::{LinkState, LinkStatus};
use crate::queue::{ClosureQueue, Tag};

/// Everything the links and the [`Dispatcher`] share.
pub(crate) struct Shared {
    pub queue: ClosureQueue<Work, Arc<ClosureFailure>>,
    pub config: DispatcherConfig,
    pub functions: FunctionRegistry,
    pub resources: ResourceRegistry,
    pub counters: Counters,
    pub latency: Histogram,
    pub cancel: Arc<CancelContext>,
    /// One per worker, by index; only ever appended to (a removed worker keeps its index,
    /// `removed`). Each link holds its own `Arc`, so the lock is off the per-closure path.
    pub links: RwLock<Vec<Arc<LinkStatus>>>,
    /// `true` once shutdown began; every in-flight RPC and sleep of the links ends.
    pub stop: watch::Sender<bool>,
    /// Bumped whenever the set of workers in service changes (one gave up, left or
    /// joined), so given-up links re-check whether every worker is out of service.
    pub membership: watch::Sender<u64>,
    /// What links tell each other so that pipelining stays work-conserving: idle links,
    /// closures outstanding per link, reclaim requests, a pending `cancel_all` failure.
    pub balance: Balance,
    /// Parameter-server failures reported by closures, counted per ps task.
    pub ps_failures: PsFailures,
    /// When the dispatcher started (for `connect_timeout`).
    pub started: Instant,
    /// Whether any worker has ever answered.
    pub reached: AtomicBool,
    /// Bumped whenever a worker's `GetStatus` answer is recorded, so a caller can wait for
    /// the first report (its platform) instead of polling.
    pub reports: watch::Sender<u64>,
}

impl Shared {
    /// Every link's status, by index.
    pub fn link_statuses(&self) -> Vec<Arc<LinkStatus>> {
        self.links
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Link `index`'s status.
    pub fn link(&self, index: usize) -> Option<Arc<LinkStatus>> {
        self.links
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(index)
            .cloned()
    }

    /// How many links there are (removed ones included: indices are never reused).
    pub fn num_links(&self) -> usize {
        self.links
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether no worker can take closures any more: every one was given up or removed.
    pub fn all_out_of_service(&self) -> bool {
        self.link_statuses()
            .iter()
            .all(|link| link.state().is_out_of_service())
    }

    /// Records worker `link`'s `GetStatus` answer and wakes whoever waits for a report.
    pub fn record_status(&self, link: &LinkStatus, status: crate::rpc::pb::GetStatusResponse) {
        link.record_status(status);
        self.reports.send_modify(|count| *count += 1);
    }

    /// Whether a worker not removed has reported its status.
    pub fn any_reported(&self) -> bool {
        self.link_statuses()
            .iter()
            .any(|link| link.state() != LinkState::Removed && link.status_age().is_some())
    }

    /// Tells given-up links that the set of workers in service changed.
    pub fn membership_changed(&self) {
        self.membership.send_modify(|generation| *generation += 1);
    }

    /// Whether no worker was reached within `connect_timeout` (cheap: no message built).
    pub fn is_unreachable(&self) -> bool {
        self.config.connect_timeout.is_some_and(|limit| {
            !self.reached.load(Ordering::Acquire) && self.started.elapsed() >= limit
        })
    }

    /// The error of a cluster none of whose workers was reached within `connect_timeout`,
    /// naming every worker and its last error; `None` while that is not the case.
    pub fn unreachable(&self) -> Option<String> {
        let limit = self.config.connect_timeout?;
        if !self.is_unreachable() {
            return None;
        }
        let workers: Vec<String> = self
            .link_statuses()
            .iter()
            .map(|link| {
                let snapshot = link.snapshot();
                let error = snapshot
                    .last_error
                    .unwrap_or_else(|| "no answer yet".to_owned());
                let hint = crate::dispatch::link::hang_up_hint(&error)
                    .map_or_else(String::new, |hint| format!(" ({hint})"));
                format!(
                    "worker {} at {}: {error}{hint}",
                    snapshot.index, snapshot.address
                )
            })
            .collect();
        Some(format!(
            "no worker of the cluster could be reached in the {:.0} s since the coordinator \
             started (connect_timeout; pass connect_timeout=None to wait as long as TF \
             does): {}",
            limit.as_secs_f64(),
            workers.join("; ")
        ))
    }

    /// Fails every `schedule_on` closure queued for `worker` with `why` (an `ABORTED`
    /// infrastructure error: the worker was removed or given up, so it will never run
    /// them); the worker's other tagged work stays queued, in order. Whoever drains first
    /// (the link leaving or giving up, or a `schedule_on` that finds it gone after
    /// queueing) fails them: each closure is taken once.
    pub fn fail_pinned(&self, worker: usize, why: &str) {
        let address = self.link(worker).map(|link| link.address().to_owned());
        let address = address.as_deref().unwrap_or("?");
        for work in self.queue.take_tagged(worker as Tag) {
            match work {
                Work::Closure(closure) if closure.pinned().is_some() => {
                    let message = format!(
                        "closure {} for worker {worker} ({address}) did not run: {why}",
                        closure.id()
                    );
                    let failure = ClosureFailure::infra(tonic::Code::Aborted, message, address);
                    closure.settle(Outcome::Failed(Arc::new(failure)));
                }
                other => {
                    if let Err(refused) = self.queue.try_put(other, Some(worker as Tag)) {
                        crate::queue::Cancel::cancel(refused.into_inner());
                    }
                }
            }
        }
    }

    /// Asks each worker in `holders` to drop resource `id` (as tagged work, so it is sent
    /// after anything queued for that worker before it).
    pub fn send_releases(&self, id: u64, holders: &[usize]) {
        for &worker in holders {
            if self
                .link(worker)
                .map_or(true, |link| link.state().is_out_of_service())
            {
                continue;
            }
            let release = Work::ReleaseResource { resource_id: id };
            // Refused only once stopped, when the workers are no longer ours to tidy.
            let _ = self.queue.try_put(release, Some(worker as Tag));
        }
    }
}
