//! How long a session's values live on a worker or ps: the one owner of that decision.
//!
//! A server holds values for each session that created them (see `rpc/wire/session.rs`).
//! They must go when nobody can use them any more, and not before:
//!
//! - **Clean end.** A coordinator's `shutdown()` (or a strategy's) calls `EndSession`: the
//!   session is released at once ([`SessionRegistry::end`]).
//! - **Vanished.** A session whose last connection closed without ending (a coordinator
//!   `SIGKILL`ed, its host gone; server-side HTTP/2 keepalive closes a silent peer's
//!   connection) is released `ttl` after that ([`SessionRegistry::sweep`], run every
//!   [`SWEEP_PERIOD`] by [`SessionRegistry::spawn_sweeper`]; `ttl` 0 releases it as its
//!   last connection closes). A connection that carries the session again before then
//!   (a restarted channel, a reconnect) keeps it.
//!
//! Releasing is the owner's job (the worker's executor drops Python values, the ps drops
//! variables), so the registry only decides *when*, through the release callback it is
//! made with, called with no lock held. The owner reports back what a session holds
//! ([`SessionRegistry::set_held`]) so `GetStatus` can show it. The anonymous session (calls
//! without the header: raw gRPC clients, coordinators that predate sessions) is never
//! tracked or released here, as before sessions existed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use crate::rpc::pb;
use crate::rpc::wire::session::SessionId;

/// How often the sweeper looks for vanished sessions past their ttl.
pub const SWEEP_PERIOD: Duration = Duration::from_millis(250);

/// Default time a vanished session's values are kept (`--state-ttl`).
pub const DEFAULT_TTL: Duration = Duration::from_secs(3600);

/// An id for one server connection, unique within the process (the registry only compares
/// them).
pub type ConnectionId = u64;

/// Why a session was released, for the owner's log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// Its coordinator ended it (`EndSession`).
    Ended,
    /// Its last connection closed `ttl` ago without ending it.
    Vanished,
}

impl Release {
    /// The reason in words.
    pub fn label(self) -> &'static str {
        match self {
            Self::Ended => "ended",
            Self::Vanished => "vanished",
        }
    }
}

/// What an owner reports a session holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Held {
    /// Values (resources, variables) held.
    pub values: u64,
    /// Bytes of their array leaves.
    pub bytes: u64,
    /// Whether any of them is named (can be re-attached by a later session).
    pub named: bool,
}

/// One session as `GetStatus` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionSnapshot {
    /// The session's id.
    pub id: SessionId,
    /// What its owner reported it holds.
    pub held: Held,
    /// Connections open now that carried it.
    pub connections: u32,
    /// Time since its last call.
    pub idle: Duration,
}

/// A session as `GetStatus` reports it, worker and ps alike: the one place that spells
/// `pb::SessionHeld`. `connections` and `idle` are the server's; `held` its owner's report.
pub fn session_held(
    id: &SessionId,
    held: Held,
    connections: u32,
    idle: Duration,
) -> pb::SessionHeld {
    pb::SessionHeld {
        id: id.as_str().to_owned(),
        resources: held.values,
        bytes: held.bytes,
        connections,
        idle_seconds: idle.as_secs_f64(),
        named: held.named,
    }
}

impl SessionSnapshot {
    /// This session as `GetStatus` reports it ([`session_held`]).
    pub fn to_proto(&self) -> pb::SessionHeld {
        session_held(&self.id, self.held, self.connections, self.idle)
    }
}

/// The callback that releases a session's values.
type ReleaseFn = dyn Fn(&SessionId, Release) + Send + Sync;

struct Entry {
    connections: HashSet<ConnectionId>,
    last_activity: Instant,
    /// When it was last left with no connection (or first seen without one).
    vanished_since: Option<Instant>,
    held: Held,
}

#[derive(Default)]
struct Inner {
    sessions: BTreeMap<SessionId, Entry>,
    /// The sessions each open connection carried.
    by_connection: HashMap<ConnectionId, HashSet<SessionId>>,
}

/// The sessions a server holds values for, and when to release them (see the module).
pub struct SessionRegistry {
    inner: Mutex<Inner>,
    ttl: Duration,
    release: Box<ReleaseFn>,
}

impl std::fmt::Debug for SessionRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionRegistry")
            .field("ttl", &self.ttl)
            .field("sessions", &self.lock().sessions.len())
            .finish_non_exhaustive()
    }
}

impl SessionRegistry {
    /// A registry keeping vanished sessions for `ttl`, releasing through `release`.
    pub fn new(
        ttl: Duration,
        release: impl Fn(&SessionId, Release) + Send + Sync + 'static,
    ) -> Self {
        Self {
            inner: Mutex::default(),
            ttl,
            release: Box::new(release),
        }
    }

