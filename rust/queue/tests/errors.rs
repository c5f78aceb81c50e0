//! The pending error: first error wins; raising cancels everything queued, waits for the
//! inflight closures, clears the error; misuse is reported without changing anything.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::{await_state, spawn, Item, Ledger, Queue, PROMPTLY};
use crate::queue::{QueueError, TryPutError, WaitPolicy};

/// Puts closures 0 and 1, takes both, and fails 0 with "boom": the error is pending while 1
/// (returned) is still inflight, the starting point of most tests here.
fn fail_first_of_two_inflight(ledger: &Arc<Ledger>, queue: &Queue) -> Item {
    queue.put(ledger.item(0), None).unwrap();
    queue.put(ledger.item(1), None).unwrap();
    let (failing, inflight) = (queue.try_get(None).unwrap(), queue.try_get(None).unwrap());
    failing.fail();
    queue.mark_failed("boom".to_owned()).unwrap();
    inflight
}

fn failed_with(result: Result<impl std::fmt::Debug, QueueError<String>>) -> String {
    match result {
        Err(QueueError::Failed(error)) => (*error).clone(),
        other => panic!("expected the pending error, got {other:?}"),
    }
}

#[test]
fn misuse_without_inflight_is_reported_and_changes_nothing() {
    let ledger = Ledger::new(2);
    let queue = Queue::new(4);
    queue.put(ledger.item(0), None).unwrap();
    for (operation, result) in [
        ("mark_finished", queue.mark_finished()),
        ("mark_failed", queue.mark_failed("x".to_owned())),
        ("put_back", queue.put_back(ledger.item(1))),
    ] {
        match result {
            Err(QueueError::NotInflight { operation: op }) => assert_eq!(op, operation),
            other => panic!("{operation}: expected NotInflight, got {other:?}"),
        }
    }
    assert_eq!((queue.len(), queue.inflight()), (1, 0));
    assert!(
        !queue.done().unwrap(),
        "no error may have been recorded by the misuse"
    );
    let message = queue.mark_finished().unwrap_err().to_string();
    assert!(
        message.contains("mark_finished()") && message.contains("inflight=0"),
        "{message}"
    );
}

#[test]
fn first_error_wins_and_wait_raises_it_then_clears_it() {
    let ledger = Ledger::new(2);
    let queue = Queue::new(4);
    queue.put(ledger.item(0), None).unwrap();
    queue.put(ledger.item(1), None).unwrap();
    let (a, b) = (queue.try_get(None).unwrap(), queue.try_get(None).unwrap());
    a.fail();
    queue.mark_failed("first".to_owned()).unwrap();
    b.fail();
    queue.mark_failed("second".to_owned()).unwrap();
    assert_eq!(failed_with(queue.wait(Some(PROMPTLY))), "first");
    assert!(
        queue.wait(Some(Duration::ZERO)).unwrap(),
        "the error was cleared"
    );
    assert!(queue.done().unwrap());
    ledger.assert_each_settled_once();
}

#[test]
fn put_queues_then_raises_so_the_new_closure_is_cancelled_with_the_rest() {
    let ledger = Ledger::new(5);
    let queue = Queue::new(8);
    queue.put(ledger.item(0), None).unwrap();
    queue.put(ledger.item(1), None).unwrap();
    queue.try_get(None).unwrap().fail();
    queue.mark_failed("boom".to_owned()).unwrap();
    assert!(matches!(
        queue.try_put(ledger.item(3), None),
        Err(TryPutError::Busy(ref item)) if item.id == 3
    ));
    ledger.cancelled[3].fetch_add(1, Ordering::SeqCst); // the refused copy stands for a cancel
    assert_eq!(failed_with(queue.put(ledger.item(2), None)), "boom");
    assert_eq!(ledger.cancelled_ids(), vec![1, 2, 3]);
    assert_eq!((queue.len(), queue.inflight()), (0, 0));
    // Reusable: the next put is queued normally.
    queue
        .put(ledger.item(4), None)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(queue.len(), 1);
}

