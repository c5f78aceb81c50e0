//! `put_back`, the bound, wait and its gate, stop, tagged sub-queues, interruption, and
//! cancellation running without the lock.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use super::{await_state, spawn, within, Ledger, Queue, PROMPTLY};
use crate::queue::{Cancel, ClosureQueue, QueueError, TryGetError, TryPutError, WaitPolicy};

#[test]
fn put_back_requeues_at_the_tail() {
    let ledger = Ledger::new(3);
    let queue = Queue::new(8);
    for id in 0..3 {
        queue.put(ledger.item(id), None).unwrap();
    }
    let first = queue.try_get(None).unwrap();
    queue.put_back(first).unwrap();
    assert_eq!(queue.inflight(), 0);
    let order: Vec<_> = (0..3).map(|_| queue.try_get(None).unwrap().id).collect();
    assert_eq!(order, vec![1, 2, 0]);
}

#[test]
fn a_full_queue_blocks_put_until_a_get_frees_a_slot() {
    let ledger = Ledger::new(3);
    let queue = Arc::new(Queue::new(2));
    queue.put(ledger.item(0), None).unwrap();
    queue.put(ledger.item(1), None).unwrap();
    let producer = {
        let (queue, item) = (Arc::clone(&queue), ledger.item(2));
        spawn(move || queue.put(item, None))
    };
    await_state(&queue, "put blocked on full", |s| {
        s.sleepers.putters_full == 1
    });
    assert!(producer.try_join().is_none());
    assert_eq!(queue.try_get(None).unwrap().id, 0);
    producer.join("blocked put").unwrap();
    assert_eq!(queue.len(), 2);
}

#[test]
fn wait_is_true_when_idle_false_on_timeout_and_true_once_the_last_closure_finishes() {
    let ledger = Ledger::new(1);
    let queue = Arc::new(Queue::new(2));
    assert!(queue.wait(None).unwrap());
    queue.put(ledger.item(0), None).unwrap();
    assert!(
        !queue.wait(Some(Duration::from_millis(10))).unwrap(),
        "queued"
    );
    let item = queue.try_get(None).unwrap();
    assert!(
        !queue.wait(Some(Duration::from_millis(10))).unwrap(),
        "inflight"
    );
    let waiter = {
        let queue = Arc::clone(&queue);
        spawn(move || queue.wait(Some(PROMPTLY)))
    };
    await_state(&queue, "wait asleep", |s| s.sleepers.idle == 1);
    item.finish();
    queue.mark_finished().unwrap();
    assert!(waiter.join("wait").unwrap());
    ledger.assert_each_settled_once();
}

#[test]
fn no_put_starts_while_a_wait_is_in_progress() {
    let ledger = Ledger::new(3);
    let queue = Arc::new(Queue::new(8));
    queue.put(ledger.item(0), None).unwrap();
    let item = queue.try_get(None).unwrap();
    let waiter = {
        let queue = Arc::clone(&queue);
        spawn(move || queue.wait(Some(PROMPTLY)))
    };
    await_state(&queue, "wait in progress", |s| s.waits == 1);
    assert!(matches!(
        queue.try_put(ledger.item(1), None),
        Err(TryPutError::Busy(_))
    ));
    let gated = {
        let (queue, item) = (Arc::clone(&queue), ledger.item(2));
        spawn(move || queue.put(item, None))
    };
    await_state(&queue, "put held at the gate", |s| {
        s.sleepers.putters_gate == 1
    });
    assert_eq!(queue.len(), 0);
    item.finish();
    queue.mark_finished().unwrap();
    assert!(
        waiter.join("wait").unwrap(),
        "the gated put was not waited for"
    );
    gated.join("gated put").unwrap();
    assert_eq!(queue.len(), 1, "the gated put ran once the wait ended");
}

