//! [`Balance`]: what links tell each other so that pipelining stays work-conserving. One
//! owner for the counters and flags of that handshake, next to the argument that their
//! memory orderings make it sound.
//!
//! # Pipelining, and why it stays work-conserving
//!
//! An idle link (nothing outstanding) blocks on the queue and sends the closure it gets.
//! A busy link may send more — up to `1 + pipeline_depth` outstanding and while their
//! arguments hold less than `pipeline_bytes`, several per message — only while **no link
//! is idle**: it takes closures without waiting
//! (`try_get`), and only between two answers of its worker. Two rules keep a closure from
//! waiting behind another on a busy worker while some worker is idle:
//!
//! - *Re-check after taking.* A busy link counts a closure as outstanding
//!   ([`LinkSlot::publish`]), then reads the idle count again ([`Balance::may_pipeline`]);
//!   if a link went idle meanwhile, the closure goes back to the queue for it.
//! - *Reclaim when starving.* A link that goes idle ([`Balance::while_idle`]) and finds
//!   the queue empty asks the link with the most outstanding (two or more), among those
//!   not asked already, to reclaim ([`Balance::ask_a_pipelining_link_to_reclaim`]): that
//!   link sends `return_queued`, and the worker hands back, unstarted, what it had queued
//!   (the idle link then takes it from the queue). Each idle link asks its own link, so
//!   idle links that come together are fed by as many reclaims.
//!
//! A closure handed back did not run: it is re-queued without counting as a retry.
//!
//! # Why every access is `SeqCst`
//!
//! The two rules are a Dekker-style handshake: the idle link *writes* the idle count, then
//! *reads* the outstanding counts; the busy link *writes* its outstanding count, then
//! *reads* the idle count. Work conservation needs one of the two to see the other's
//! write. Sequential consistency gives exactly that: all four accesses fall in one total
//! order, so whichever write comes second in it is followed by a read that sees the first.
//! Acquire/release would not do: each side's read may then be satisfied before its own
//! write is visible to the other (store buffering), and both could miss.
//!
//! The failure flag (`cancel_all`) is read alongside the counts and is `SeqCst` with them.
//! A link that settles a failure sets it *before* asking every link to reclaim; a link
//! checks it after taking a closure (and, when pipelining, after publishing it), so a
//! closure taken once the failure is known is either handed back by its taker or taken
//! back from its worker by the reclaim request that follows. A reclaim request is a
//! [`Notify`] permit, so one sent while its link is between two waits is not lost.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use tokio::sync::futures::Notified;
use tokio::sync::Notify;

/// The handshake state shared by every link of one dispatcher.
///
/// Links come and go (`add_workers`, `remove_workers`): each link holds its own
/// [`LinkSlot`] for the per-closure writes, and the list here is read only by an idle link
/// asking the others to reclaim, so its lock is off the hot path. A link added while an
/// idle link walks the list has nothing outstanding, so missing it loses no reclaim.
pub(crate) struct Balance {
    /// Links that are up with nothing outstanding, waiting for work: while any is, no busy
    /// link pipelines.
    idle: AtomicUsize,
    /// One per link, in the order added.
    links: RwLock<Vec<Arc<LinkSlot>>>,
    /// A closure failed under `cancel_all` and the error was not raised yet: links start
    /// no closure meanwhile (each one they take is handed back, hence cancelled), so every
    /// closure queued when a closure failed ends cancelled, never run.
    failure_pending: AtomicBool,
}

/// One link's part of the handshake, aligned to its own cache lines: each link writes its
/// count once per closure sent or answered, and counts of neighbouring links sharing a
/// line would make those writes contend (128 bytes: x86-64 prefetches lines in pairs).
#[repr(align(128))]
pub(crate) struct LinkSlot {
    /// Closures sent to the link's worker and not answered yet.
    outstanding: AtomicUsize,
    /// Asks the link to take back what its worker has queued (an idle link is starving,
    /// or a closure failed under `cancel_all`).
    reclaim: Notify,
    /// An idle link asked this one to reclaim and it has not acted yet: other idle links
    /// ask another.
    asked: AtomicBool,
}

impl LinkSlot {
    /// Publishes how many closures the link has outstanding (read by idle links).
    pub fn publish(&self, count: usize) {
        self.outstanding.store(count, Ordering::SeqCst);
    }