#[test]
fn raising_waits_for_inflight_closures_before_returning() {
    let ledger = Ledger::new(3);
    let queue = Arc::new(Queue::new(8));
    for id in 0..3 {
        queue.put(ledger.item(id), None).unwrap();
    }
    let failing = queue.try_get(None).unwrap();
    let slow = queue.try_get(None).unwrap();
    failing.fail();
    queue.mark_failed("boom".to_owned()).unwrap();
    let slow_finished = Arc::new(AtomicBool::new(false));
    let done = {
        let (queue, slow_finished) = (Arc::clone(&queue), Arc::clone(&slow_finished));
        spawn(move || {
            let result = queue.done();
            (result, slow_finished.load(Ordering::SeqCst))
        })
    };
    // done() has cancelled the queued item and now sleeps until the inflight one settles.
    await_state(&queue, "done() waiting for inflight", |s| {
        s.sleepers.idle == 1
    });
    assert_eq!(ledger.cancelled_ids(), vec![2]);
    slow_finished.store(true, Ordering::SeqCst);
    slow.finish();
    queue.mark_finished().unwrap();
    let (result, finished_first) = done.join("done()");
    assert_eq!(failed_with(result), "boom");
    assert!(
        finished_first,
        "done() raised before the inflight closure settled"
    );
    ledger.assert_each_settled_once();
}

#[test]
fn put_back_while_an_error_is_pending_cancels_the_closure() {
    let ledger = Ledger::new(2);
    let queue = Queue::new(8);
    let b = fail_first_of_two_inflight(&ledger, &queue);
    queue.put_back(b).unwrap();
    assert_eq!(ledger.cancelled_ids(), vec![1]);
    assert_eq!((queue.len(), queue.inflight()), (0, 0));
    ledger.assert_each_settled_once();
}

#[test]
fn concurrent_raisers_all_get_the_same_error_and_it_is_cleared_once() {
    let ledger = Ledger::new(3);
    let queue = Arc::new(Queue::new(8));
    let slow = fail_first_of_two_inflight(&ledger, &queue);
    let raisers: Vec<_> = (0..3)
        .map(|i| {
            let queue = Arc::clone(&queue);
            let item = (i == 0).then(|| ledger.item(2));
            spawn(move || match item {
                Some(item) => queue.put(item, None).map(|()| false),
                None => queue.done(),
            })
        })
        .collect();
    await_state(&queue, "three raisers waiting", |s| s.sleepers.idle == 3);
    slow.finish();
    queue.mark_finished().unwrap();
    let errors: Vec<_> = raisers
        .into_iter()
        .map(|r| match r.join("raiser") {
            Err(QueueError::Failed(error)) => error,
            other => panic!("expected the pending error, got {other:?}"),
        })
        .collect();
    assert!(errors
        .iter()
        .all(|e| Arc::ptr_eq(e, &errors[0]) && **e == "boom"));
    assert!(queue.done().unwrap(), "cleared exactly once; nothing left");
    ledger.assert_each_settled_once();
}

#[test]
fn an_error_releases_a_put_blocked_on_a_full_queue() {
    let ledger = Ledger::new(3);
    let queue = Arc::new(Queue::new(1));
    queue.put(ledger.item(0), None).unwrap();
    let failing = queue.try_get(None).unwrap();
    queue.put(ledger.item(1), None).unwrap(); // full again
    let blocked = {
        let (queue, item) = (Arc::clone(&queue), ledger.item(2));
        spawn(move || queue.put(item, None))
    };
    await_state(&queue, "put blocked on full", |s| s.blocked_putters == 1);
    failing.fail();
    queue.mark_failed("boom".to_owned()).unwrap();
    assert_eq!(failed_with(blocked.join("blocked put")), "boom");
    assert_eq!(ledger.cancelled_ids(), vec![1, 2]);
    ledger.assert_each_settled_once();
}

