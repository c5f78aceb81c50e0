//! Message-size limits, shared by the worker server and the client.
//!
//! Both sides accept messages up to [`DEFAULT_MAX_MESSAGE_BYTES`] unless configured
//! otherwise. tonic refuses an oversized message with `OUT_OF_RANGE`; gRPC's convention is
//! `RESOURCE_EXHAUSTED`, so the server rewrites that status with [`size_status_layer`]
//! before it leaves the process, and the client folds it in [`crate::rpc::RpcError::from`].

use tonic::codegen::http::Response;
use tonic::{Code, Status};

/// Default limit for one request or response: 64 MiB.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// Smallest accepted limit; below this even a status reply or a tiny closure would not fit.
pub const MIN_MAX_MESSAGE_BYTES: usize = 1024;

/// Largest accepted limit: gRPC frames carry a 32-bit length.
pub const MAX_MAX_MESSAGE_BYTES: usize = u32::MAX as usize;

/// HTTP/2 flow-control window for one stream. The 64 KiB protocol default makes a
/// multi-megabyte array wait for a window update every 64 KiB; 16 MiB lets a value stream
/// with several 4 MiB chunks (`chunks.rs`) in flight, so the sender never waits for the
/// receiver's window update between two of them.
pub const STREAM_WINDOW_BYTES: u32 = 16 * 1024 * 1024;

/// HTTP/2 flow-control window for a whole connection (a few streams in flight at once).
pub const CONNECTION_WINDOW_BYTES: u32 = 64 * 1024 * 1024;

/// Largest HTTP/2 frame each side accepts, for workers and ps tasks alike. Arrays travel as
/// multi-megabyte messages; with the 16 KiB default a 16 MiB array is 1024 frames, and as
/// many writes, reads and wake-ups of the receiving task (measured: the ps's 1 MiB update
/// ran 3x faster with 1 MiB frames). Small messages are unaffected: a frame is only as
/// large as what it carries.
pub const MAX_FRAME_BYTES: u32 = 1024 * 1024;

/// Largest message a batch of closures or of their answers is gathered into (a closure or
/// answer larger than this goes alone, up to the message limit). Half a frame, so a batch
/// arrives inside one HTTP/2 frame and is decoded where it arrived (`frames::Unframer`):
/// batches of 64 KiB arrays gathered up to the 64 MiB message limit spanned frames, and the
/// receiver copied each whole (3 % of the coordinator's CPU at 64 KiB in and out, `perf`).
pub const BATCH_MESSAGE_BYTES: usize = MAX_FRAME_BYTES as usize / 2;

/// Checks a configured limit, saying what range is allowed.
pub fn validate_max_message_bytes(limit: usize) -> Result<usize, String> {
    if (MIN_MAX_MESSAGE_BYTES..=MAX_MAX_MESSAGE_BYTES).contains(&limit) {
        Ok(limit)
    } else {
        Err(format!(
            "max_message_bytes={limit} is out of range; expected between \
             {MIN_MAX_MESSAGE_BYTES} and {MAX_MAX_MESSAGE_BYTES} bytes (default \
             {DEFAULT_MAX_MESSAGE_BYTES}, 64 MiB)"
        ))
    }
}

/// The error for a message of `size` bytes over `limit`, as both sides report it; `peer`
/// is the kind of server whose flag sets the limit (`worker`, `ps`).
pub fn too_large(peer: &str, what: &str, size: usize, limit: usize) -> Status {
    Status::resource_exhausted(format!(
        "{what} is {size} bytes, above the limit of {limit} bytes; raise max_message_bytes \
         ({peer}: --max-message-bytes) on both sides or send smaller values"
    ))
}

/// What tonic says about a request body that is not the protobuf message it should be.
const DECODE_ERROR: &str = "failed to decode Protobuf message";

/// `INVALID_ARGUMENT` for tonic's `INTERNAL` "failed to decode Protobuf message": the
/// request was malformed, which is the client's to fix, not a server bug. `None` for any
/// other status.
pub fn malformed(status: &Status) -> Option<Status> {
    (status.code() == Code::Internal && status.message().starts_with(DECODE_ERROR)).then(|| {
        Status::invalid_argument(format!(
            "the request is not a valid protobuf message of the expected type: {}",
            status.message()
        ))
    })
}