    /// Resolves when the link is asked to reclaim (at once if asked since its last wait).
    pub fn reclaim_requested(&self) -> Notified<'_> {
        self.reclaim.notified()
    }

    /// The link acts on a reclaim request: it may be asked again from now on.
    pub fn reclaim_taken(&self) {
        self.asked.store(false, Ordering::SeqCst);
    }
}

impl Balance {
    /// The state for no links yet: none idle, no failure pending.
    pub fn new() -> Self {
        Self {
            idle: AtomicUsize::new(0),
            links: RwLock::new(Vec::new()),
            failure_pending: AtomicBool::new(false),
        }
    }

    /// A slot for a new link, nothing outstanding.
    pub fn add_link(&self) -> Arc<LinkSlot> {
        let slot = Arc::new(LinkSlot {
            outstanding: AtomicUsize::new(0),
            reclaim: Notify::new(),
            asked: AtomicBool::new(false),
        });
        self.slots_mut().push(Arc::clone(&slot));
        slot
    }

    /// Forgets a link that left (its slot stays valid for the link itself).
    pub fn remove_link(&self, slot: &Arc<LinkSlot>) {
        self.slots_mut().retain(|other| !Arc::ptr_eq(other, slot));
    }

    fn slots(&self) -> std::sync::RwLockReadGuard<'_, Vec<Arc<LinkSlot>>> {
        self.links.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn slots_mut(&self) -> std::sync::RwLockWriteGuard<'_, Vec<Arc<LinkSlot>>> {
        self.links.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Awaits `take` (an idle link taking work from the queue) counted as an idle link, so
    /// no busy link pipelines meanwhile; uncounted however it ends (the future may be
    /// dropped when the dispatcher stops).
    pub async fn while_idle<R>(&self, take: impl std::future::Future<Output = R>) -> R {
        /// Uncounts the idle link on drop.
        struct Idle<'a>(&'a AtomicUsize);
        impl Drop for Idle<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        self.idle.fetch_add(1, Ordering::SeqCst);
        let _idle = Idle(&self.idle);
        take.await
    }

    /// Whether some link is idle, waiting for work.
    pub fn any_idle(&self) -> bool {
        self.idle.load(Ordering::SeqCst) > 0
    }

    /// Whether a busy link may send another closure now: no link is idle and no failure
    /// is pending. Read after [`LinkSlot::publish`]ing the closure taken.
    pub fn may_pipeline(&self) -> bool {
        !self.failure_pending() && !self.any_idle()
    }

    /// Asks the link with the most closures queued on its worker (two or more
    /// outstanding), among those not asked already, to take back what its worker has
    /// queued. Called by a link that went idle and found the queue empty: it needs one
    /// closure, and one reclaim returns every closure that worker had queued, so asking
    /// one link per idle link keeps each idle link fed without a storm of reclaims (with
    /// a thousand links, asking all of them returned a fifth of all closures).
    pub fn ask_a_pipelining_link_to_reclaim(&self) {
        let slots = self.slots();
        let busiest = slots
            .iter()
            .filter(|slot| !slot.asked.load(Ordering::SeqCst))
            .map(|slot| (slot.outstanding.load(Ordering::SeqCst), slot))
            .filter(|(outstanding, _)| *outstanding >= 2)
            .max_by_key(|(outstanding, _)| *outstanding);
        if let Some((_, slot)) = busiest {
            if !slot.asked.swap(true, Ordering::SeqCst) {
                slot.reclaim.notify_one();
            }
        }
    }

    /// Asks every link to take back what its worker has queued (a closure failed).
    pub fn ask_all_to_reclaim(&self) {
        for slot in self.slots().iter() {
            slot.reclaim.notify_one();
        }
    }

    /// Whether a closure failure (under `cancel_all`) waits to be raised.
    pub fn failure_pending(&self) -> bool {
        self.failure_pending.load(Ordering::SeqCst)
    }

    /// A closure failed under `cancel_all`: no link starts a closure until it is raised.
    /// Set before the queue hears of the failure and before links are asked to reclaim.
    pub fn set_failure_pending(&self) {
        self.failure_pending.store(true, Ordering::SeqCst);
    }

    /// The failure was raised to the caller: links may start closures again.
    pub fn clear_failure_pending(&self) {
        self.failure_pending.store(false, Ordering::SeqCst);
    }
}
