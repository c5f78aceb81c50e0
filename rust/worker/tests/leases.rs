//! Leased `RunClosures` streams (protocol revision 4): heartbeats on every message, pings
//! answered while a closure runs, and closures that start only under a valid lease.

use super::streams::{answers, closure, message, outcomes, registered, wait_for_depth, PATIENCE};
use super::*;
use crate::rpc::ClosureChannel;

/// The next message on `channel`, whatever it carries.
async fn next_message(channel: &mut ClosureChannel) -> pb::RunClosuresResponse {
    tokio::time::timeout(PATIENCE, channel.next())
        .await
        .expect("a message arrives in time")
        .expect("the stream is open")
        .expect("the stream did not fail")
}

/// Reads messages until one asks for an acknowledgement; returns its heartbeat.
async fn ack_request(channel: &mut ClosureChannel) -> u64 {
    loop {
        let response = next_message(channel).await;
        assert!(
            response.replies.is_empty(),
            "nothing may run before the ack"
        );
        if response.wants_ack {
            assert!(response.heartbeat > 0);
            return response.heartbeat;
        }
    }
}

/// The next message that is not a repeated acknowledgement request sent before the closure
/// started: a worker whose lease is not valid asks again each time its executor looks for
/// work (every 20 ms in these tests), so a slow acknowledgement can leave one queued.
async fn next_after_ack(channel: &mut ClosureChannel) -> pb::RunClosuresResponse {
    loop {
        let response = next_message(channel).await;
        let stale = response.wants_ack
            && response.replies.is_empty()
            && response.running_closure_id == 0
            && !response.draining;
        if !stale {
            return response;
        }
    }
}

