// The values compared are small integers, exact in f32: equality is what is meant.
#![allow(clippy::float_cmp, clippy::cast_precision_loss)]

use std::sync::Arc;

use bytes::Bytes;

use super::*;

fn f32_tensor(shape: &[u64], values: &[f32]) -> pb::Tensor {
    let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    pb::Tensor {
        dtype: pb::DataType::Float32.into(),
        shape: shape.to_vec(),
        data: Bytes::from(data),
    }
}

fn i64_tensor(shape: &[u64], values: &[i64]) -> pb::Tensor {
    let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    pb::Tensor {
        dtype: pb::DataType::Int64.into(),
        shape: shape.to_vec(),
        data: Bytes::from(data),
    }
}

fn view(t: &pb::Tensor) -> TensorView<'_> {
    TensorView::from_pb(t, "test value").unwrap()
}

fn f32s(t: &pb::Tensor) -> Vec<f32> {
    t.data
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn i64s(t: &pb::Tensor) -> Vec<i64> {
    t.data
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn create_read_update_and_versions() {
    let store = VariableStore::new(0);
    let init = f32_tensor(&[2], &[1.0, 2.0]);
    assert!(!store.create("w", &view(&init), false).unwrap());
    let (value, version) = store.read("w").unwrap();
    assert_eq!((f32s(&value), version), (vec![1.0, 2.0], 0));
    assert_eq!(value.shape, vec![2]);

    let delta = f32_tensor(&[2], &[0.5, 0.5]);
    let (v1, after) = store.update("w", Op::Add, &view(&delta), true).unwrap();
    assert_eq!((v1, f32s(&after.unwrap())), (1, vec![1.5, 2.5]));
    let (v2, none) = store.update("w", Op::Sub, &view(&delta), false).unwrap();
    assert_eq!((v2, none), (2, None));
    store
        .update(
            "w",
            Op::Assign,
            &view(&f32_tensor(&[2], &[7.0, 8.0])),
            false,
        )
        .unwrap();
    assert_eq!(f32s(&store.read("w").unwrap().0), vec![7.0, 8.0]);
}

#[test]
fn mismatches_name_the_variable_and_both_types_and_change_nothing() {
    let store = VariableStore::new(3);
    store
        .create("w", &view(&f32_tensor(&[2], &[1.0, 2.0])), false)
        .unwrap();
    let wrong_dtype = i64_tensor(&[2], &[1, 1]);
    let e = store
        .update("w", Op::Add, &view(&wrong_dtype), false)
        .unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("assign_add")
            && text.contains("\"w\"")
            && text.contains("float32[2]")
            && text.contains("int64[2]")
            && text.contains("dtype float32"),
        "{text}"
    );
    assert_eq!(e.to_status().code(), tonic::Code::InvalidArgument);
    let wrong_shape = f32_tensor(&[3], &[1.0, 1.0, 1.0]);
    let text = store
        .update("w", Op::Assign, &view(&wrong_shape), false)
        .unwrap_err()
        .to_string();
    assert!(
        text.contains("float32[3]") && text.contains("shape [2]"),
        "{text}"
    );
    assert_eq!(store.read("w").unwrap(), (f32_tensor(&[2], &[1.0, 2.0]), 0));
}

#[test]
fn missing_existing_and_bad_names_are_refused() {
    let store = VariableStore::new(1);
    let e = store.read("nope").unwrap_err();
    assert_eq!(e.to_status().code(), tonic::Code::NotFound);
    assert!(e.to_string().contains("ps task 1") && e.to_string().contains("\"nope\""));
    let t = f32_tensor(&[], &[1.0]);
    store.create("s", &view(&t), false).unwrap();
    let e = store.create("s", &view(&t), false).unwrap_err();
    assert_eq!(e.to_status().code(), tonic::Code::AlreadyExists);
    assert!(e.to_string().contains("float32[]"), "{e}");
    assert!(store
        .create("s", &view(&f32_tensor(&[1], &[2.0])), true)
        .unwrap());
    assert_eq!(store.read("s").unwrap().0.shape, vec![1]);
    let e = store.create("", &view(&t), false).unwrap_err();
    assert!(e.to_string().contains("empty"), "{e}");
}

#[test]
fn scatter_add_accumulates_repeated_rows_and_checks_every_index_first() {
    let store = VariableStore::new(0);
    store
        .create("e", &view(&i64_tensor(&[3, 2], &[0; 6])), false)
        .unwrap();
    let updates = i64_tensor(&[3, 2], &[1, 2, 10, 20, 100, 200]);
    store
        .scatter_add("e", &[2, 0, 2], &view(&updates), false)
        .unwrap();
    assert_eq!(
        i64s(&store.read("e").unwrap().0),
        vec![10, 20, 0, 0, 101, 202]
    );

    let e = store
        .scatter_add("e", &[0, 3, 1], &view(&updates), false)
        .unwrap_err();
    assert!(
        e.to_string().contains("indices[1] = 3") && e.to_string().contains("< 3"),
        "{e}"
    );
    let e = store
        .scatter_add("e", &[-1, 0, 0], &view(&updates), false)
        .unwrap_err();
    assert!(e.to_string().contains("indices[0] = -1"), "{e}");
    let short = i64_tensor(&[2, 2], &[1, 1, 1, 1]);
    let e = store
        .scatter_add("e", &[0, 1, 2], &view(&short), false)
        .unwrap_err();
    assert!(e.to_string().contains("int64[3, 2]"), "{e}");
    // Nothing above changed the variable.
    assert_eq!(store.read("e").unwrap().1, 1);

    store
        .create("scalar", &view(&i64_tensor(&[], &[0])), false)
        .unwrap();
    let e = store
        .scatter_add("scalar", &[0], &view(&i64_tensor(&[1], &[1])), false)
        .unwrap_err();
    assert!(e.to_string().contains("scalar"), "{e}");
}

#[test]
fn assign_many_is_all_or_nothing() {
    let store = VariableStore::new(0);
    store
        .create("a", &view(&f32_tensor(&[1], &[1.0])), false)
        .unwrap();
    let new_a = f32_tensor(&[1], &[5.0]);
    let new_b = f32_tensor(&[2], &[6.0, 7.0]);
    let bad_a = f32_tensor(&[2], &[0.0, 0.0]);

    let items = vec![
        ("b".to_owned(), view(&new_b)),
        ("a".to_owned(), view(&bad_a)),
    ];
    assert!(store.assign_many(&items, true).is_err());
    assert!(store.read("b").is_err(), "nothing was created");

    let items = vec![
        ("a".to_owned(), view(&new_a)),
        ("b".to_owned(), view(&new_b)),
    ];
    let e = store.assign_many(&items, false).unwrap_err();
    assert_eq!(e.to_status().code(), tonic::Code::NotFound);
    assert_eq!(f32s(&store.read("a").unwrap().0), vec![1.0]);

    assert_eq!(store.assign_many(&items, true).unwrap(), (1, 1));
    assert_eq!(f32s(&store.read("a").unwrap().0), vec![5.0]);
    assert_eq!(f32s(&store.read("b").unwrap().0), vec![6.0, 7.0]);

    let twice = vec![
        ("a".to_owned(), view(&new_a)),
        ("a".to_owned(), view(&new_a)),
    ];
    assert!(store
        .assign_many(&twice, true)
        .unwrap_err()
        .to_string()
        .contains("twice"));
}

#[test]
fn list_read_many_and_delete() {
    let store = VariableStore::new(0);
    for name in ["b", "a", "c"] {
        store
            .create(name, &view(&f32_tensor(&[1], &[0.0])), false)
            .unwrap();
    }
    let names: Vec<String> = store.list().into_iter().map(|v| v.name).collect();
    assert_eq!(names, ["a", "b", "c"]);
    let all = store.read_many(&[]).unwrap();
    assert_eq!(all.len(), 3);
    assert_eq!(all[0].name, "a");
    let some = store.read_many(&["c".into(), "a".into()]).unwrap();
    assert_eq!(some[0].name, "c");
    assert!(store.read_many(&["zz".into()]).is_err());
    assert_eq!(store.usage(), (3, 12));
    assert_eq!(store.delete(&["a".into(), "zz".into()]), 1);
    assert_eq!(store.usage().0, 2);
}

#[test]
fn concurrent_assign_add_loses_no_update() {
    const THREADS: usize = 8;
    const ADDS: usize = 500;
    let store = Arc::new(VariableStore::new(0));
    store
        .create("n", &view(&i64_tensor(&[4], &[0; 4])), false)
        .unwrap();
    store
        .create("x", &view(&f32_tensor(&[1000], &[0.0; 1000])), false)
        .unwrap();
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                let one = i64_tensor(&[4], &[1, 1, 1, 1]);
                let ones = f32_tensor(&[1000], &[1.0; 1000]);
                for _ in 0..ADDS {
                    store.update("n", Op::Add, &view(&one), false).unwrap();
                    store.update("x", Op::Add, &view(&ones), false).unwrap();
                    // Reads in between must always see whole updates.
                    let (snapshot, _) = store.read("x").unwrap();
                    let values = f32s(&snapshot);
                    assert!(values.iter().all(|v| *v == values[0]), "torn read");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let total = (THREADS * ADDS) as i64;
    let (n, version) = store.read("n").unwrap();
    assert_eq!(i64s(&n), vec![total; 4]);
    assert_eq!(version, total as u64);
    assert!(f32s(&store.read("x").unwrap().0)
        .iter()
        .all(|v| *v == total as f32));
}
