//! `ReadValue` (dataflow) against real servers: a value above the message limit read in
//! chunks from a reader thread, per session, while the executor is busy; a pull between
//! two servers counted on both; reads refused once the listener closed.

use std::collections::HashMap;

use super::streams::PATIENCE;
use super::*;
use crate::worker::reads::ReadPop;

/// Answers reads from `values` (by session and id) until the server stops serving.
fn spawn_reader(
    server: Arc<WorkerServer>,
    values: HashMap<(String, u64), pb::Value>,
) -> JoinHandle<usize> {
    std::thread::spawn(move || {
        let mut answered = 0;
        loop {
            match server.next_read(Duration::from_millis(20)) {
                ReadPop::Read(read) => {
                    let key = (read.session.as_str().to_owned(), read.value_id);
                    let answer = values
                        .get(&key)
                        .cloned()
                        .ok_or_else(|| tonic::Status::not_found("no such kept value"));
                    read.reply(answer);
                    answered += 1;
                }
                ReadPop::Empty => {}
                ReadPop::Closed => return answered,
            }
        }
    })
}

fn value(bytes: usize) -> pb::Value {
    pb::Value {
        pickle: Bytes::from_static(b"\x80\x05N."),
        buffers: vec![Bytes::from(
            (0..bytes).map(|i| (i % 251) as u8).collect::<Vec<_>>(),
        )],
    }
}

fn client_of(server: &WorkerServer, session: &str) -> WorkerClient {
    let mut config = ClientConfig::new(server.local_addr().to_string());
    config.auth_token = Some(TOKEN.to_owned());
    config.session = Some(session.to_owned());
    config.max_message_bytes = 1 << 20;
    WorkerClient::connect_lazy(&config).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_value_is_read_in_chunks_per_session_while_the_executor_is_busy() {
    let harness = Harness::start(WorkerConfig {
        max_message_bytes: 1 << 20,
        ..config()
    })
    .await;
    // A closure holds the executor (its gate is closed) while the reads are served.
    harness.gate.store(false, Ordering::SeqCst);
    let client = harness.client(Some(TOKEN));
    client
        .register_function(register_request(PICKLED_ONE), None)
        .await
        .unwrap();
    let hash = content_hash(PICKLED_ONE);
    let running = tokio::spawn(async move {
        client
            .run_closure(run_request(&hash, PICKLED_ONE), Some(PATIENCE))
            .await
    });
    let started = std::time::Instant::now();
    while harness.server.status().inflight == 0 {
        assert!(started.elapsed() < PATIENCE, "the closure never started");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let kept = value(3 << 20); // three times the message limit
    let values = HashMap::from([(("s1".to_owned(), 5), kept.clone())]);
    let reader = spawn_reader(Arc::clone(&harness.server), values);

    let read = client_of(&harness.server, "s1")
        .read_value(5, Some(PATIENCE))
        .await
        .unwrap();
    assert_eq!(read, kept);
    let status = harness.server.status();
    assert_eq!(status.peer_reads_served, 1);
    assert_eq!(status.peer_bytes_sent, stats::value_bytes(&kept));

    let other = client_of(&harness.server, "s2")
        .read_value(5, Some(PATIENCE))
        .await;
    assert!(matches!(other, Err(RpcError::NotFound(_))), "{other:?}");
    assert_eq!(harness.server.status().peer_reads_served, 1);

    // A second server pulls it with its own token, in the caller's session, counted.
    let puller = WorkerServer::start(config()).await.unwrap();
    let holder = harness.server.local_addr().to_string();
    let session = SessionId::new("s1").unwrap();
    let value_pulled = puller
        .pull_value(&holder, &session, 5, Some(PATIENCE))
        .await
        .unwrap();
    assert_eq!(value_pulled, kept);
    let status = puller.status();
    assert_eq!(status.peer_pulls, 1);
    assert_eq!(status.peer_bytes_received, stats::value_bytes(&kept));
    drop(puller);

    assert!(!running.is_finished(), "the reads waited for the closure");
    harness.gate.store(true, Ordering::SeqCst);
    running.await.unwrap().unwrap();
    let server = Arc::clone(&harness.server);
    harness.stop().await;
    assert_eq!(
        tokio::task::spawn_blocking(move || reader.join().unwrap())
            .await
            .unwrap(),
        3
    );
    assert!(server.reads_closed());
}
