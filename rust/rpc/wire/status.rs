//! The one place where `tonic::Status` and jaxcluster's typed RPC errors meet.
//!
//! Both directions live here: [`RpcError::from`] a `Status` for the client side, and
//! `Status::from` an [`RpcError`] for the worker side, so a code means the same thing
//! everywhere. `rust/py/client.rs` then maps each variant to a `jaxcluster.errors` class.

use tonic::{Code, Status};

/// A failed RPC, by gRPC status code, with a message that says what went wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RpcError {
    /// Missing or wrong token (`UNAUTHENTICATED`).
    #[error("{0}")]
    Unauthenticated(String),
    /// The peer cannot be reached or is shutting down (`UNAVAILABLE`); retry elsewhere.
    #[error("{0}")]
    Unavailable(String),
    /// A well-formed reference to something the peer does not hold (`NOT_FOUND`).
    #[error("{0}")]
    NotFound(String),
    /// A malformed request (`INVALID_ARGUMENT`).
    #[error("{0}")]
    InvalidArgument(String),
    /// A message above the size limit (`RESOURCE_EXHAUSTED`; tonic's `OUT_OF_RANGE` for
    /// oversized messages is folded in here).
    #[error("{0}")]
    ResourceExhausted(String),
    /// The call's deadline passed (`DEADLINE_EXCEEDED`).
    #[error("{0}")]
    DeadlineExceeded(String),
    /// The call was cancelled (`CANCELLED`).
    #[error("{0}")]
    Cancelled(String),
    /// The peer is not in a state to do this (`FAILED_PRECONDITION`).
    #[error("{0}")]
    FailedPrecondition(String),
    /// The operation was aborted (`ABORTED`).
    #[error("{0}")]
    Aborted(String),
    /// A bug or broken invariant on either side (`INTERNAL`, `UNKNOWN`, `DATA_LOSS`, ...).
    #[error("{0}")]
    Internal(String),
}

impl RpcError {
    /// The gRPC code this error travels as.
    pub fn code(&self) -> Code {
        match self {
            Self::Unauthenticated(_) => Code::Unauthenticated,
            Self::Unavailable(_) => Code::Unavailable,
            Self::NotFound(_) => Code::NotFound,
            Self::InvalidArgument(_) => Code::InvalidArgument,
            Self::ResourceExhausted(_) => Code::ResourceExhausted,
            Self::DeadlineExceeded(_) => Code::DeadlineExceeded,
            Self::Cancelled(_) => Code::Cancelled,
            Self::FailedPrecondition(_) => Code::FailedPrecondition,
            Self::Aborted(_) => Code::Aborted,
            Self::Internal(_) => Code::Internal,
        }
    }

    /// The message, without the code.
    pub fn message(&self) -> &str {
        match self {
            Self::Unauthenticated(m)
            | Self::Unavailable(m)
            | Self::NotFound(m)
            | Self::InvalidArgument(m)
            | Self::ResourceExhausted(m)
            | Self::DeadlineExceeded(m)
            | Self::Cancelled(m)
            | Self::FailedPrecondition(m)
            | Self::Aborted(m)
            | Self::Internal(m) => m,
        }
    }

    /// Whether the same request may succeed on another (or a restarted) worker: the worker
    /// was unreachable or draining. A dispatcher puts such a closure back in the queue.
    pub fn is_worker_failure(&self) -> bool {
        matches!(self, Self::Unavailable(_))
    }

    /// The same error with `context` (e.g. which call to which worker) before the message.
    #[must_use]
    pub fn with_context(self, context: &str) -> Self {
        let message = format!("{context}: {}", self.message());
        Self::from_code(self.code(), message)
    }

    /// Builds the variant for `code`.
    pub fn from_code(code: Code, message: String) -> Self {
        match code {
            Code::Unauthenticated | Code::PermissionDenied => Self::Unauthenticated(message),
            Code::Unavailable => Self::Unavailable(message),
            Code::NotFound => Self::NotFound(message),
            Code::InvalidArgument => Self::InvalidArgument(message),
            // tonic reports a message over its size limit as OUT_OF_RANGE; gRPC's convention
            // (and grpcio's) is RESOURCE_EXHAUSTED, which is what callers catch.
            Code::ResourceExhausted | Code::OutOfRange => Self::ResourceExhausted(message),
            Code::DeadlineExceeded => Self::DeadlineExceeded(message),
            Code::Cancelled => Self::Cancelled(message),
            Code::FailedPrecondition | Code::AlreadyExists => Self::FailedPrecondition(message),
            Code::Aborted => Self::Aborted(message),
            Code::Ok | Code::Unknown | Code::Unimplemented | Code::Internal | Code::DataLoss => {
                Self::Internal(message)
            }
        }
    }
}

impl From<Status> for RpcError {
    fn from(status: Status) -> Self {
        let mut message = status.message().to_owned();
        if message.is_empty() {
            message = format!(
                "the RPC failed with status {:?} and no message",
                status.code()
            );
        }
        // A transport failure (refused connection, reset stream) arrives with the cause in
        // the source chain rather than the message; keep it, it is the useful part.
        let mut source = std::error::Error::source(&status);
        let mut causes = Vec::new();
        while let Some(error) = source {
            let cause = error.to_string();
            if !message.contains(&cause) && !causes.contains(&cause) {
                causes.push(cause);
            }
            source = error.source();
        }
        if !causes.is_empty() {
            message = format!("{message} ({})", causes.join(": "));
        }
        if let Some(hint) = tls_mismatch_hint(&message) {
            message = format!("{message}; {hint}");
        }
        Self::from_code(transport_code(&status), message)
    }
}

