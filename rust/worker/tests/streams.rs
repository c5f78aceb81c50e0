//! `RunClosures` against a real worker server: order and batching, auth, hand-backs,
//! halting on errors, refusals, and shutdown with a stream open.

use super::*;
use crate::rpc::ClosureChannel;

/// Upper bound on any wait here; far above what a healthy run needs.
pub(super) const PATIENCE: Duration = Duration::from_secs(30);

pub(super) fn closure(hash: &[u8], id: u64) -> pb::RunClosureRequest {
    pb::RunClosureRequest {
        closure_id: id,
        ..run_request(hash, PICKLED_ONE)
    }
}

pub(super) fn message(closures: Vec<pb::RunClosureRequest>) -> pb::RunClosuresRequest {
    pb::RunClosuresRequest {
        closures,
        ..pb::RunClosuresRequest::default()
    }
}

/// Reads answers until `count` have arrived; also returns how many messages carried them.
pub(super) async fn answers(
    channel: &mut ClosureChannel,
    count: usize,
) -> (Vec<pb::ClosureReply>, usize) {
    let mut replies = Vec::new();
    let mut messages = 0;
    while replies.len() < count {
        let next = tokio::time::timeout(PATIENCE, channel.next()).await;
        let response = next
            .expect("answers arrive in time")
            .expect("the stream is open")
            .expect("the stream did not fail");
        messages += 1;
        replies.extend(response.replies);
    }
    (replies, messages)
}

/// `(closure id, outcome name)` of each answer.
pub(super) fn outcomes(replies: &[pb::ClosureReply]) -> Vec<(u64, &'static str)> {
    use pb::closure_reply::Outcome;
    replies
        .iter()
        .map(|reply| {
            let name = match &reply.outcome {
                Some(Outcome::Result(_)) => "result",
                Some(Outcome::Error(_)) => "error",
                Some(Outcome::Refused(_)) => "refused",
                Some(Outcome::Returned(_)) => "returned",
                None => "none",
            };
            (reply.closure_id, name)
        })
        .collect()
}

/// Waits until the worker holds `inflight` running and `queued` waiting jobs.
pub(super) async fn wait_for_depth(harness: &Harness, inflight: u32, queued: u32) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let status = harness.server.status();
        if (status.inflight, status.queued) == (inflight, queued) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the worker never reached that depth"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

