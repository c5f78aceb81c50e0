//! The ps's sessions: every `ParameterServerStrategy` keeps its variables in a store of
//! its own.
//!
//! A ps is shared by every program holding its token: a trainer and its sidecar evaluator,
//! two jobs, a restarted trainer whose predecessor is half-alive. Each of them names its
//! variables `w`, `dense/kernel`...; keyed by name alone, the last creator's value would be
//! everyone's. So each call's session (the `jaxcluster-session` header, see
//! [`crate::rpc::wire::session`]) picks a [`VariableStore`] of its own, and nothing a call
//! can name reaches another session's. Slots and step counts live in their variable's
//! store, so they belong to the same session.
//!
//! **Adoption.** The one way across: [`PsSessions::reattach`] moves a live variable (with
//! its slots and step counts) from another session into the caller's, so a restarted
//! trainer continues from its predecessor's values. The predecessor loses it.
//!
//! **Locking.** The session map has its own `RwLock`, held only to find or add a store;
//! a store's own locks are taken after it is released, so no call holds both.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use super::dtype::DType;
use super::store::{StoreError, Variable, VariableStore};
use super::tensor::describe;
use crate::rpc::wire::session::SessionId;

/// One session's variables and when it last called.
pub struct Room {
    /// The session's variables, slots and step counts.
    pub store: VariableStore,
    last_call: Mutex<Instant>,
}

impl Room {
    fn new(ps_index: i64) -> Self {
        Self {
            store: VariableStore::new(ps_index),
            last_call: Mutex::new(Instant::now()),
        }
    }

    fn touch(&self) {
        *self
            .last_call
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Instant::now();
    }

    /// How long since the session's last call.
    pub fn idle(&self) -> Duration {
        self.last_call
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .elapsed()
    }
}

/// What one session holds, for `GetStatus`.
#[derive(Debug, Clone, PartialEq)]
pub struct Held {
    /// The session.
    pub session: SessionId,
    /// Variables held, slots and step counts included.
    pub variables: usize,
    /// Bytes of their data.
    pub bytes: usize,
    /// Time since the session's last call.
    pub idle: Duration,
}

/// What [`PsSessions::reattach`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reattached {
    /// The session the variable came from; `None` when the caller's own session held it.
    pub from: Option<SessionId>,
    /// The slots and step counts that came with it, sorted.
    pub slots: Vec<String>,
}

/// Every session's store on one ps task.
pub struct PsSessions {
    ps_index: i64,
    rooms: RwLock<HashMap<SessionId, Arc<Room>>>,
}

impl PsSessions {
    /// No sessions yet, for ps task `ps_index` (used in messages).
    pub fn new(ps_index: i64) -> Self {
        Self {
            ps_index,
            rooms: RwLock::default(),
        }
    }

    /// The store of `session` (made empty on its first call), its last call set to now.
    pub fn room(&self, session: &SessionId) -> Arc<Room> {
        let found = self
            .rooms
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(session)
            .cloned();
        let room = found.unwrap_or_else(|| {
            let mut rooms = self.rooms.write().unwrap_or_else(PoisonError::into_inner);
            Arc::clone(
                rooms
                    .entry(session.clone())
                    .or_insert_with(|| Arc::new(Room::new(self.ps_index))),
            )
        });
        room.touch();
        room
    }

    /// Releases everything `session` holds; returns the variables and bytes released.
    pub fn end(&self, session: &SessionId) -> (usize, usize) {
        let room = self
            .rooms
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(session);
        room.map_or((0, 0), |room| room.store.usage())
    }

    fn rooms(&self) -> Vec<(SessionId, Arc<Room>)> {
        let rooms = self.rooms.read().unwrap_or_else(PoisonError::into_inner);
        rooms
            .iter()
            .map(|(id, room)| (id.clone(), Arc::clone(room)))
            .collect()
    }

    /// Variables and bytes held by every session together.
    pub fn usage(&self) -> (usize, usize) {
        self.rooms()
            .iter()
            .map(|(_, room)| room.store.usage())
            .fold((0, 0), |(v, b), (rv, rb)| (v + rv, b + rb))
    }

    /// Every session's holdings, sorted by session id.
    pub fn held(&self) -> Vec<Held> {
        let mut held: Vec<Held> = self
            .rooms()
            .into_iter()
            .map(|(session, room)| {
                let (variables, bytes) = room.store.usage();
                Held {
                    session,
                    variables,
                    bytes,
                    idle: room.idle(),
                }
            })
            .collect();
        held.sort_by(|a, b| a.session.cmp(&b.session));
        held
    }

    /// Finds `name` with `dtype` and `shape` for `session`: in its own store, else in
    /// another session's, whose variable (with its slots and step counts) then moves to
    /// `session`. Other sessions are searched in `prefer` order (the caller's choice, e.g.
    /// vanished sessions first), then most recently active first. `Ok(None)`: no session
    /// holds it. A variable of that name with another dtype or shape is refused, naming
    /// both, and stays where it is.
    pub fn reattach(
        &self,
        session: &SessionId,
        name: &str,
        dtype: DType,
        shape: &[usize],
        prefer: impl Fn(&SessionId) -> bool,
    ) -> Result<Option<Reattached>, StoreError> {
        let mine = self.room(session);
        let check = |variable: &Variable| {
            if variable.is(dtype, shape) {
                return Ok(());
            }
            Err(StoreError::ReattachMismatch {
                ps_index: self.ps_index,
                name: name.to_owned(),
                live: variable.describe(),
                asked: describe(dtype, shape),
            })
        };
        if let Some(family) = mine.store.take_family(name, check)? {
            let slots = slot_names(&family, name);
            mine.store.adopt(family);
            return Ok(Some(Reattached { from: None, slots }));
        }
        let mut others: Vec<(SessionId, Arc<Room>)> = self
            .rooms()
            .into_iter()
            .filter(|(id, _)| id != session)
            .collect();
        others.sort_by_key(|(id, room)| (!prefer(id), room.idle()));
        for (id, room) in others {
            if let Some(family) = room.store.take_family(name, check)? {
                let slots = slot_names(&family, name);
                mine.store.adopt(family);
                return Ok(Some(Reattached {
                    from: Some(id),
                    slots,
                }));
            }
        }
        Ok(None)
    }
}

fn slot_names(family: &[(String, Arc<Variable>)], name: &str) -> Vec<String> {
    let mut slots: Vec<String> = family
        .iter()
        .map(|(key, _)| key.clone())
        .filter(|key| key != name)
        .collect();
    slots.sort();
    slots
}

#[cfg(test)]
#[path = "sessions_tests.rs"]
mod tests;