#[test]
fn wait_counts_a_put_already_blocked_on_a_full_queue() {
    let ledger = Ledger::new(3);
    let queue = Arc::new(Queue::new(1));
    queue.put(ledger.item(0), None).unwrap();
    let first = queue.try_get(None).unwrap();
    queue.put(ledger.item(1), None).unwrap();
    let producer = {
        let (queue, item) = (Arc::clone(&queue), ledger.item(2));
        spawn(move || queue.put(item, None))
    };
    await_state(&queue, "put blocked on full", |s| s.blocked_putters == 1);
    let finished = Arc::new(AtomicUsize::new(0));
    let waiter = {
        let (queue, finished) = (Arc::clone(&queue), Arc::clone(&finished));
        spawn(move || (queue.wait(Some(PROMPTLY)), finished.load(Ordering::SeqCst)))
    };
    await_state(&queue, "wait in progress", |s| s.waits == 1);
    for item in [first, queue.try_get(None).unwrap()] {
        finished.fetch_add(1, Ordering::SeqCst);
        item.finish();
        queue.mark_finished().unwrap();
    }
    producer.join("blocked put").unwrap();
    let last = queue.get(None, Some(PROMPTLY)).unwrap();
    finished.fetch_add(1, Ordering::SeqCst);
    last.finish();
    queue.mark_finished().unwrap();
    let (result, finished_before_wait_returned) = waiter.join("wait");
    assert!(result.unwrap());
    assert_eq!(finished_before_wait_returned, 3);
    ledger.assert_each_settled_once();
}

#[test]
fn stop_wakes_every_blocked_getter_with_none() {
    let queue = Arc::new(Queue::new(2));
    let getters: Vec<_> = [None, Some(7)]
        .into_iter()
        .map(|tag| {
            let queue = Arc::clone(&queue);
            spawn(move || queue.get(tag, None).map(|item| item.id))
        })
        .collect();
    await_state(&queue, "two getters asleep", |s| s.sleepers.getters == 2);
    queue.stop();
    for getter in getters {
        assert_eq!(getter.join("getter woken by stop"), None);
    }
    assert!(queue.is_stopped());
}

#[test]
fn stop_wakes_blocked_putters_and_cancels_everything_queued() {
    let ledger = Ledger::new(4);
    let queue = Arc::new(Queue::new(2));
    queue.put(ledger.item(0), Some(3)).unwrap();
    queue.put(ledger.item(1), None).unwrap();
    queue.put(ledger.item(2), None).unwrap();
    let putter = {
        let (queue, item) = (Arc::clone(&queue), ledger.item(3));
        spawn(move || queue.put(item, None))
    };
    await_state(&queue, "put blocked on full", |s| {
        s.sleepers.putters_full == 1
    });
    queue.stop();
    assert!(matches!(
        putter.join("putter woken by stop"),
        Err(QueueError::Stopped)
    ));
    assert_eq!(ledger.cancelled_ids(), vec![0, 1, 2, 3]);
    assert_eq!((queue.len(), queue.tagged_len(3)), (0, 0));
    assert_eq!(queue.try_get(None).unwrap_err(), TryGetError::Stopped);
    ledger.assert_each_settled_once();
}

#[test]
fn after_stop_puts_cancel_put_backs_cancel_and_settling_still_works() {
    let ledger = Ledger::new(4);
    let queue = Queue::new(4);
    queue.put(ledger.item(0), None).unwrap();
    queue.put(ledger.item(1), None).unwrap();
    let (a, b) = (queue.try_get(None).unwrap(), queue.try_get(None).unwrap());
    queue.stop();
    assert!(queue.get(None, Some(Duration::ZERO)).is_none());
    assert!(matches!(
        queue.put(ledger.item(2), None),
        Err(QueueError::Stopped)
    ));
    assert!(matches!(
        queue.put(ledger.item(3), Some(1)),
        Err(QueueError::Stopped)
    ));
    queue.put_back(a).unwrap();
    b.finish();
    queue.mark_finished().unwrap();
    assert_eq!(queue.inflight(), 0);
    assert!(queue.wait(Some(Duration::ZERO)).unwrap());
    assert_eq!(ledger.cancelled_ids(), vec![0, 2, 3]);
    ledger.assert_each_settled_once();
}

#[test]
fn tagged_closures_go_to_their_worker_first_and_are_never_inflight_or_waited_for() {
    let ledger = Ledger::new(4);
    let queue = Arc::new(Queue::new(1));
    queue.put(ledger.item(0), None).unwrap();
    // Tagged puts ignore the bound and the wait gate.
    queue.put(ledger.item(1), Some(5)).unwrap();
    queue.put(ledger.item(2), Some(5)).unwrap();
    assert_eq!((queue.len(), queue.tagged_len(5)), (1, 2));
    assert!(queue.tagged_any(5, |item| item.id == 2));
    assert!(!queue.tagged_any(5, |item| item.id == 99));
    assert!(!queue.tagged_any(6, |_| true));
    assert_eq!(
        queue.try_get(Some(6)).unwrap().id,
        0,
        "other tags take global closures"
    );
    assert_eq!(queue.inflight(), 1);
    assert_eq!(
        queue.try_get(None).unwrap_err(),
        TryGetError::Empty,
        "untagged never sees tags"
    );
    let worker5: Vec<_> = (0..2).map(|_| queue.try_get(Some(5)).unwrap().id).collect();
    assert_eq!(worker5, vec![1, 2]);
    assert_eq!(queue.inflight(), 1, "tagged closures are not inflight");
    queue.mark_finished().unwrap();
    queue.put(ledger.item(3), Some(5)).unwrap();
    assert!(
        queue.wait(Some(Duration::ZERO)).unwrap(),
        "tagged closures are not waited for"
    );
    assert!(queue.done().unwrap());
}

