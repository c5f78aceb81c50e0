//! Sessions: which coordinator (or strategy) a call comes from.
//!
//! A worker or ps is shared by every coordinator that holds the token: a sidecar
//! evaluator beside its trainer, two jobs sharing a worker pool, a restarted coordinator
//! whose predecessor is still half-alive. What each creates there (per-worker values,
//! datasets, device state, variables) must be its own, so every call carries its
//! session's id in the `jaxcluster-session` metadata, beside the token, and servers key
//! what a call creates by (session, id). A call without the header belongs to the
//! anonymous session (the empty id): raw gRPC clients and tools that predate sessions
//! share it with each other and with nobody else.
//!
//! The id travels as metadata rather than a field of each message so that every RPC,
//! unary or streamed, carries it the same way without a protocol change per message.

use std::fmt;
use std::sync::Arc;

use tonic::metadata::MetadataMap;
use tonic::Status;

/// The metadata key carrying the session id.
pub const SESSION: &str = "jaxcluster-session";

/// Longest session id accepted, in characters.
pub const MAX_SESSION_LEN: usize = 64;

/// A session's id: 1 to [`MAX_SESSION_LEN`] ASCII letters, digits, `-` or `_` (coordinators
/// make 32 random hex digits), or empty for the anonymous session. Cheap to clone.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct SessionId(Arc<str>);

impl SessionId {
    /// Validates `id`; the error says what was wrong and what was expected.
    pub fn new(id: &str) -> Result<Self, String> {
        if id.len() > MAX_SESSION_LEN {
            return Err(format!(
                "session id {id:?} has {} characters; expected at most {MAX_SESSION_LEN}",
                id.len()
            ));
        }
        if let Some(bad) = id
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_'))
        {
            return Err(format!(
                "session id {id:?} contains {bad:?}; expected ASCII letters, digits, '-' or \
                 '_' (e.g. 32 hex digits)"
            ));
        }
        Ok(Self(Arc::from(id)))
    }

    /// The anonymous session: calls that carry no session header.
    pub fn anonymous() -> Self {
        Self::default()
    }

    /// Whether this is the anonymous session.
    pub fn is_anonymous(&self) -> bool {
        self.0.is_empty()
    }

    /// The id as sent.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The session a call belongs to, from its metadata: the anonymous session when the
    /// header is absent, `INVALID_ARGUMENT` when it is malformed.
    pub fn from_metadata(metadata: &MetadataMap) -> Result<Self, Status> {
        let Some(value) = metadata.get(SESSION) else {
            return Ok(Self::anonymous());
        };
        let text = value.to_str().map_err(|_| {
            Status::invalid_argument(format!(
                "the '{SESSION}' metadata is not ASCII; expected a session id of ASCII \
                 letters, digits, '-' or '_'"
            ))
        })?;
        Self::new(text).map_err(|e| Status::invalid_argument(format!("'{SESSION}': {e}")))
    }
}

impl fmt::Debug for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SessionId({:?})", &*self.0)
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_anonymous() {
            f.write_str("<anonymous>")
        } else {
            f.write_str(&self.0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_ids_round_trip_and_bad_ones_say_why() {
        let id = SessionId::new("0123abcdEF-_").unwrap();
        assert_eq!(id.as_str(), "0123abcdEF-_");
        assert!(!id.is_anonymous());
        assert!(SessionId::new("").unwrap().is_anonymous());
        let e = SessionId::new("a b").unwrap_err();
        assert!(e.contains("' '") && e.contains("expected"), "{e}");
        let e = SessionId::new(&"a".repeat(MAX_SESSION_LEN + 1)).unwrap_err();
        assert!(e.contains("at most 64"), "{e}");
    }

    #[test]
    fn metadata_without_the_header_is_the_anonymous_session() {
        let mut metadata = MetadataMap::new();
        assert!(SessionId::from_metadata(&metadata).unwrap().is_anonymous());
        metadata.insert(SESSION, "s1".parse().unwrap());
        assert_eq!(SessionId::from_metadata(&metadata).unwrap().as_str(), "s1");
        metadata.insert(SESSION, "s/1".parse().unwrap());
        let e = SessionId::from_metadata(&metadata).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().contains(SESSION), "{}", e.message());
    }
}