/// The code a caller should see for `status`. tonic builds a status from a transport
/// failure (a reset stream, a connection closed mid-call) with the failure as its source
/// and a code taken from the HTTP/2 reason: `CANCELLED`, `INTERNAL` or `UNKNOWN`. To the
/// caller the peer went away mid-call, which is `UNAVAILABLE` (as gRPC's own clients report
/// a broken connection, and what every retry here keys on); a caller that cancelled nothing
/// must not see `CANCELLED`, and `INTERNAL` is kept for what a peer said went wrong. A
/// status the peer sent (trailers) has no source and keeps its code.
fn transport_code(status: &Status) -> Code {
    match status.code() {
        Code::Cancelled | Code::Internal | Code::Unknown
            if std::error::Error::source(status).is_some() =>
        {
            Code::Unavailable
        }
        code => code,
    }
}

/// Recognises the two ways a TLS/plaintext mismatch surfaces, whose raw text names neither:
/// a plaintext client reads the server's TLS alert as an HTTP/2 frame of impossible size,
/// and a TLS client's rustls sees an HTTP/2 preface where a TLS record should be.
fn tls_mismatch_hint(message: &str) -> Option<&'static str> {
    if message.contains("frame with invalid size") {
        Some(
            "the peer may be serving TLS: connect with tls_ca= (or set JAXCLUSTER_TLS_CA) \
             naming the CA that signed its certificate",
        )
    } else if message.contains("InvalidContentType") {
        Some(
            "the peer may be serving plaintext: connect without tls_ca= (and without \
             JAXCLUSTER_TLS_CA), or start it with --tls-cert/--tls-key",
        )
    } else {
        None
    }
}

impl From<RpcError> for Status {
    fn from(error: RpcError) -> Self {
        Status::new(error.code(), error.message())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_round_trips_through_status() {
        let all = [
            RpcError::Unauthenticated("a".into()),
            RpcError::Unavailable("b".into()),
            RpcError::NotFound("c".into()),
            RpcError::InvalidArgument("d".into()),
            RpcError::ResourceExhausted("e".into()),
            RpcError::DeadlineExceeded("f".into()),
            RpcError::Cancelled("g".into()),
            RpcError::FailedPrecondition("h".into()),
            RpcError::Aborted("i".into()),
            RpcError::Internal("j".into()),
        ];
        for error in all {
            let status = Status::from(error.clone());
            assert_eq!(status.code(), error.code());
            assert_eq!(RpcError::from(status), error);
        }
    }

    #[test]
    fn a_transport_failure_is_unavailable_and_a_peers_own_status_keeps_its_code() {
        let closed = || {
            std::sync::Arc::new(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "connection closed",
            ))
        };
        for code in [Code::Cancelled, Code::Internal, Code::Unknown] {
            let mut status = Status::new(code, "operation was canceled");
            status.set_source(closed());
            let e = RpcError::from(status);
            assert!(matches!(e, RpcError::Unavailable(_)), "{code:?}: {e:?}");
            assert!(e.message().contains("connection closed"), "{e:?}");
        }
        let e = RpcError::from(Status::from_error(Box::new(std::io::Error::new(
            std::io::ErrorKind::BrokenPipe,
            "broken pipe",
        ))));
        assert!(matches!(e, RpcError::Unavailable(_)), "{e:?}");
        // Sent by the peer: no source, the code stands.
        for (status, expected) in [
            (Status::internal("a bug"), Code::Internal),
            (Status::cancelled("stopped"), Code::Cancelled),
            (Status::unknown("?"), Code::Internal),
        ] {
            assert_eq!(RpcError::from(status).code(), expected);
        }
        // Any other code keeps its meaning with a source too.
        let mut status = Status::not_found("no such value");
        status.set_source(closed());
        assert!(matches!(RpcError::from(status), RpcError::NotFound(_)));
    }

    #[test]
    fn tonic_size_errors_become_resource_exhausted() {
        let e = RpcError::from(Status::out_of_range("decoded message length too large"));
        assert!(matches!(e, RpcError::ResourceExhausted(_)), "{e:?}");
    }

    #[test]
    fn codes_without_a_variant_fold_into_the_nearest_class() {
        assert!(matches!(
            RpcError::from(Status::unknown("x")),
            RpcError::Internal(_)
        ));
        assert!(matches!(
            RpcError::from(Status::permission_denied("x")),
            RpcError::Unauthenticated(_)
        ));
        let empty = RpcError::from(Status::internal(""));
        assert!(empty.message().contains("no message"), "{empty}");
    }

    #[test]
    fn a_tls_mismatch_says_which_side_to_change() {
        let plaintext_client = RpcError::from(Status::internal(
            "h2 protocol error: connection error detected: frame with invalid size",
        ));
        assert!(
            plaintext_client.message().contains("may be serving TLS"),
            "{plaintext_client}"
        );
        assert!(plaintext_client.message().contains("tls_ca="));
        let tls_client = RpcError::from(Status::unavailable(
            "received corrupt message of type InvalidContentType",
        ));
        assert!(
            tls_client.message().contains("may be serving plaintext"),
            "{tls_client}"
        );
        let unrelated = RpcError::from(Status::unavailable("connection refused"));
        assert!(!unrelated.message().contains("TLS"), "{unrelated}");
    }

    #[test]
    fn context_is_prefixed_and_only_unavailable_is_a_worker_failure() {
        let e = RpcError::Unavailable("connection refused".into()).with_context("GetStatus to w0");
        assert_eq!(e.message(), "GetStatus to w0: connection refused");
        assert!(e.is_worker_failure());
        assert!(!RpcError::InvalidArgument("x".into()).is_worker_failure());
    }
}
