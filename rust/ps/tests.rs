//! In-process tests of the ps service: a real tonic server on 127.0.0.1:0 and the real
//! client over TCP.

use bytes::Bytes;

use super::*;
use crate::rpc::{ClientConfig, RpcError};

const TOKEN: &str = "ps-test-token";

fn config() -> PsConfig {
    PsConfig {
        auth_token: Some(TOKEN.to_owned()),
        ps_index: 1,
        ..PsConfig::default()
    }
}

fn client(server: &PsServer, token: Option<&str>) -> PsClient {
    let mut config = ClientConfig::new(server.local_addr().to_string());
    config.auth_token = token.map(str::to_owned);
    PsClient::connect_lazy(&config).unwrap()
}

fn f32_tensor(shape: &[u64], values: &[f32]) -> pb::Tensor {
    pb::Tensor {
        dtype: pb::DataType::Float32.into(),
        shape: shape.to_vec(),
        data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

fn f32s(t: &pb::Tensor) -> Vec<f32> {
    t.data
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn create(name: &str, value: pb::Tensor) -> pb::CreateVariableRequest {
    pb::CreateVariableRequest {
        name: name.to_owned(),
        initial_value: Some(value),
        replace: false,
    }
}

fn update(name: &str, value: pb::Tensor) -> pb::UpdateRequest {
    pb::UpdateRequest {
        name: name.to_owned(),
        value: Some(value),
        read_value: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn variables_round_trip_over_grpc() {
    let server = PsServer::start(config()).await.unwrap();
    let c = client(&server, Some(TOKEN));
    let status = c.get_status(None).await.unwrap();
    assert_eq!((status.ps_index, status.variables), (1, 0));
    assert_ne!(status.incarnation, 0);

    let replaced = c
        .create_variable(create("w", f32_tensor(&[2], &[1.0, 2.0])), None)
        .await
        .unwrap();
    assert!(!replaced);
    let mut request = update("w", f32_tensor(&[2], &[0.5, 1.0]));
    request.read_value = true;
    let r = c.update(Op::Add, request, None).await.unwrap();
    assert_eq!((r.version, f32s(&r.value.unwrap())), (1, vec![1.5, 3.0]));
    c.update(Op::Sub, update("w", f32_tensor(&[2], &[1.5, 1.0])), None)
        .await
        .unwrap();
    let read = c.read("w".into(), None).await.unwrap();
    assert_eq!(f32s(read.value.as_ref().unwrap()), vec![0.0, 2.0]);
    assert_eq!(read.version, 2);

    let scatter = pb::ScatterAddRequest {
        name: "w".into(),
        indices: vec![1, 1],
        updates: Some(f32_tensor(&[2], &[3.0, 4.0])),
        read_value: true,
    };
    let r = c.scatter_add(scatter, None).await.unwrap();
    assert_eq!(f32s(&r.value.unwrap()), vec![0.0, 9.0]);

    let listed = c.list_variables(None).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].shape.clone(), listed[0].version), (vec![2], 3));

    let many = pb::AssignManyRequest {
        variables: vec![pb::NamedTensor {
            name: "v".into(),
            value: Some(f32_tensor(&[], &[7.0])),
            version: 0,
        }],
        create_missing: true,
    };
    assert_eq!(c.assign_many(many, None).await.unwrap(), (0, 1));
    let all = c.read_many(Vec::new(), None).await.unwrap();
    let names: Vec<&str> = all.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["v", "w"]);
    assert_eq!(c.delete_variables(vec!["v".into()], None).await.unwrap(), 1);

    let status = c.get_status(None).await.unwrap();
    assert_eq!((status.variables, status.variable_bytes), (1, 8));
    assert_eq!(status.updates, 3);
    assert_eq!(status.variables_created, 2);
    server.stop_serving().unwrap().await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_or_wrong_token_reads_and_changes_nothing() {
    let server = PsServer::start(config()).await.unwrap();
    let good = client(&server, Some(TOKEN));
    good.create_variable(create("w", f32_tensor(&[], &[1.0])), None)
        .await
        .unwrap();
    for token in [None, Some("wrong"), Some("ps-test-token2")] {
        let c = client(&server, token);
        let e = c.read("w".into(), None).await.unwrap_err();
        assert!(
            matches!(e, RpcError::Unauthenticated(_)),
            "{token:?}: {e:?}"
        );
        let e = c
            .update(Op::Assign, update("w", f32_tensor(&[], &[5.0])), None)
            .await
            .unwrap_err();
        assert!(
            matches!(e, RpcError::Unauthenticated(_)),
            "{token:?}: {e:?}"
        );
    }
    let read = good.read("w".into(), None).await.unwrap();
    assert_eq!((f32s(&read.value.unwrap()), read.version), (vec![1.0], 0));
    assert_eq!(
        good.get_status(None)
            .await
            .unwrap()
            .unauthenticated_requests,
        6
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_refused_clearly_and_the_ps_keeps_serving() {
    let server = PsServer::start(config()).await.unwrap();
    let c = client(&server, Some(TOKEN));
    c.create_variable(create("w", f32_tensor(&[2], &[1.0, 2.0])), None)
        .await
        .unwrap();

    let e = c
        .update(Op::Add, update("w", f32_tensor(&[3], &[1.0; 3])), None)
        .await
        .unwrap_err();
    let RpcError::InvalidArgument(message) = &e else {
        panic!("expected InvalidArgument, got {e:?}")
    };
    assert!(
        message.contains("AssignAdd on ps") && message.contains("float32[3]"),
        "{message}"
    );

    let torn = pb::Tensor {
        dtype: pb::DataType::Float64.into(),
        shape: vec![2],
        data: Bytes::from_static(&[0; 7]),
    };
    let e = c
        .update(Op::Add, update("w", torn), None)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, RpcError::InvalidArgument(m) if m.contains("7 bytes")),
        "{e:?}"
    );
    let missing_value = pb::UpdateRequest {
        name: "w".into(),
        value: None,
        read_value: false,
    };
    let e = c.update(Op::Assign, missing_value, None).await.unwrap_err();
    assert!(
        matches!(&e, RpcError::InvalidArgument(m) if m.contains("missing")),
        "{e:?}"
    );
    let e = c.read("nope".into(), None).await.unwrap_err();
    assert!(matches!(e, RpcError::NotFound(_)), "{e:?}");
    let e = c
        .create_variable(create("w", f32_tensor(&[], &[0.0])), None)
        .await
        .unwrap_err();
    assert!(matches!(e, RpcError::FailedPrecondition(_)), "{e:?}");

    let read = c.read("w".into(), None).await.unwrap();
    assert_eq!(
        (f32s(&read.value.unwrap()), read.version),
        (vec![1.0, 2.0], 0)
    );
    assert_eq!(c.get_status(None).await.unwrap().rejected_requests, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_requests_are_resource_exhausted() {
    let mut cfg = config();
    cfg.max_message_bytes = 4096;
    let server = PsServer::start(cfg).await.unwrap();
    let c = client(&server, Some(TOKEN));
    let big = f32_tensor(&[2048], &[0.0; 2048]);
    let e = c
        .create_variable(create("big", big), None)
        .await
        .unwrap_err();
    assert!(matches!(e, RpcError::ResourceExhausted(_)), "{e:?}");
    c.create_variable(create("small", f32_tensor(&[4], &[0.0; 4])), None)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_concurrent_clients_lose_no_update() {
    const CLIENTS: usize = 16;
    const ADDS: usize = 100;
    let server = PsServer::start(config()).await.unwrap();
    let c = client(&server, Some(TOKEN));
    let counter = pb::Tensor {
        dtype: pb::DataType::Int64.into(),
        shape: vec![],
        data: Bytes::copy_from_slice(&0i64.to_le_bytes()),
    };
    c.create_variable(create("n", counter), None).await.unwrap();
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|_| {
            // A separate connection per task, as separate worker processes would have.
            let c = client(&server, Some(TOKEN));
            tokio::spawn(async move {
                for _ in 0..ADDS {
                    let one = pb::Tensor {
                        dtype: pb::DataType::Int64.into(),
                        shape: vec![],
                        data: Bytes::copy_from_slice(&1i64.to_le_bytes()),
                    };
                    c.update(Op::Add, update("n", one), None).await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let read = c.read("n".into(), None).await.unwrap();
    let value = i64::from_le_bytes(read.value.unwrap().data[..].try_into().unwrap());
    assert_eq!(value, (CLIENTS * ADDS) as i64);
    assert_eq!(read.version, (CLIENTS * ADDS) as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_ps_is_unavailable_and_bad_settings_are_refused() {
    let server = PsServer::start(config()).await.unwrap();
    let address = server.local_addr().to_string();
    drop(server);
    let mut cfg = ClientConfig::new(address.clone());
    cfg.auth_token = Some(TOKEN.to_owned());
    let c = PsClient::connect_lazy(&cfg).unwrap();
    let e = c
        .read("w".into(), Some(std::time::Duration::from_secs(5)))
        .await
        .unwrap_err();
    assert!(matches!(e, RpcError::Unavailable(_)), "{e:?}");
    assert!(e.message().contains(&address), "{e}");

    let e = PsClient::connect_lazy(&ClientConfig::new("nohost"))
        .err()
        .unwrap();
    assert!(e.message().contains("ps address"), "{e}");

    let open = PsConfig {
        address: "0.0.0.0:0".into(),
        ..PsConfig::default()
    };
    let e = PsServer::start(open).await.err().unwrap();
    assert!(e.to_string().contains("without an auth token"), "{e}");
    let negative = PsConfig {
        ps_index: -1,
        ..PsConfig::default()
    };
    assert!(PsServer::start(negative).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_breaks_mid_call_is_unavailable() {
    use tokio::io::AsyncReadExt;

    // A "ps" that takes the call and then drops the connection without answering, as a
    // SIGKILLed ps does.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let dropper = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut buffer = vec![0u8; 64 * 1024];
        let _ = socket.read(&mut buffer).await;
    });
    let mut cfg = ClientConfig::new(address.clone());
    cfg.auth_token = Some(TOKEN.to_owned());
    let c = PsClient::connect_lazy(&cfg).unwrap();
    let e = c
        .read("w".into(), Some(std::time::Duration::from_secs(30)))
        .await
        .unwrap_err();
    assert!(matches!(e, RpcError::Unavailable(_)), "{e:?}");
    assert!(e.message().contains(&address), "{e}");
    dropper.await.unwrap();
}
