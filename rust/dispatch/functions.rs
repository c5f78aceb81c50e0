//! Function payloads known to the dispatcher, by content hash, and what each link has sent.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, OnceLock, PoisonError, RwLock};

use bytes::Bytes;

use super::DispatchError;
use crate::rpc::{content_hash, hex, pb, HASH_LEN};

/// A function's content hash (SHA-256 of its payload).
pub type FunctionHash = [u8; HASH_LEN];

/// How a worker loads a payload: the protocol's own enum, named by
/// [`crate::rpc::wire::codes::function_kind_name`].
pub use crate::rpc::pb::FunctionKind;

/// A registered function payload; shared by every closure and link that uses it.
#[derive(Debug)]
pub struct Function {
    hash: FunctionHash,
    hash_bytes: Bytes,
    kind: FunctionKind,
    payload: Bytes,
    /// What the user calls it (e.g. its `__qualname__`), for messages; set once.
    name: OnceLock<String>,
}

impl Function {
    /// The name given at registration, if any.
    pub fn name(&self) -> Option<&str> {
        self.name.get().map(String::as_str)
    }

    /// Records the name (the first one given wins; identical payloads are one function).
    pub(crate) fn set_name(&self, name: &str) {
        if !name.is_empty() {
            let _ = self.name.set(name.to_owned());
        }
    }

    /// The content hash.
    pub fn hash(&self) -> &FunctionHash {
        &self.hash
    }

    /// The hash as sent on the wire (a cheap clone).
    pub(crate) fn hash_bytes(&self) -> Bytes {
        self.hash_bytes.clone()
    }

    /// The `RegisterFunction` request that installs this function on a worker.
    pub(crate) fn register_request(&self) -> pb::RegisterFunctionRequest {
        pb::RegisterFunctionRequest {
            function_hash: self.hash_bytes.clone(),
            kind: self.kind.into(),
            payload: self.payload.clone(),
        }
    }
}

/// Every function registered with one dispatcher.
#[derive(Debug, Default)]
pub(crate) struct FunctionRegistry {
    functions: RwLock<HashMap<FunctionHash, Arc<Function>>>,
}

impl FunctionRegistry {
    /// Stores `payload` under `hash` after checking that `hash` is its SHA-256 digest, so
    /// a caller's hashing bug shows up here rather than as a worker's refusal later.
    /// Registering a hash again is a no-op.
    pub fn register(
        &self,
        hash: &[u8],
        kind: FunctionKind,
        payload: Bytes,
    ) -> Result<Arc<Function>, DispatchError> {
        let hash = parse_hash(hash)?;
        if let Some(known) = self.get(&hash) {
            return Ok(known);
        }
        let actual = content_hash(&payload);
        if actual != hash {
            return Err(DispatchError::InvalidArgument(format!(
                "register_function(): hash 0x{} is not the SHA-256 of the {}-byte payload \
                 (0x{}); pass hashlib.sha256(payload).digest()",
                hex(&hash),
                payload.len(),
                hex(&actual)
            )));
        }
        let function = Arc::new(Function {
            hash,
            hash_bytes: Bytes::copy_from_slice(&hash),
            kind,
            payload,
            name: OnceLock::new(),
        });
        let mut functions = self
            .functions
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        Ok(Arc::clone(functions.entry(hash).or_insert(function)))
    }

    /// The function registered under `hash`, if any.
    pub fn get(&self, hash: &FunctionHash) -> Option<Arc<Function>> {
        self.functions
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(hash)
            .cloned()
    }

    /// The function registered under `hash`, or an error naming the hash.
    pub fn lookup(&self, hash: &[u8], caller: &str) -> Result<Arc<Function>, DispatchError> {
        let hash = parse_hash(hash)?;
        self.get(&hash).ok_or_else(|| {
            DispatchError::InvalidArgument(format!(
                "{caller}: no function with hash 0x{} was registered with this dispatcher; \
                 call register_function(hash, kind, payload) first",
                hex(&hash)
            ))
        })
    }
}

/// Checks that `hash` is 32 bytes.
pub(crate) fn parse_hash(hash: &[u8]) -> Result<FunctionHash, DispatchError> {
    hash.try_into().map_err(|_| {
        DispatchError::InvalidArgument(format!(
            "a function hash is the 32-byte SHA-256 digest of its payload; got {} bytes",
            hash.len()
        ))
    })
}

/// The functions one worker holds, as far as its link knows: cleared when the worker
/// reconnects, since a restarted worker has lost them.
#[derive(Debug, Default)]
pub(crate) struct SentFunctions {
    sent: HashSet<FunctionHash>,
}

impl SentFunctions {
    /// Whether `hash` was sent to the worker since it last (re)connected.
    pub fn contains(&self, hash: &FunctionHash) -> bool {
        self.sent.contains(hash)
    }

    /// Records that the worker now holds `hash`.
    pub fn insert(&mut self, hash: FunctionHash) {
        self.sent.insert(hash);
    }

    /// Forgets `hash` (the worker said it does not hold it).
    pub fn remove(&mut self, hash: &FunctionHash) {
        self.sent.remove(hash);
    }

    /// Forgets everything (the worker reconnected).
    pub fn clear(&mut self) {
        self.sent.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registration_checks_the_hash_and_is_idempotent() {
        let registry = FunctionRegistry::default();
        let payload = Bytes::from_static(b"\x80\x05N.");
        let hash = content_hash(&payload);
        let first = registry
            .register(&hash, FunctionKind::Cloudpickle, payload.clone())
            .unwrap();
        let again = registry
            .register(&hash, FunctionKind::Cloudpickle, payload)
            .unwrap();
        assert!(Arc::ptr_eq(&first, &again));
        assert_eq!(
            first.register_request().kind,
            pb::FunctionKind::Cloudpickle as i32
        );

        let wrong = registry
            .register(&[7; 32], FunctionKind::JaxExport, Bytes::from_static(b"x"))
            .unwrap_err();
        assert!(wrong.to_string().contains("is not the SHA-256"), "{wrong}");
        let short = registry.lookup(&[1, 2], "schedule()").unwrap_err();
        assert!(short.to_string().contains("got 2 bytes"), "{short}");
        let unknown = registry.lookup(&[9; 32], "schedule()").unwrap_err();
        assert!(
            unknown.to_string().contains("register_function"),
            "{unknown}"
        );
    }
}
