//! Function payloads a worker holds, keyed by content hash.

use std::collections::HashMap;
use std::sync::{PoisonError, RwLock};

use bytes::Bytes;

use crate::rpc::{pb, HASH_LEN};

/// A registered function: what the executor needs to load it.
#[derive(Debug, Clone)]
pub struct StoredFunction {
    /// SHA-256 of `payload`.
    pub hash: [u8; HASH_LEN],
    /// How to load `payload`.
    pub kind: pb::FunctionKind,
    /// The serialized function.
    pub payload: Bytes,
}

/// Content-addressed function store. Payloads are immutable once stored, so a second
/// registration of the same hash is a no-op.
#[derive(Debug, Default)]
pub struct FunctionStore {
    functions: RwLock<HashMap<[u8; HASH_LEN], StoredFunction>>,
}

impl FunctionStore {
    /// Stores `function`; returns `true` if the hash was already held.
    pub fn insert(&self, function: StoredFunction) -> bool {
        let mut map = self
            .functions
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if map.contains_key(&function.hash) {
            return true;
        }
        map.insert(function.hash, function);
        false
    }

    /// The function stored under `hash`, if any.
    pub fn get(&self, hash: &[u8; HASH_LEN]) -> Option<StoredFunction> {
        self.functions
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(hash)
            .cloned()
    }

    /// How many distinct functions are held.
    pub fn len(&self) -> usize {
        self.functions
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether no function is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
