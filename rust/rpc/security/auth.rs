//! Bearer-token authentication: the server-side check and the client-side headers.
//!
//! Every RPC carries `authorization: Bearer <token>`. The server compares SHA-256 digests
//! of the expected and received header values with a constant-time comparison, so neither
//! the token's bytes nor its length leak through timing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::{Request, Status};

use crate::rpc::content_hash;

/// The metadata key carrying the token.
pub const AUTHORIZATION: &str = "authorization";

/// Checks that `token` can travel in a header: non-empty visible ASCII without spaces.
pub fn validate_token(token: &str) -> Result<(), String> {
    if token.is_empty() {
        return Err("the auth token is empty; expected a non-empty string".to_owned());
    }
    if let Some(bad) = token.chars().find(|c| !c.is_ascii_graphic()) {
        return Err(format!(
            "the auth token contains {bad:?}; expected visible ASCII characters only \
             (no spaces or control characters), e.g. a hex or base64 string"
        ));
    }
    Ok(())
}

/// Compares two byte strings in time that depends only on their lengths.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Server-side interceptor: rejects a request whose token is missing or wrong with
/// `UNAUTHENTICATED` before its body is decoded, so nothing about it runs. A request that
/// passes marks its connection authenticated, which exempts it from the handshake timeout
/// (see `connections.rs`).
#[derive(Clone)]
pub struct AuthCheck {
    /// SHA-256 of the expected `authorization` value; `None` accepts every request.
    expected: Option<[u8; 32]>,
    rejected: Arc<AtomicU64>,
}

impl AuthCheck {
    /// A check for `token` (`None`: no authentication); refusals are counted in `rejected`.
    pub fn new(token: Option<&str>, rejected: Arc<AtomicU64>) -> Self {
        Self {
            expected: token.map(|t| content_hash(format!("Bearer {t}").as_bytes())),
            rejected,
        }
    }

    fn refuse(&self, request: &Request<()>, message: &str) -> Status {
        let before = self.rejected.fetch_add(1, Ordering::Relaxed);
        let peer = request
            .remote_addr()
            .or_else(|| crate::rpc::server::connections::remote_addr(request.extensions()))
            .map_or_else(|| "an unknown peer".to_owned(), |peer| peer.to_string());
        // The first refusal is a warning (a misconfigured coordinator, or someone probing
        // the port); the rest are counted in GetStatus and logged at DEBUG, so a flood
        // cannot flood the log.
        if before == 0 {
            tracing::warn!(
                target: crate::log_target::AUTH,
                peer = peer.as_str(),
                "refused a request from {peer}: {message} (further refusals are logged at \
                 DEBUG and counted as unauthenticated_requests)",
            );
        } else {
            tracing::debug!(
                target: crate::log_target::AUTH,
                peer = peer.as_str(),
                "refused a request from {peer}: {message}",
            );
        }
        Status::unauthenticated(message)
    }
}

impl Interceptor for AuthCheck {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(expected) = &self.expected else {
            crate::rpc::server::connections::mark_authenticated(request.extensions());
            return Ok(request);
        };
        let Some(value) = request.metadata().get(AUTHORIZATION) else {
            return Err(self.refuse(
                &request,
                "this worker requires a token: send metadata 'authorization: Bearer <token>' \
                 (the coordinator takes auth_token= or JAXCLUSTER_AUTH_TOKEN)",
            ));
        };
        if constant_time_eq(&content_hash(value.as_bytes()), expected) {
            crate::rpc::server::connections::mark_authenticated(request.extensions());
            Ok(request)
        } else {
            Err(self.refuse(
                &request,
                "the 'authorization' metadata does not carry this worker's token; expected \
                 'Bearer <token>' with the token the worker was started with",
            ))
        }
    }
}

/// The `authorization` value for `token`, validated: what [`CallHeaders`] sends.
pub fn bearer_value(token: &str) -> Result<MetadataValue<Ascii>, String> {
    validate_token(token)?;
    format!("Bearer {token}")
        .parse()
        .map_err(|e| format!("the auth token is not a valid header value: {e}"))
}

