//! Function payloads a worker holds, keyed by content hash, within a byte budget.
//!
//! Every distinct payload a coordinator registers used to stay for the process's life, so
//! a client registering distinct payloads grew the worker without bound. The store keeps
//! at most [`FunctionStore::max_bytes`] of payloads (and [`MAX_FUNCTIONS`] entries) and
//! evicts the least recently used when a new one needs room. An evicted function costs a
//! coordinator one more `RegisterFunction`: a closure of it is refused `NOT_FOUND`, the
//! dispatcher's link sees the worker is the same process, registers the payload again and
//! resends the closure (`link/answers.rs`). A job that already took a function holds its
//! own reference to the payload, so eviction never pulls it from under a running closure.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{PoisonError, RwLock};

use bytes::Bytes;
use tonic::Status;

use crate::rpc::{pb, HASH_LEN};

/// Default budget for payloads held: 1 GiB.
pub const DEFAULT_MAX_FUNCTION_BYTES: usize = 1024 * 1024 * 1024;
/// Most functions held whatever their size, so tiny payloads cannot grow the map without
/// bound either.
pub const MAX_FUNCTIONS: usize = 65_536;

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

#[derive(Debug)]
struct Entry {
    function: StoredFunction,
    /// Tick of the last registration or lookup; the smallest is evicted first.
    used: AtomicU64,
}

#[derive(Debug, Default)]
struct Held {
    functions: HashMap<[u8; HASH_LEN], Entry>,
    bytes: usize,
}

/// Content-addressed function store. Payloads are immutable once stored, so a second
/// registration of the same hash is a no-op.
#[derive(Debug)]
pub struct FunctionStore {
    held: RwLock<Held>,
    clock: AtomicU64,
    max_bytes: usize,
    evicted: AtomicU64,
}

impl Default for FunctionStore {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_FUNCTION_BYTES)
    }
}

impl FunctionStore {
    /// A store holding at most `max_bytes` of payloads.
    pub fn new(max_bytes: usize) -> Self {
        Self {
            held: RwLock::new(Held::default()),
            clock: AtomicU64::new(0),
            max_bytes: max_bytes.max(1),
            evicted: AtomicU64::new(0),
        }
    }

    /// The byte budget.
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::Relaxed)
    }

    /// Stores `function`, evicting the least recently used ones if it needs room; returns
    /// `true` if the hash was already held. A payload larger than the whole budget is
    /// refused `RESOURCE_EXHAUSTED`.
    pub fn insert(&self, function: StoredFunction) -> Result<bool, Status> {
        let size = function.payload.len();
        if size > self.max_bytes {
            return Err(Status::resource_exhausted(format!(
                "the function payload is {size} bytes, more than this worker keeps for all \
                 registered functions ({} bytes); raise --max-function-bytes on the worker \
                 or capture less data in the function (pass large values as arguments)",
                self.max_bytes
            )));
        }
        let tick = self.tick();
        let mut held = self.held.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = held.functions.get(&function.hash) {
            entry.used.store(tick, Ordering::Relaxed);
            return Ok(true);
        }
        while held.bytes + size > self.max_bytes || held.functions.len() >= MAX_FUNCTIONS {
            let Some(oldest) = held
                .functions
                .iter()
                .min_by_key(|(_, entry)| entry.used.load(Ordering::Relaxed))
                .map(|(hash, _)| *hash)
            else {
                break;
            };
            if let Some(entry) = held.functions.remove(&oldest) {
                held.bytes -= entry.function.payload.len();
                self.evicted.fetch_add(1, Ordering::Relaxed);
            }
        }
        held.bytes += size;
        held.functions.insert(
            function.hash,
            Entry {
                function,
                used: AtomicU64::new(tick),
            },
        );
        Ok(false)
    }

    /// The function stored under `hash`, if any.
    pub fn get(&self, hash: &[u8; HASH_LEN]) -> Option<StoredFunction> {
        let tick = self.tick();
        let held = self.held.read().unwrap_or_else(PoisonError::into_inner);
        let entry = held.functions.get(hash)?;
        entry.used.store(tick, Ordering::Relaxed);
        Some(entry.function.clone())
    }

    /// How many distinct functions are held.
    pub fn len(&self) -> usize {
        self.held
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .functions
            .len()
    }

    /// Whether no function is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of payload held.
    pub fn bytes(&self) -> usize {
        self.held
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .bytes
    }

    /// Functions evicted to make room so far.
    pub fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn function(byte: u8, size: usize) -> StoredFunction {
        StoredFunction {
            hash: [byte; HASH_LEN],
            kind: pb::FunctionKind::Cloudpickle,
            payload: Bytes::from(vec![byte; size]),
        }
    }

    #[test]
    fn the_least_recently_used_function_makes_room() {
        let store = FunctionStore::new(300);
        assert!(!store.insert(function(1, 100)).unwrap());
        assert!(!store.insert(function(2, 100)).unwrap());
        assert!(!store.insert(function(3, 100)).unwrap());
        assert!(store.get(&[1; HASH_LEN]).is_some()); // 2 is now the least recently used
        assert!(!store.insert(function(4, 100)).unwrap());
        assert!(store.get(&[2; HASH_LEN]).is_none());
        assert!(store.get(&[1; HASH_LEN]).is_some());
        assert_eq!((store.len(), store.bytes(), store.evicted()), (3, 300, 1));
        // A payload needing two slots evicts two.
        assert!(!store.insert(function(5, 200)).unwrap());
        assert_eq!((store.len(), store.bytes(), store.evicted()), (2, 300, 3));
    }

    #[test]
    fn registering_again_is_a_no_op_and_refreshes() {
        let store = FunctionStore::new(200);
        store.insert(function(1, 100)).unwrap();
        store.insert(function(2, 100)).unwrap();
        assert!(store.insert(function(1, 100)).unwrap());
        store.insert(function(3, 100)).unwrap();
        assert!(store.get(&[1; HASH_LEN]).is_some());
        assert!(store.get(&[2; HASH_LEN]).is_none());
    }

    #[test]
    fn a_payload_over_the_budget_is_refused_naming_the_sizes() {
        let store = FunctionStore::new(10);
        let status = store.insert(function(1, 11)).unwrap_err();
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert!(
            status.message().contains("11 bytes"),
            "{}",
            status.message()
        );
        assert!(status.message().contains("--max-function-bytes"));
        assert!(store.is_empty());
    }

    #[test]
    fn a_taken_function_outlives_its_eviction() {
        let store = FunctionStore::new(100);
        store.insert(function(1, 100)).unwrap();
        let taken = store.get(&[1; HASH_LEN]).unwrap();
        store.insert(function(2, 100)).unwrap();
        assert!(store.get(&[1; HASH_LEN]).is_none());
        assert_eq!(taken.payload.len(), 100);
    }
}
