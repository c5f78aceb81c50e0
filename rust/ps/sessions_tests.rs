use super::*;
use crate::ps::tensor::TensorView;

fn session(id: &str) -> SessionId {
    SessionId::new(id).unwrap()
}

fn f32_view(data: &[u8]) -> TensorView<'_> {
    TensorView {
        dtype: DType::F32,
        shape: vec![1],
        data,
    }
}

/// The first element's bits (exact comparison without float equality).
fn value(room: &Room, name: &str) -> u32 {
    let (tensor, _) = room.store.read(name).unwrap();
    f32::from_le_bytes(tensor.data[..4].try_into().unwrap()).to_bits()
}

#[test]
fn sessions_never_see_each_others_variables() {
    let sessions = PsSessions::new(0);
    let (a, b) = (session("a"), session("b"));
    let one = 1f32.to_le_bytes();
    let two = 2f32.to_le_bytes();
    sessions
        .room(&a)
        .store
        .create("w", &f32_view(&one), true)
        .unwrap();
    sessions
        .room(&b)
        .store
        .create("w", &f32_view(&two), true)
        .unwrap();
    assert_eq!(value(&sessions.room(&a), "w"), 1f32.to_bits());
    assert_eq!(value(&sessions.room(&b), "w"), 2f32.to_bits());
    let anonymous = sessions.room(&SessionId::anonymous());
    assert!(matches!(
        anonymous.store.read("w"),
        Err(StoreError::NotFound { .. })
    ));
    assert_eq!(sessions.usage(), (2, 8));
    let held = sessions.held();
    let ids: Vec<&str> = held.iter().map(|h| h.session.as_str()).collect();
    assert_eq!(ids, ["", "a", "b"]);
    assert_eq!((held[1].variables, held[1].bytes), (1, 4));
}

#[test]
fn ending_a_session_releases_only_its_variables() {
    let sessions = PsSessions::new(0);
    let (a, b) = (session("a"), session("b"));
    let one = 1f32.to_le_bytes();
    for s in [&a, &b] {
        sessions
            .room(s)
            .store
            .create("w", &f32_view(&one), true)
            .unwrap();
    }
    assert_eq!(sessions.end(&a), (1, 4));
    assert_eq!(sessions.end(&a), (0, 0));
    assert_eq!(value(&sessions.room(&b), "w"), 1f32.to_bits());
    assert_eq!(sessions.usage(), (1, 4));
}

#[test]
fn reattach_moves_a_variable_and_its_slots_from_another_session() {
    let sessions = PsSessions::new(3);
    let (old, new, other) = (session("old"), session("new"), session("other"));
    let five = 5f32.to_le_bytes();
    let room = sessions.room(&old);
    room.store.create("w", &f32_view(&five), true).unwrap();
    room.store
        .create("w/Adam/m", &f32_view(&five), true)
        .unwrap();
    room.store.create("w/part", &f32_view(&five), true).unwrap();
    room.store
        .create("wx/Adam/m", &f32_view(&five), true)
        .unwrap();
    sessions
        .room(&other)
        .store
        .create("v", &f32_view(&five), true)
        .unwrap();

    let found = sessions
        .reattach(&new, "w", DType::F32, &[1], |_| false)
        .unwrap()
        .unwrap();
    assert_eq!(found.from, Some(old.clone()));
    assert_eq!(found.slots, ["w/Adam/m"]);
    let mine = sessions.room(&new);
    assert_eq!(value(&mine, "w"), 5f32.to_bits());
    assert_eq!(value(&mine, "w/Adam/m"), 5f32.to_bits());
    // The predecessor lost them; what was not the variable's stayed.
    let theirs = sessions.room(&old);
    assert!(theirs.store.read("w").is_err());
    assert_eq!(value(&theirs, "w/part"), 5f32.to_bits());
    assert_eq!(value(&theirs, "wx/Adam/m"), 5f32.to_bits());
    // Asking again finds it in the caller's own session.
    let again = sessions
        .reattach(&new, "w", DType::F32, &[1], |_| false)
        .unwrap()
        .unwrap();
    assert_eq!(again.from, None);
    // Nobody holds "u".
    assert!(sessions
        .reattach(&new, "u", DType::F32, &[1], |_| false)
        .unwrap()
        .is_none());
}

#[test]
fn reattach_refuses_another_shape_naming_both_and_moves_nothing() {
    let sessions = PsSessions::new(1);
    let (old, new) = (session("old"), session("new"));
    let five = 5f32.to_le_bytes();
    sessions
        .room(&old)
        .store
        .create("w", &f32_view(&five), true)
        .unwrap();
    let error = sessions
        .reattach(&new, "w", DType::F32, &[2, 3], |_| false)
        .unwrap_err();
    let message = error.to_string();
    assert!(
        message.contains("float32[1]") && message.contains("float32[2, 3]"),
        "{message}"
    );
    assert_eq!(error.to_status().code(), tonic::Code::FailedPrecondition);
    assert_eq!(value(&sessions.room(&old), "w"), 5f32.to_bits());
}

#[test]
fn reattach_prefers_the_sessions_the_caller_prefers() {
    let sessions = PsSessions::new(0);
    let (live, gone, new) = (session("live"), session("gone"), session("new"));
    let (one, two) = (1f32.to_le_bytes(), 2f32.to_le_bytes());
    sessions
        .room(&gone)
        .store
        .create("w", &f32_view(&two), true)
        .unwrap();
    // `live` called last, so without a preference it would be searched first.
    sessions
        .room(&live)
        .store
        .create("w", &f32_view(&one), true)
        .unwrap();
    let found = sessions
        .reattach(&new, "w", DType::F32, &[1], |id| id == &gone)
        .unwrap()
        .unwrap();
    assert_eq!(found.from, Some(gone));
    assert_eq!(value(&sessions.room(&new), "w"), 2f32.to_bits());
    assert_eq!(value(&sessions.room(&live), "w"), 1f32.to_bits());
}