/// Rewrites a trailers-only `OUT_OF_RANGE` response (tonic's oversized-request error) to
/// `RESOURCE_EXHAUSTED`, keeping tonic's message, which names the sizes, and an `INTERNAL`
/// decode error to `INVALID_ARGUMENT` ([`malformed`]); `peer` names the server.
fn rewrite_status<B>(mut response: Response<B>, peer: &str) -> Response<B> {
    let headers = response.headers_mut();
    let rewritten = match Status::from_header_map(headers) {
        Some(status) if status.code() == Code::OutOfRange => {
            Some(Status::resource_exhausted(format!(
                "request rejected by the {peer}'s size limit: {}",
                status.message()
            )))
        }
        Some(status) => malformed(&status),
        None => None,
    };
    if let Some(rewritten) = rewritten {
        // Only fails for a header value that cannot be encoded, which our ASCII message
        // never is; keeping the original status is the safe fallback.
        let _ = rewritten.add_header(headers);
    }
    response
}

/// [`rewrite_status`] for a worker's responses.
pub fn rewrite_worker_status<B>(response: Response<B>) -> Response<B> {
    rewrite_status(response, "worker")
}

/// [`rewrite_status`] for a parameter server's responses.
pub fn rewrite_ps_status<B>(response: Response<B>) -> Response<B> {
    rewrite_status(response, "ps")
}

/// A tower layer applying `rewrite` (e.g. [`rewrite_worker_status`]) to every response of a
/// server.
pub fn status_layer<B>(
    rewrite: fn(Response<B>) -> Response<B>,
) -> tower::util::MapResponseLayer<fn(Response<B>) -> Response<B>> {
    tower::util::MapResponseLayer::new(rewrite)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_outside_the_range_are_refused_with_the_range() {
        assert_eq!(validate_max_message_bytes(2048), Ok(2048));
        let e = validate_max_message_bytes(10).unwrap_err();
        assert!(
            e.contains("max_message_bytes=10") && e.contains("1024"),
            "{e}"
        );
        assert!(validate_max_message_bytes(usize::MAX).is_err());
    }

    #[test]
    fn out_of_range_responses_are_rewritten_and_others_kept() {
        let response: Response<()> = Status::out_of_range("length too large: found 9").into_http();
        let rewritten = rewrite_worker_status(response);
        let status = Status::from_header_map(rewritten.headers()).unwrap();
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert!(status.message().contains("found 9"), "{}", status.message());
        assert!(
            status.message().contains("worker's"),
            "{}",
            status.message()
        );

        let response: Response<()> = Status::out_of_range("found 9").into_http();
        let status = Status::from_header_map(rewrite_ps_status(response).headers()).unwrap();
        assert!(
            status.message().contains("the ps's size limit"),
            "{}",
            status.message()
        );

        let response: Response<()> = Status::not_found("nope").into_http();
        let kept = rewrite_worker_status(response);
        let status = Status::from_header_map(kept.headers()).unwrap();
        assert_eq!(status.code(), Code::NotFound);
    }

    #[test]
    fn too_large_names_sizes_and_the_server() {
        let s = too_large("ps", "result", 10, 5);
        assert_eq!(s.code(), Code::ResourceExhausted);
        assert!(s.message().contains("10 bytes") && s.message().contains("5 bytes"));
        assert!(
            s.message().contains("(ps: --max-message-bytes)"),
            "{}",
            s.message()
        );
    }

    #[test]
    fn decode_errors_become_invalid_argument_and_nothing_else_does() {
        let response: Response<()> =
            Status::internal("failed to decode Protobuf message: invalid wire type").into_http();
        let status = Status::from_header_map(rewrite_worker_status(response).headers()).unwrap();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(
            status.message().contains("invalid wire type"),
            "{}",
            status.message()
        );
        let response: Response<()> = Status::internal("executor bug").into_http();
        let status = Status::from_header_map(rewrite_worker_status(response).headers()).unwrap();
        assert_eq!(status.code(), Code::Internal);
    }
}