pub(super) async fn registered(harness: &Harness, payload: &'static [u8]) -> [u8; 32] {
    let client = harness.client(Some(TOKEN));
    client
        .register_function(register_request(payload), None)
        .await
        .unwrap();
    content_hash(payload)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closures_sent_together_run_in_order_and_are_answered_on_the_stream() {
    let harness = Harness::start(config()).await;
    let hash = registered(&harness, PICKLED_ONE).await;
    let client = harness.client(Some(TOKEN));
    let closures = (1..=5).map(|id| closure(&hash, id)).collect();
    let mut channel = client.run_closures(message(closures)).await.unwrap();
    let (replies, _) = answers(&mut channel, 5).await;
    assert_eq!(
        outcomes(&replies),
        (1..=5).map(|id| (id, "result")).collect::<Vec<_>>()
    );
    let Some(pb::closure_reply::Outcome::Result(value)) = &replies[0].outcome else {
        unreachable!()
    };
    assert_eq!(&value.pickle[..], PICKLED_ONE);
    assert_eq!(harness.server.status().closures_run, 5);
    drop(channel);
    assert_eq!(harness.stop().await, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_without_the_right_token_is_unauthenticated_and_runs_nothing() {
    let harness = Harness::start(config()).await;
    let hash = registered(&harness, PICKLED_ONE).await;
    for token in [None, Some("wrong")] {
        let client = harness.client(token);
        let refused = client.run_closures(message(vec![closure(&hash, 1)])).await;
        assert!(
            matches!(refused, Err(RpcError::Unauthenticated(_))),
            "{token:?}: {refused:?}"
        );
    }
    let status = harness.server.status();
    assert_eq!(
        (status.closures_run, status.queued, status.inflight),
        (0, 0, 0)
    );
    assert_eq!(status.unauthenticated_requests, 2);
    assert_eq!(harness.stop().await, 0, "nothing ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn return_queued_hands_back_what_has_not_started() {
    let harness = Harness::start(config()).await;
    let hash = registered(&harness, PICKLED_ONE).await;
    harness.gate.store(false, Ordering::Release);
    let client = harness.client(Some(TOKEN));
    let closures = (1..=3).map(|id| closure(&hash, id)).collect();
    let mut channel = client.run_closures(message(closures)).await.unwrap();
    wait_for_depth(&harness, 1, 2).await;
    assert!(channel.send(pb::RunClosuresRequest {
        return_queued: true,
        ..pb::RunClosuresRequest::default()
    }));
    let (returned, _) = answers(&mut channel, 2).await;
    assert_eq!(outcomes(&returned), [(2, "returned"), (3, "returned")]);
    wait_for_depth(&harness, 1, 0).await;
    harness.gate.store(true, Ordering::Release);
    let (ran, _) = answers(&mut channel, 1).await;
    assert_eq!(outcomes(&ran), [(1, "result")]);
    drop(channel);
    assert_eq!(
        harness.stop().await,
        1,
        "the handed-back closures never ran"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_halting_stream_starts_nothing_after_an_error_until_resumed() {
    let harness = Harness::start(config()).await;
    let echo = registered(&harness, PICKLED_ONE).await;
    let raise = registered(&harness, RAISE).await;
    harness.gate.store(false, Ordering::Release);
    let client = harness.client(Some(TOKEN));
    let first = pb::RunClosuresRequest {
        halt_on_error: true,
        ..message(vec![
            closure(&raise, 1),
            closure(&echo, 2),
            closure(&echo, 3),
        ])
    };
    let mut channel = client.run_closures(first).await.unwrap();
    wait_for_depth(&harness, 1, 2).await;
    harness.gate.store(true, Ordering::Release);
    // The error comes first, then what it halted.
    let (replies, _) = answers(&mut channel, 3).await;
    assert_eq!(
        outcomes(&replies),
        [(1, "error"), (2, "returned"), (3, "returned")]
    );
    // Halted: a closure sent now is handed back too.
    channel.send(message(vec![closure(&echo, 4)]));
    let (replies, _) = answers(&mut channel, 1).await;
    assert_eq!(outcomes(&replies), [(4, "returned")]);
    // Resumed: closures run again.
    channel.send(pb::RunClosuresRequest {
        resume: true,
        ..message(vec![closure(&echo, 5)])
    });
    let (replies, _) = answers(&mut channel, 1).await;
    assert_eq!(outcomes(&replies), [(5, "result")]);
    drop(channel);
    assert_eq!(harness.stop().await, 2, "only closures 1 and 5 ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_travel_on_the_stream_and_it_keeps_serving() {
    let harness = Harness::start(config()).await;
    let echo = registered(&harness, PICKLED_ONE).await;
    let client = harness.client(Some(TOKEN));
    let mut malformed = closure(b"short", 2);
    malformed.function_hash = Bytes::from_static(b"short");
    let closures = vec![closure(&[9; 32], 1), malformed, closure(&echo, 3)];
    let mut channel = client.run_closures(message(closures)).await.unwrap();
    let (replies, _) = answers(&mut channel, 3).await;
    let mut by_id = replies.clone();
    by_id.sort_by_key(|reply| reply.closure_id);
    assert_eq!(
        outcomes(&by_id),
        [(1, "refused"), (2, "refused"), (3, "result")]
    );
    let codes: Vec<i32> = by_id[..2]
        .iter()
        .map(|reply| match &reply.outcome {
            Some(pb::closure_reply::Outcome::Refused(refusal)) => refusal.code,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        codes,
        [
            tonic::Code::NotFound as i32,
            tonic::Code::InvalidArgument as i32
        ]
    );
    assert_eq!(harness.server.status().rejected_requests, 2);
    drop(channel);
    assert_eq!(harness.stop().await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_refuses_queued_closures_answers_the_running_one_and_ends_the_stream() {
    let harness = Harness::start(config()).await;
    let hash = registered(&harness, PICKLED_ONE).await;
    harness.gate.store(false, Ordering::Release);
    let client = harness.client(Some(TOKEN));
    let closures = (1..=3).map(|id| closure(&hash, id)).collect();
    let mut channel = client.run_closures(message(closures)).await.unwrap();
    wait_for_depth(&harness, 1, 2).await;
    assert!(harness.server.begin_shutdown());
    let (refused, _) = answers(&mut channel, 2).await;
    assert_eq!(outcomes(&refused), [(2, "refused"), (3, "refused")]);
    harness.gate.store(true, Ordering::Release);
    let (ran, _) = answers(&mut channel, 1).await;
    assert_eq!(outcomes(&ran), [(1, "result")]);
    // The stream ends although the client never closed it, so the server can stop. The
    // drain notice may come after the last answer (it is sent beside them, not in order).
    let mut end = tokio::time::timeout(PATIENCE, channel.next()).await;
    while let Ok(Some(Ok(notice))) = &end {
        assert!(notice.draining && notice.replies.is_empty(), "{notice:?}");
        end = tokio::time::timeout(PATIENCE, channel.next()).await;
    }
    assert!(matches!(end, Ok(None)), "{end:?}");
    assert_eq!(harness.stop().await, 1);
}

/// Unary `RunClosure` calls, as a stream to a revision-1 worker is emulated.
struct Unary(WorkerClient);

impl crate::rpc::client::emulated::ClosureRunner for Unary {
    async fn run(
        &self,
        request: pb::RunClosureRequest,
    ) -> Result<pb::RunClosureResponse, RpcError> {
        self.0.run_closure(request, None).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_emulated_over_unary_calls_keeps_the_streams_rules() {
    let harness = Harness::start(config()).await;
    let echo = registered(&harness, PICKLED_ONE).await;
    let raise = registered(&harness, RAISE).await;
    harness.gate.store(false, Ordering::Release);
    let first = pb::RunClosuresRequest {
        halt_on_error: true,
        ..message(vec![
            closure(&echo, 1),
            closure(&raise, 2),
            closure(&echo, 3),
            closure(&echo, 4),
        ])
    };
    let mut channel =
        crate::rpc::client::emulated::emulate(Unary(harness.client(Some(TOKEN))), first);
    wait_for_depth(&harness, 1, 0).await; // closure 1 runs; the rest wait in the emulation
    channel.send(pb::RunClosuresRequest {
        return_queued: true,
        ..message(vec![closure(&echo, 5)])
    });
    let (handed_back, _) = answers(&mut channel, 3).await;
    assert_eq!(
        outcomes(&handed_back),
        [(2, "returned"), (3, "returned"), (4, "returned")]
    );
    harness.gate.store(true, Ordering::Release);
    let (ran, _) = answers(&mut channel, 2).await;
    assert_eq!(outcomes(&ran), [(1, "result"), (5, "result")]);
    channel.send(message(vec![closure(&raise, 6), closure(&echo, 7)]));
    let (halted, _) = answers(&mut channel, 2).await;
    assert_eq!(outcomes(&halted), [(6, "error"), (7, "returned")]);
    drop(channel);
    assert_eq!(harness.stop().await, 3, "closures 1, 5 and 6 ran");
}

#[tokio::test]
async fn answers_are_gathered_into_messages_of_half_a_frame() {
    use crate::rpc::wire::limits::BATCH_MESSAGE_BYTES;
    use crate::worker::stream::{reply_channel, Answer, Outbound};
    use prost::Message as _;
    use tokio_stream::StreamExt as _;

    let (sender, _lease, mut replies) = reply_channel(64 << 20, &std::sync::Arc::default());
    for id in 1..=20_u64 {
        let value = pb::Value {
            pickle: Bytes::from_static(PICKLED_ONE),
            buffers: vec![Bytes::from(vec![0u8; 64 * 1024])],
        };
        let reply = pb::ClosureReply {
            closure_id: id,
            outcome: Some(pb::closure_reply::Outcome::Result(value)),
        };
        sender.send(Outbound::Reply(Answer::new(reply))).unwrap();
    }
    drop(sender);
    let (mut ids, mut counts) = (Vec::new(), Vec::new());
    while let Some(message) = replies.next().await {
        let message = message.unwrap();
        assert!(
            message.encoded_len() <= BATCH_MESSAGE_BYTES,
            "a {}-byte message",
            message.encoded_len()
        );
        counts.push(message.replies.len());
        ids.extend(message.replies.iter().map(|reply| reply.closure_id));
    }
    assert_eq!(ids, (1..=20).collect::<Vec<_>>(), "in order, none lost");
    // All twenty were waiting: gathered seven to a message, not twenty in one of 1.3 MB.
    assert_eq!(counts, [7, 7, 6]);
}
