//! The worker's HTTP routes: `RunClosures` served with `rpc/wire/frames.rs`, every other path by
//! the generated tonic service behind the auth check.
//!
//! Why a route of its own: tonic's codec assembles each request message in a buffer of its
//! own and encodes each answer into another, so every array a closure received or returned
//! was copied twice in the worker beyond what the kernel does. Here a request's arrays are
//! slices of the HTTP/2 frames they arrived in, and a result's arrays go to the socket from
//! the executor's own memory. The call is the same gRPC call (same path, framing, status
//! trailers, auth), so any gRPC client still speaks to it.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::body::Body;
use tonic::codegen::http::header::CONTENT_TYPE;
use tonic::codegen::http::{HeaderValue, Request, Response};
use tonic::server::NamedService;
use tonic::service::Interceptor;
use tower::Service;

use super::reader;
use super::state::WorkerState;
use crate::rpc::security::auth::AuthCheck;
use crate::rpc::wire::frames::{Ending, FramedBody, Unframed};
use crate::rpc::{pb, PROTOCOL_REVISION, REVISION_HEADER, RUN_CLOSURES_PATH};

/// The service the server routes the `Worker` service's paths to: `RunClosures` here,
/// the rest to `generated` (the tonic service wrapped in the auth check).
#[derive(Clone)]
pub struct Routes<S> {
    generated: S,
    state: Arc<WorkerState>,
    auth: AuthCheck,
}

impl<S> Routes<S> {
    /// Routes over `generated`, with `RunClosures` served on `state` after `auth`.
    pub(super) fn new(generated: S, state: Arc<WorkerState>, auth: AuthCheck) -> Self {
        Self {
            generated,
            state,
            auth,
        }
    }

    /// One `RunClosures` call: the auth check, then the reader over the request frames and
    /// the answers as the response body. A refused call is a trailers-only response, as
    /// tonic answers one.
    fn run_closures(&self, request: Request<Body>) -> Response<Body> {
        let (parts, body) = request.into_parts();
        let call = tonic::Request::from_http(Request::from_parts(parts, ()));
        let session = match self
            .auth
            .clone()
            .call(call)
            .and_then(|call| self.state.session_of(call.metadata(), call.extensions()))
        {
            Ok(session) => session,
            Err(status) => return status.into_http(),
        };
        let limit = self.state.max_message_bytes;
        let incoming = Unframed::<_, pb::RunClosuresRequest>::new(
            body,
            limit,
            "a RunClosures request",
            Ending::Request,
        );
        let outgoing = reader::serve(&self.state, Box::pin(incoming), session);
        let mut response = Response::new(Body::new(FramedBody::new(
            outgoing,
            limit,
            "a RunClosures response",
            Ending::Response,
        )));
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        headers.insert(REVISION_HEADER, HeaderValue::from(PROTOCOL_REVISION));
        response
    }
}

impl<S: NamedService> NamedService for Routes<S> {
    const NAME: &'static str = S::NAME;
}

type Answer = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

impl<S, B> Service<Request<Body>> for Routes<S>
where
    S: Service<Request<Body>, Response = Response<B>, Error = Infallible>,
    S::Future: Send + 'static,
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<tonic::codegen::StdError>,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Answer;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.generated.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Answer {
        if request.uri().path() == RUN_CLOSURES_PATH {
            let response = self.run_closures(request);
            return Box::pin(std::future::ready(Ok(response)));
        }
        let answer = self.generated.call(request);
        Box::pin(async move { answer.await.map(|response| response.map(Body::new)) })
    }
}
