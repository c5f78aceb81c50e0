//! gRPC calls whose messages `wire::frames` frames instead of tonic's codec: the client
//! half of what `frames.rs` explains (a large `bytes` field is written from its own memory,
//! and a received one is read where it arrived). Two calls use it: the worker's
//! `RunClosures` stream (`closure_stream.rs`) and `CallChunked` of both services, whose
//! 4 MiB chunks tonic's codec copied into its encoder one by one (a 64 MiB ps update was
//! copied twice on the caller before it reached the socket: once out of the numpy array,
//! once into the encoder).
//!
//! Both go through the same connection as the generated clients ([`Raw`]: the channel
//! with the bearer-token and session interceptor), so nothing else changes for the server:
//! the bytes on the wire are standard gRPC framing.

use std::pin::Pin;

use tokio_stream::{Stream, StreamExt};
use tonic::body::Body;
use tonic::codegen::http::header::{CONTENT_TYPE, TE};
use tonic::codegen::http::{HeaderMap, HeaderValue, Method, Request, Response, Version};
use tonic::service::interceptor::{InterceptedService, ResponseBody};
use tonic::transport::Channel;
use tonic::{Code, Status};
use tower::{Service, ServiceExt};

use super::chunked::{ChunkStream, ChunkedAnswer};
use crate::rpc::pb;
use crate::rpc::security::auth::CallHeaders;
use crate::rpc::wire::frames::{Ending, FramedBody, Unframed};

/// A connection without a generated client: what a framed call is sent on.
pub type Raw = InterceptedService<Channel, CallHeaders>;

/// A framed `CallChunked` call in progress (see [`call_chunked`]).
pub type Pending = Pin<Box<dyn std::future::Future<Output = ChunkedAnswer> + Send>>;

/// The answer's messages, whichever decoder read them.
pub type Replies<M> = Pin<Box<dyn Stream<Item = Result<M, Status>> + Send>>;

/// Starts the gRPC call `path` on `raw` with `body` as its request stream and `headers`
/// (a deadline's `grpc-timeout`, say) besides gRPC's own. Resolves once the response's
/// headers are in: a call the server refused at once (a trailers-only response, e.g.
/// `UNAUTHENTICATED`, or `UNIMPLEMENTED` from a server that predates the call) is that
/// status, and a response that is not gRPC's `200` is mapped as gRPC clients map it.
/// `what` names the call in errors, e.g. `"RunClosures"`.
pub async fn open<B>(
    raw: &Raw,
    path: &'static str,
    headers: HeaderMap,
    body: B,
    what: &str,
) -> Result<Response<ResponseBody<Body>>, Status>
where
    B: http_body::Body<Data = bytes::Bytes, Error = Status> + Send + 'static,
{
    let mut request = Request::builder()
        .method(Method::POST)
        .uri(path)
        .version(Version::HTTP_2)
        .body(Body::new(body))
        .map_err(|e| Status::internal(format!("could not build the {what} call: {e}")))?;
    let sent = request.headers_mut();
    sent.extend(headers);
    sent.insert(TE, HeaderValue::from_static("trailers"));
    sent.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    let mut service = raw.clone();
    let response = service
        .ready()
        .await
        .map_err(|e| Status::from_error(Box::new(e)))?
        .call(request)
        .await
        .map_err(|e| Status::from_error(Box::new(e)))?;
    if let Some(status) = Status::from_header_map(response.headers()) {
        if status.code() != Code::Ok {
            return Err(status);
        }
    }
    match response.status().as_u16() {
        200 => Ok(response),
        http => Err(Status::new(
            match http {
                400 => Code::Internal,
                401 => Code::Unauthenticated,
                403 => Code::PermissionDenied,
                404 => Code::Unimplemented,
                429 | 502 | 503 | 504 => Code::Unavailable,
                _ => Code::Unknown,
            },
            format!("the server answered {what} with HTTP status {http}, not gRPC's 200"),
        )),
    }
}

/// The messages of `response`'s body, read in place (`Unframed`); none when the server
/// ended the call at once with OK (trailers-only: no body).
pub fn replies<M>(
    response: Response<ResponseBody<Body>>,
    limit: usize,
    what: &'static str,
) -> (tonic::metadata::MetadataMap, Replies<M>)
where
    M: prost::Message + Default + Send + 'static,
{
    let ended = Status::from_header_map(response.headers()).is_some();
    let (parts, body) = response.into_parts();
    let stream =
        Unframed::<_, M>::new(body, limit, what, Ending::Response).take_while(move |_| !ended);
    (
        tonic::metadata::MetadataMap::from_headers(parts.headers),
        Box::pin(stream),
    )
}

/// Runs `CallChunked` (the service's, at `path`) with `request`'s chunks framed by
/// `frames.rs`, so a chunk of an array is written from the array's memory; the answer's
/// chunks are read in place. `limit` bounds one message either way.
pub async fn call_chunked(
    raw: Raw,
    path: &'static str,
    limit: usize,
    request: tonic::Request<ChunkStream>,
) -> ChunkedAnswer {
    let (metadata, extensions, chunks) = request.into_parts();
    let body = FramedBody::new(
        chunks.map(Ok::<_, Status>),
        limit,
        "a CallChunked request",
        Ending::Request,
    );
    let response = open(&raw, path, metadata.into_headers(), body, "CallChunked").await?;
    let (metadata, replies) = replies::<pb::Chunk>(response, limit, "a CallChunked answer");
    Ok(tonic::Response::from_parts(metadata, replies, extensions))
}

/// What [`Callee::call_sized`](super::channel::Callee::call_sized) starts a chunked call
/// with: `CallChunked` at `path`, framed, on `raw` (the generated client it is handed is
/// not used: the call goes on the same connection without it).
pub fn chunked_call<C>(
    raw: &Raw,
    path: &'static str,
    limit: usize,
) -> impl FnOnce(C, tonic::Request<ChunkStream>) -> Pending + use<C> {
    let raw = raw.clone();
    move |_, request| Box::pin(call_chunked(raw, path, limit, request))
}