    /// How long a vanished session is kept.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every update is a few map operations; a panic cannot leave them half done.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records a call of `session`, on `connection` when known. Returns `true` when the
    /// connection carries the session for the first time (its owner then arranges for
    /// [`SessionRegistry::connection_closed`] when it closes).
    pub fn touch(&self, session: &SessionId, connection: Option<ConnectionId>) -> bool {
        if session.is_anonymous() {
            return false;
        }
        let now = Instant::now();
        let mut inner = self.lock();
        let entry = inner
            .sessions
            .entry(session.clone())
            .or_insert_with(|| Entry {
                connections: HashSet::new(),
                last_activity: now,
                vanished_since: Some(now),
                held: Held::default(),
            });
        entry.last_activity = now;
        let Some(connection) = connection else {
            return false;
        };
        let added = entry.connections.insert(connection);
        entry.vanished_since = None;
        if added {
            inner
                .by_connection
                .entry(connection)
                .or_default()
                .insert(session.clone());
        }
        added
    }

    /// A connection closed: each session it carried that has no other connection left
    /// starts its ttl (or is released now when the ttl is 0).
    pub fn connection_closed(&self, connection: ConnectionId) {
        let now = Instant::now();
        let mut released = Vec::new();
        {
            let mut inner = self.lock();
            let Some(sessions) = inner.by_connection.remove(&connection) else {
                return;
            };
            for session in sessions {
                let Some(entry) = inner.sessions.get_mut(&session) else {
                    continue;
                };
                entry.connections.remove(&connection);
                if entry.connections.is_empty() {
                    entry.vanished_since = Some(now);
                    if self.ttl.is_zero() {
                        inner.sessions.remove(&session);
                        released.push(session);
                    }
                }
            }
        }
        for session in released {
            (self.release)(&session, Release::Vanished);
        }
    }

    /// Ends `session` cleanly: released at once. Returns whether it was tracked (the
    /// owner's values are released either way; the anonymous session is never released).
    pub fn end(&self, session: &SessionId) -> bool {
        if session.is_anonymous() {
            return false;
        }
        let tracked = {
            let mut inner = self.lock();
            let entry = inner.sessions.remove(session);
            if let Some(entry) = &entry {
                for connection in &entry.connections {
                    if let Some(set) = inner.by_connection.get_mut(connection) {
                        set.remove(session);
                    }
                }
            }
            entry.is_some()
        };
        (self.release)(session, Release::Ended);
        tracked
    }

    /// Records what `session` holds, as its owner counts it.
    pub fn set_held(&self, session: &SessionId, held: Held) {
        if session.is_anonymous() {
            return;
        }
        if let Some(entry) = self.lock().sessions.get_mut(session) {
            entry.held = held;
        }
    }

    /// Releases every session vanished for at least the ttl by `now`; returns them.
    pub fn sweep(&self, now: Instant) -> Vec<SessionId> {
        let expired: Vec<SessionId> = {
            let mut inner = self.lock();
            let expired: Vec<SessionId> = inner
                .sessions
                .iter()
                .filter(|(_, entry)| {
                    entry.connections.is_empty()
                        && entry
                            .vanished_since
                            .is_some_and(|since| now.saturating_duration_since(since) >= self.ttl)
                })
                .map(|(id, _)| id.clone())
                .collect();
            for id in &expired {
                inner.sessions.remove(id);
            }
            expired
        };
        for session in &expired {
            (self.release)(session, Release::Vanished);
        }
        expired
    }

    /// The sessions held now, by id.
    pub fn snapshot(&self) -> Vec<SessionSnapshot> {
        let now = Instant::now();
        self.lock()
            .sessions
            .iter()
            .map(|(id, entry)| SessionSnapshot {
                id: id.clone(),
                held: entry.held,
                connections: u32::try_from(entry.connections.len()).unwrap_or(u32::MAX),
                idle: now.saturating_duration_since(entry.last_activity),
            })
            .collect()
    }