fn ack(heartbeat: u64) -> pb::RunClosuresRequest {
    pb::RunClosuresRequest {
        heartbeat_ack: heartbeat,
        ..pb::RunClosuresRequest::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leased_stream_starts_nothing_until_its_heartbeat_is_acknowledged() {
    let harness = Harness::start(config()).await;
    let hash = registered(&harness, PICKLED_ONE).await;
    let client = harness.client(Some(TOKEN));
    let first = pb::RunClosuresRequest {
        lease_ms: 60_000,
        ..message(vec![closure(&hash, 1), closure(&hash, 2)])
    };
    let mut channel = client.run_closures(first).await.unwrap();
    let heartbeat = ack_request(&mut channel).await;
    let status = harness.server.status();
    assert_eq!(
        (status.inflight, status.queued, status.closures_run),
        (0, 2, 0)
    );
    channel.send(ack(heartbeat));
    let (replies, _) = answers(&mut channel, 2).await;
    assert_eq!(outcomes(&replies), [(1, "result"), (2, "result")]);
    drop(channel);
    assert_eq!(harness.stop().await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_lease_holds_queued_closures_until_a_fresh_acknowledgement() {
    let harness = Harness::start(config()).await;
    let hash = registered(&harness, PICKLED_ONE).await;
    let client = harness.client(Some(TOKEN));
    let lease = Duration::from_millis(300);
    let first = pb::RunClosuresRequest {
        lease_ms: lease.as_millis() as u32,
        ..message(vec![closure(&hash, 1)])
    };
    let mut channel = client.run_closures(first).await.unwrap();
    let old = ack_request(&mut channel).await;
    channel.send(ack(old));
    let (replies, _) = answers(&mut channel, 1).await;
    assert_eq!(outcomes(&replies), [(1, "result")]);
    // The lease runs out (what a frozen or cut-off worker finds when it wakes up): a
    // closure arriving now, even with the old acknowledgement, waits.
    tokio::time::sleep(lease).await;
    channel.send(pb::RunClosuresRequest {
        heartbeat_ack: old,
        ..message(vec![closure(&hash, 2)])
    });
    let fresh = ack_request(&mut channel).await;
    assert!(fresh > old);
    wait_for_depth(&harness, 0, 1).await;
    assert_eq!(
        harness.server.status().closures_run,
        1,
        "closure 2 did not start"
    );
    channel.send(ack(fresh));
    let (replies, _) = answers(&mut channel, 1).await;
    assert_eq!(outcomes(&replies), [(2, "result")]);
    drop(channel);
    assert_eq!(harness.stop().await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledgement_of_a_heartbeat_never_sent_grants_no_lease() {
    let harness = Harness::start(config()).await;
    let hash = registered(&harness, PICKLED_ONE).await;
    let client = harness.client(Some(TOKEN));
    // A coordinator that carried an older stream's acknowledgement (its clock far ahead of
    // this new stream's) into the first message: the closure must still wait for a real one.
    let first = pb::RunClosuresRequest {
        lease_ms: 60_000,
        heartbeat_ack: 3_600_000_000,
        ..message(vec![closure(&hash, 1)])
    };
    let mut channel = client.run_closures(first).await.unwrap();
    let heartbeat = ack_request(&mut channel).await;
    assert!(heartbeat < 3_600_000_000);
    wait_for_depth(&harness, 0, 1).await;
    assert_eq!(
        harness.server.status().closures_run,
        0,
        "closure 1 did not start"
    );
    channel.send(ack(heartbeat));
    let (replies, _) = answers(&mut channel, 1).await;
    assert_eq!(outcomes(&replies), [(1, "result")]);
    drop(channel);
    assert_eq!(harness.stop().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ping_is_answered_while_a_closure_runs_naming_it() {
    let harness = Harness::start(config()).await;
    let hash = registered(&harness, PICKLED_ONE).await;
    let client = harness.client(Some(TOKEN));
    harness.gate.store(false, Ordering::Release);
    let first = pb::RunClosuresRequest {
        lease_ms: 60_000,
        ..message(vec![closure(&hash, 7)])
    };
    let mut channel = client.run_closures(first).await.unwrap();
    let heartbeat = ack_request(&mut channel).await;
    channel.send(ack(heartbeat));
    wait_for_depth(&harness, 1, 0).await; // closure 7 runs, held by the gate
    channel.send(pb::RunClosuresRequest {
        ping: true,
        ..ack(heartbeat)
    });
    let pong = next_after_ack(&mut channel).await;
    assert!(pong.replies.is_empty());
    assert!(pong.heartbeat > heartbeat, "{pong:?}");
    assert_eq!(pong.running_closure_id, 7);
    harness.gate.store(true, Ordering::Release);
    let (replies, _) = answers(&mut channel, 1).await;
    assert_eq!(outcomes(&replies), [(7, "result")]);
    drop(channel);
    assert_eq!(harness.stop().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unleased_stream_carries_no_heartbeats() {
    let harness = Harness::start(config()).await;
    let hash = registered(&harness, PICKLED_ONE).await;
    let client = harness.client(Some(TOKEN));
    let mut channel = client
        .run_closures(message(vec![closure(&hash, 1)]))
        .await
        .unwrap();
    let response = next_message(&mut channel).await;
    assert_eq!(outcomes(&response.replies), [(1, "result")]);
    assert_eq!((response.heartbeat, response.running_closure_id), (0, 0));
    drop(channel);
    assert_eq!(harness.stop().await, 1);
}

/// Reads messages until one carries answers; returns it (its heartbeat is the highest yet).
async fn next_answers(channel: &mut ClosureChannel) -> pb::RunClosuresResponse {
    loop {
        let response = next_message(channel).await;
        if !response.replies.is_empty() {
            return response;
        }
    }
}

/// A leased stream with closure 7 running (held by the gate), acknowledged.
async fn running_seven(harness: &Harness) -> ClosureChannel {
    let hash = registered(harness, PICKLED_ONE).await;
    harness.gate.store(false, Ordering::Release);
    let first = pb::RunClosuresRequest {
        lease_ms: 60_000,
        ..message(vec![closure(&hash, 7)])
    };
    let mut channel = harness
        .client(Some(TOKEN))
        .run_closures(first)
        .await
        .unwrap();
    let heartbeat = ack_request(&mut channel).await;
    channel.send(ack(heartbeat));
    wait_for_depth(harness, 1, 0).await;
    channel
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_worker_ends_a_leased_stream_only_once_its_last_answer_is_acknowledged() {
    let harness = Harness::start(config()).await;
    let hash = registered(&harness, PICKLED_ONE).await;
    let mut channel = running_seven(&harness).await;
    assert!(harness.server.begin_shutdown());
    let notice = next_after_ack(&mut channel).await;
    assert!(notice.draining && notice.wants_ack, "{notice:?}");
    // Still read while draining: pings are answered, new closures refused.
    channel.send(pb::RunClosuresRequest {
        ping: true,
        ..message(vec![closure(&hash, 8)])
    });
    let refused = next_answers(&mut channel).await;
    assert_eq!(outcomes(&refused.replies), [(8, "refused")]);
    harness.gate.store(true, Ordering::Release);
    let answered = next_answers(&mut channel).await;
    assert_eq!(outcomes(&answered.replies), [(7, "result")]);
    assert!(answered.draining && answered.wants_ack);
    assert!(
        !harness.server.wait_acknowledged(Duration::ZERO),
        "the stream waits for the acknowledgement"
    );
    channel.send(ack(answered.heartbeat));
    let end = stream_end(&mut channel).await;
    assert!(matches!(end, Ok(None)), "{end:?}");
    let server = Arc::clone(&harness.server);
    let settled = tokio::task::spawn_blocking(move || server.wait_acknowledged(PATIENCE));
    assert!(settled.await.unwrap());
    assert!(harness.server.release_streams().is_empty());
    assert_eq!(harness.stop().await, 1);
}

/// What follows on a draining stream once nothing is owed: heartbeats already on their way
/// (a draining worker asks for acknowledgements on a timer), then the end. Returns the first
/// thing that is not such a heartbeat.
async fn stream_end(
    channel: &mut ClosureChannel,
) -> Result<
    Option<Result<pb::RunClosuresResponse, crate::rpc::RpcError>>,
    tokio::time::error::Elapsed,
> {
    loop {
        match tokio::time::timeout(PATIENCE, channel.next()).await {
            Ok(Some(Ok(message))) if message.replies.is_empty() => {}
            other => return other,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_drain_deadline_the_unacknowledged_answers_are_named_and_the_stream_ends() {
    let harness = Harness::start(config()).await;
    let mut channel = running_seven(&harness).await;
    assert!(harness.server.begin_shutdown());
    harness.gate.store(true, Ordering::Release);
    let answered = next_answers(&mut channel).await;
    assert_eq!(outcomes(&answered.replies), [(7, "result")]);
    // The coordinator never acknowledges: the shutdown gives up and says what is at stake.
    assert!(!harness.server.wait_acknowledged(Duration::from_millis(50)));
    assert_eq!(harness.server.release_streams(), vec![7]);
    let end = stream_end(&mut channel).await;
    assert!(matches!(end, Ok(None)), "{end:?}");
    assert_eq!(harness.stop().await, 1);
}
