//! Drop counting: every item the queue ever held is released exactly once, whichever
//! way it leaves (handed out, cancelled, refused, or dropped with the queue).

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{Ledger, Queue};
use crate::queue::QueueError;

#[test]
fn items_left_in_a_dropped_queue_are_dropped_once_and_not_cancelled() {
    let ledger = Ledger::new(6);
    let queue = Queue::new(0);
    for id in 0..3 {
        queue.put(ledger.item(id), None).unwrap();
    }
    for id in 3..6 {
        queue.put(ledger.item(id), Some(id as i64 % 2)).unwrap();
    }
    drop(queue);
    assert_eq!(Ledger::count(&ledger.dropped), 6);
    assert_eq!(
        Ledger::count(&ledger.cancelled),
        0,
        "dropping is not cancelling"
    );
    assert!(ledger.dropped.iter().all(|d| d.load(Ordering::SeqCst) == 1));
}

#[test]
fn every_exit_path_drops_each_item_exactly_once() {
    let ledger = Ledger::new(10);
    let queue = Queue::new(3);

    // Handed out and finished.
    queue.put(ledger.item(0), None).unwrap();
    queue.get(None, Some(Duration::ZERO)).unwrap().finish();
    queue.mark_finished().unwrap();

    // Put back, taken again, failed.
    queue.put(ledger.item(1), None).unwrap();
    let item = queue.get(None, Some(Duration::ZERO)).unwrap();
    queue.put_back(item).unwrap();
    queue.get(None, Some(Duration::ZERO)).unwrap().fail();
    queue.mark_failed("boom".to_owned()).unwrap();

    // Queued, then cancelled when the error is raised by the next put (which is cancelled
    // too).
    let err = queue.put(ledger.item(2), None).unwrap_err();
    assert!(matches!(err, QueueError::Failed(_)));

    // Refused by try_put and handed back: the caller owns it again.
    queue.put(ledger.item(3), None).unwrap();
    queue.put(ledger.item(4), None).unwrap();
    queue.put(ledger.item(5), None).unwrap();
    let refused = queue
        .try_put(ledger.item(6), None)
        .unwrap_err()
        .into_inner();
    assert_eq!(ledger.dropped[6].load(Ordering::SeqCst), 0);
    refused.finish(); // stands in for "ran elsewhere"

    // Put back while an error is pending: cancelled.
    let item = queue.get(None, Some(Duration::ZERO)).unwrap();
    let other = queue.get(None, Some(Duration::ZERO)).unwrap();
    other.fail();
    queue.mark_failed("second".to_owned()).unwrap();
    queue.put_back(item).unwrap();

    // Misused put_back (nothing inflight after the next settle): dropped, not cancelled.
    let last = queue.get(None, Some(Duration::ZERO)).unwrap();
    last.finish();
    queue.mark_finished().unwrap();
    let misuse = queue.put_back(ledger.item(7)).unwrap_err();
    assert!(matches!(
        misuse,
        QueueError::NotInflight {
            operation: "put_back"
        }
    ));
    assert_eq!(ledger.dropped[7].load(Ordering::SeqCst), 1);
    assert_eq!(ledger.cancelled[7].load(Ordering::SeqCst), 0);
    ledger.finished[7].fetch_add(1, Ordering::SeqCst); // account for it: the caller's call

    // Tagged and untagged items cancelled by stop, and a put after stop.
    let err = queue.done().unwrap_err(); // raises "second", queue now clean
    assert!(matches!(err, QueueError::Failed(ref e) if **e == "second"));
    queue.put(ledger.item(8), Some(0)).unwrap();
    queue.stop();
    assert!(matches!(
        queue.put(ledger.item(9), None),
        Err(QueueError::Stopped)
    ));
    drop(queue);

    assert_eq!(ledger.cancelled_ids(), vec![2, 3, 8, 9]);
    ledger.assert_each_settled_once();
}