#[test]
fn a_wait_cut_short_while_raising_leaves_the_error_pending() {
    let ledger = Ledger::new(2);
    let queue = Queue::new(8);
    let b = fail_first_of_two_inflight(&ledger, &queue);
    assert!(
        !queue.wait(Some(Duration::from_millis(20))).unwrap(),
        "b is still inflight"
    );
    let mut interrupt = || true;
    let mut policy = WaitPolicy::forever().interruptible(Duration::from_millis(5), &mut interrupt);
    assert!(matches!(
        queue.done_with(&mut policy),
        Err(QueueError::Interrupted)
    ));
    b.finish();
    queue.mark_finished().unwrap();
    assert_eq!(
        failed_with(queue.done()),
        "boom",
        "still pending after the cut-short calls"
    );
    ledger.assert_each_settled_once();
}

/// An item whose cancellation blocks until released, to catch a wait that returns while a
/// put-back closure is still being cancelled.
struct GatedCancel {
    started: std::sync::mpsc::Sender<()>,
    release: std::sync::mpsc::Receiver<()>,
    cancelled: Arc<AtomicBool>,
}

impl crate::queue::Cancel for GatedCancel {
    fn cancel(self) {
        let _ = self.started.send(());
        self.release
            .recv_timeout(PROMPTLY)
            .expect("the test releases the cancellation");
        self.cancelled.store(true, Ordering::SeqCst);
    }
}

#[test]
fn a_put_back_closure_is_cancelled_before_a_wait_sees_nothing_inflight() {
    use std::sync::mpsc;
    let queue = Arc::new(crate::queue::ClosureQueue::<GatedCancel, String>::new(8));
    let (started_tx, started_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel();
    let cancelled = Arc::new(AtomicBool::new(false));
    let gated = GatedCancel {
        started: started_tx,
        release: release_rx,
        cancelled: Arc::clone(&cancelled),
    };
    // A second closure, which fails: its cancellation is never asked for.
    let (unused_tx, unused_rx) = mpsc::channel();
    let failing = GatedCancel {
        started: unused_tx,
        release: unused_rx,
        cancelled: Arc::new(AtomicBool::new(false)),
    };
    queue.put(gated, None).unwrap();
    queue.put(failing, None).unwrap();
    let taken = queue.try_get(None).unwrap();
    let failed = queue.try_get(None).unwrap();
    queue.mark_failed("boom".to_owned()).unwrap();
    drop(failed);
    let putter = {
        let queue = Arc::clone(&queue);
        spawn(move || queue.put_back(taken).is_ok())
    };
    started_rx
        .recv_timeout(PROMPTLY)
        .expect("put_back starts cancelling the closure");
    let waiter = {
        let queue = Arc::clone(&queue);
        let cancelled = Arc::clone(&cancelled);
        let (done_tx, done_rx) = mpsc::channel();
        std::thread::spawn(move || {
            let raised = matches!(queue.wait(Some(PROMPTLY)), Err(QueueError::Failed(_)));
            let _ = done_tx.send((raised, cancelled.load(Ordering::SeqCst)));
        });
        done_rx
    };
    // While the cancellation runs the closure still counts as inflight, so the wait (which
    // raises the error only once nothing is inflight) cannot have returned.
    assert!(
        waiter.recv_timeout(Duration::from_millis(200)).is_err(),
        "wait() returned while a put-back closure was still being cancelled"
    );
    release_tx.send(()).unwrap();
    assert!(putter.join("put_back"));
    let (raised, was_cancelled) = waiter.recv_timeout(PROMPTLY).expect("wait returns");
    assert!(raised, "wait() raises the pending error");
    assert!(
        was_cancelled,
        "the cancellation finished before wait() returned"
    );
    assert_eq!(queue.inflight(), 0);
}