#[test]
fn a_blocked_tagged_getter_wakes_for_its_tag() {
    let ledger = Ledger::new(1);
    let queue = Arc::new(Queue::new(4));
    let getter = {
        let queue = Arc::clone(&queue);
        spawn(move || queue.get(Some(2), Some(PROMPTLY)).map(|item| item.id))
    };
    await_state(&queue, "tagged getter asleep", |s| s.sleepers.getters == 1);
    queue.put(ledger.item(0), Some(2)).unwrap();
    assert_eq!(getter.join("tagged get"), Some(0));
    assert_eq!(queue.inflight(), 0);
}

#[test]
fn interrupt_checks_run_without_the_lock_and_cut_waits_short() {
    let ledger = Ledger::new(2);
    let queue = Arc::new(Queue::new(1));
    let checks = AtomicUsize::new(0);
    let mut check = || {
        // Would deadlock if the queue's lock were held here.
        let _ = queue.len();
        checks.fetch_add(1, Ordering::SeqCst) >= 2
    };
    let mut policy =
        WaitPolicy::timeout(Some(PROMPTLY)).interruptible(Duration::from_millis(1), &mut check);
    assert!(matches!(
        queue.get_with(None, &mut policy),
        Err(QueueError::Interrupted)
    ));
    assert_eq!(checks.load(Ordering::SeqCst), 3);

    queue.put(ledger.item(0), None).unwrap();
    let mut stop_now = || true;
    let mut policy = WaitPolicy::forever().interruptible(Duration::from_millis(1), &mut stop_now);
    let err = queue
        .put_with(ledger.item(1), None, &mut policy)
        .unwrap_err();
    assert!(matches!(err, QueueError::Interrupted));
    assert_eq!(
        ledger.cancelled_ids(),
        vec![1],
        "a put cut short cancels its closure"
    );
    let mut policy = WaitPolicy::timeout(Some(Duration::from_millis(5)));
    assert!(matches!(
        queue.put_with(ledger.item(1), None, &mut policy),
        Err(QueueError::TimedOut)
    ));
}

/// A closure whose cancellation calls back into its queue, as a Python closure's
/// `mark_cancelled()` may; it deadlocks if cancelled with the lock held.
struct Reentrant {
    queue: Weak<ClosureQueue<Reentrant, String>>,
    seen: Arc<Mutex<Vec<usize>>>,
}

impl Cancel for Reentrant {
    fn cancel(self) {
        if let Some(queue) = self.queue.upgrade() {
            let state = (queue.len(), queue.inflight());
            self.seen.lock().unwrap().push(state.0 + state.1);
        }
    }
}

#[test]
fn cancellation_runs_with_the_lock_released() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen_in_thread = Arc::clone(&seen);
    within("cancellations calling back into the queue", move || {
        let queue = Arc::new(ClosureQueue::<Reentrant, String>::new(4));
        let item = || Reentrant {
            queue: Arc::downgrade(&queue),
            seen: Arc::clone(&seen_in_thread),
        };
        // Raising a pending error cancels the queued closure and the one just put.
        queue.put(item(), None).unwrap();
        queue.put(item(), None).unwrap();
        let _failed = queue.try_get(None).unwrap();
        queue.mark_failed("boom".to_owned()).unwrap();
        assert!(matches!(
            queue.put(item(), None),
            Err(QueueError::Failed(_))
        ));
        // put_back with an error pending cancels.
        queue.put(item(), None).unwrap();
        queue.put(item(), None).unwrap();
        let _failed = queue.try_get(None).unwrap();
        let unlucky = queue.try_get(None).unwrap();
        queue.mark_failed("again".to_owned()).unwrap();
        queue.put_back(unlucky).unwrap();
        // stop cancels what is queued, tagged or not.
        queue.put(item(), Some(1)).unwrap();
        queue.stop();
        // A put after stop cancels its closure.
        assert!(matches!(queue.put(item(), None), Err(QueueError::Stopped)));
    });
    assert_eq!(seen.lock().unwrap().len(), 5);
}