/// Client-side interceptor: adds `authorization: Bearer <token>` and the caller's
/// session (`jaxcluster-session`, see [`crate::rpc::wire::session`]) to every request.
#[derive(Clone, Default)]
pub struct CallHeaders {
    authorization: Option<MetadataValue<Ascii>>,
    session: Option<MetadataValue<Ascii>>,
}

impl CallHeaders {
    /// Headers for `token` (`None`: no `authorization`) and `session` (`None` or empty:
    /// the anonymous session, no header).
    pub fn new(token: Option<&str>, session: Option<&str>) -> Result<Self, String> {
        let authorization = token.map(bearer_value).transpose()?;
        let session = match session {
            None | Some("") => None,
            Some(id) => {
                crate::rpc::wire::session::SessionId::new(id)?;
                Some(id.parse().map_err(|e| format!("session id {id:?}: {e}"))?)
            }
        };
        Ok(Self {
            authorization,
            session,
        })
    }
}

impl Interceptor for CallHeaders {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(value) = &self.authorization {
            request.metadata_mut().insert(AUTHORIZATION, value.clone());
        }
        if let Some(value) = &self.session {
            request
                .metadata_mut()
                .insert(crate::rpc::wire::session::SESSION, value.clone());
        }
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request_with(header: Option<&str>) -> Request<()> {
        let mut request = Request::new(());
        if let Some(h) = header {
            request
                .metadata_mut()
                .insert(AUTHORIZATION, h.parse().unwrap());
        }
        request
    }

    #[test]
    fn constant_time_eq_matches_plain_equality() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
        assert!(constant_time_eq(b"", b""));
    }

    #[test]
    fn check_accepts_the_right_token_and_counts_refusals() {
        let rejected = Arc::new(AtomicU64::new(0));
        let mut check = AuthCheck::new(Some("s3cret"), rejected.clone());
        assert!(check.call(request_with(Some("Bearer s3cret"))).is_ok());
        let missing = check.call(request_with(None)).unwrap_err();
        assert_eq!(missing.code(), tonic::Code::Unauthenticated);
        assert!(missing.message().contains("requires a token"));
        for wrong in ["Bearer s3cre", "Bearer s3cret2", "s3cret", "bearer s3cret"] {
            let e = check.call(request_with(Some(wrong))).unwrap_err();
            assert_eq!(e.code(), tonic::Code::Unauthenticated, "{wrong}");
        }
        assert_eq!(rejected.load(Ordering::Relaxed), 5);
    }

    #[test]
    fn no_token_configured_accepts_everything() {
        let mut check = AuthCheck::new(None, Arc::default());
        assert!(check.call(request_with(None)).is_ok());
        assert!(check.call(request_with(Some("Bearer x"))).is_ok());
    }

    #[test]
    fn bearer_token_round_trips_through_the_check() {
        let mut header = CallHeaders::new(Some("tok-123"), None).unwrap();
        let request = header.call(Request::new(())).unwrap();
        let mut check = AuthCheck::new(Some("tok-123"), Arc::default());
        assert!(check.call(request).is_ok());
    }

    #[test]
    fn tokens_that_cannot_be_headers_are_refused_clearly() {
        assert!(validate_token("").unwrap_err().contains("empty"));
        let e = validate_token("has space").unwrap_err();
        assert!(e.contains("' '"), "{e}");
        assert!(CallHeaders::new(Some("tab\there"), None).is_err());
        assert!(CallHeaders::new(Some("ok"), Some("bad session")).is_err());
    }

    #[test]
    fn call_headers_carry_the_session_when_there_is_one() {
        use crate::rpc::wire::session::{SessionId, SESSION};
        let mut headers = CallHeaders::new(None, Some("abc123")).unwrap();
        let request = headers.call(Request::new(())).unwrap();
        let id = SessionId::from_metadata(request.metadata()).unwrap();
        assert_eq!(id.as_str(), "abc123");
        let mut anonymous = CallHeaders::new(None, Some("")).unwrap();
        let request = anonymous.call(Request::new(())).unwrap();
        assert!(request.metadata().get(SESSION).is_none());
    }
}