    /// Sweeps every [`SWEEP_PERIOD`] on the current tokio runtime until the registry is
    /// dropped.
    pub fn spawn_sweeper(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let registry: Weak<Self> = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(SWEEP_PERIOD);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(registry) = registry.upgrade() else {
                    return;
                };
                // tokio's clock, so a test with paused time sees its sleeps.
                registry.sweep(tokio::time::Instant::now().into_std());
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Log = Arc<Mutex<Vec<(String, Release)>>>;

    fn registry(ttl: Duration) -> (Arc<SessionRegistry>, Log) {
        let log: Log = Arc::default();
        let seen = Arc::clone(&log);
        let registry = SessionRegistry::new(ttl, move |id, why| {
            seen.lock().unwrap().push((id.as_str().to_owned(), why));
        });
        (Arc::new(registry), log)
    }

    fn id(text: &str) -> SessionId {
        SessionId::new(text).unwrap()
    }

    #[test]
    fn a_clean_end_releases_at_once() {
        let (registry, log) = registry(Duration::from_secs(3600));
        assert!(registry.touch(&id("s1"), Some(1)));
        assert!(!registry.touch(&id("s1"), Some(1)));
        assert!(registry.end(&id("s1")));
        assert_eq!(*log.lock().unwrap(), [("s1".to_owned(), Release::Ended)]);
        assert!(registry.snapshot().is_empty());
        // Its connection closing afterwards releases nothing more.
        registry.connection_closed(1);
        assert_eq!(log.lock().unwrap().len(), 1);
    }

    #[test]
    fn a_vanished_session_is_released_after_the_ttl_and_not_before() {
        let ttl = Duration::from_secs(10);
        let (registry, log) = registry(ttl);
        registry.touch(&id("s1"), Some(1));
        registry.touch(&id("s1"), Some(2));
        registry.touch(&id("s2"), Some(2));
        registry.connection_closed(1);
        let later = Instant::now() + ttl * 2;
        // s1 still has connection 2.
        assert!(registry.sweep(later).is_empty());
        registry.connection_closed(2);
        assert!(registry.sweep(Instant::now()).is_empty());
        assert!(log.lock().unwrap().is_empty());
        let mut swept = registry.sweep(Instant::now() + ttl + Duration::from_millis(1));
        swept.sort();
        assert_eq!(swept, [id("s1"), id("s2")]);
        assert_eq!(log.lock().unwrap().len(), 2);
        assert!(log
            .lock()
            .unwrap()
            .iter()
            .all(|(_, why)| *why == Release::Vanished));
    }

    #[test]
    fn reconnecting_before_the_ttl_keeps_the_session() {
        let ttl = Duration::from_secs(10);
        let (registry, log) = registry(ttl);
        registry.touch(&id("s1"), Some(1));
        registry.connection_closed(1);
        assert!(registry.touch(&id("s1"), Some(3)));
        assert!(registry.sweep(Instant::now() + ttl * 2).is_empty());
        assert!(log.lock().unwrap().is_empty());
        assert_eq!(registry.snapshot()[0].connections, 1);
    }

    #[test]
    fn ttl_zero_releases_as_the_last_connection_closes() {
        let (registry, log) = registry(Duration::ZERO);
        registry.touch(&id("s1"), Some(1));
        registry.touch(&id("s1"), Some(2));
        registry.connection_closed(1);
        assert!(log.lock().unwrap().is_empty());
        registry.connection_closed(2);
        assert_eq!(*log.lock().unwrap(), [("s1".to_owned(), Release::Vanished)]);
    }

    #[test]
    fn the_anonymous_session_is_never_tracked_or_released() {
        let (registry, log) = registry(Duration::ZERO);
        assert!(!registry.touch(&SessionId::anonymous(), Some(1)));
        registry.connection_closed(1);
        assert!(!registry.end(&SessionId::anonymous()));
        assert!(registry
            .sweep(Instant::now() + Duration::from_secs(1))
            .is_empty());
        assert!(log.lock().unwrap().is_empty());
        assert!(registry.snapshot().is_empty());
    }

    #[test]
    fn the_snapshot_shows_what_the_owner_reported() {
        let (registry, _log) = registry(Duration::from_secs(1));
        registry.touch(&id("s1"), Some(1));
        let held = Held {
            values: 2,
            bytes: 4096,
            named: true,
        };
        registry.set_held(&id("s1"), held);
        let snapshot = registry.snapshot();
        assert_eq!(snapshot.len(), 1);
        assert_eq!(snapshot[0].id, id("s1"));
        assert_eq!(snapshot[0].held, held);
        assert_eq!(snapshot[0].connections, 1);
        assert!(snapshot[0].idle < Duration::from_secs(60));
    }

    #[test]
    fn a_session_seen_without_a_connection_ages_from_its_first_call() {
        let ttl = Duration::from_secs(5);
        let (registry, _log) = registry(ttl);
        registry.touch(&id("s1"), None);
        assert!(registry.sweep(Instant::now()).is_empty());
        assert_eq!(registry.sweep(Instant::now() + ttl * 2), [id("s1")]);
    }

    #[tokio::test]
    async fn the_sweeper_releases_on_the_runtime() {
        let (registry, log) = registry(Duration::from_millis(20));
        registry.touch(&id("s1"), Some(1));
        registry.connection_closed(1);
        let sweeper = registry.spawn_sweeper();
        let deadline = Instant::now() + Duration::from_secs(10);
        while log.lock().unwrap().is_empty() {
            assert!(Instant::now() < deadline, "the sweeper never released s1");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(*log.lock().unwrap(), [("s1".to_owned(), Release::Vanished)]);
        drop(registry);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !sweeper.is_finished() {
            assert!(
                Instant::now() < deadline,
                "the sweeper outlived its registry"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
