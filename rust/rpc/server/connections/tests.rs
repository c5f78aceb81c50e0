use super::*;

#[test]
fn limits_outside_their_range_are_refused_naming_the_setting() {
    assert!(ServerLimits::default().validate().is_ok());
    let cases = [
        (
            ServerLimits {
                max_connections: 0,
                ..ServerLimits::default()
            },
            "max_connections=0",
        ),
        (
            ServerLimits {
                max_streams_per_connection: 0,
                ..ServerLimits::default()
            },
            "max_streams_per_connection=0",
        ),
        (
            ServerLimits {
                handshake_timeout: Duration::ZERO,
                ..ServerLimits::default()
            },
            "handshake_timeout=0",
        ),
    ];
    for (limits, needle) in cases {
        let error = limits.validate().unwrap_err();
        assert!(
            error.contains(needle) && error.contains("expected"),
            "{error}"
        );
    }
}

#[test]
fn the_file_limit_lowers_the_connection_bound() {
    assert_eq!(effective_max_connections(4096, None), 4096);
    let open = open_files().unwrap_or(RESERVED_FILES);
    let limit = 1000;
    let expected = (limit - RESERVED_FILES - open) as usize;
    assert_eq!(effective_max_connections(4096, Some(limit)), expected);
    assert_eq!(effective_max_connections(10, Some(limit)), 10);
    // Never zero, whatever the limit.
    assert_eq!(effective_max_connections(10, Some(1)), 1);
}

#[test]
fn a_full_server_evicts_the_oldest_unauthenticated_connection() {
    let stats = Arc::new(ConnectionStats::default());
    let admission = Admission::new(ServerLimits::default(), 3, Arc::clone(&stats));
    let a = admission.admit().unwrap();
    let b = admission.admit().unwrap();
    let c = admission.admit().unwrap();
    // a authenticated: b is the oldest still pending.
    a.authenticated.store(true, Ordering::Release);
    let d = admission.admit().unwrap();
    assert!(b.evicted.load(Ordering::Acquire));
    assert!(!a.evicted.load(Ordering::Acquire) && !c.evicted.load(Ordering::Acquire));
    assert!(!d.evicted.load(Ordering::Acquire));
    assert_eq!(stats.accepted.load(Ordering::Relaxed), 4);
    // b's task lets its slot go; with a, c, d open and c, d pending, c goes next.
    admission.release();
    c.authenticated.store(true, Ordering::Release);
    d.authenticated.store(true, Ordering::Release);
    assert!(
        admission.admit().is_none(),
        "every open connection authenticated"
    );
}

#[test]
fn an_eviction_wakes_the_waiting_connection() {
    struct Flag(AtomicBool);
    impl std::task::Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::Release);
        }
    }
    let flag = Arc::new(Flag(AtomicBool::new(false)));
    let state = ConnectionState::default();
    *state.lock_waker() = Some(Waker::from(Arc::clone(&flag)));
    state.evict();
    assert!(flag.0.load(Ordering::Acquire));
    assert!(state.evicted.load(Ordering::Acquire));
}
