//! Who gets a connection to a worker or ps server, and for how long without a token.
//!
//! Anyone who can reach the port can open TCP connections before any token is checked, so
//! the servers admit connections here rather than with tonic's accept loop:
//!
//! - **Bounded.** At most [`ServerLimits::max_connections`] are open (lowered to what the
//!   file limit leaves, which [`raise_file_limit`] first raises to the hard limit). A new
//!   connection over the bound closes the oldest one that has not authenticated yet, so
//!   a flood of idle connections can never lock out a client with the token; only when
//!   every open connection has authenticated is the new one closed instead.
//! - **Authenticate or go.** A connection that has not sent an authenticated request within
//!   [`ServerLimits::handshake_timeout`] (TLS and HTTP/2 handshakes included) is closed.
//!   The token check (`auth.rs`) marks the connection through the request's extensions
//!   ([`mark_authenticated`]); from then on only the client or keepalive ends it.
//! - **No spinning.** tonic retries a failing `accept` at once, so a process out of file
//!   descriptors (`EMFILE`) spins a core for as long as the flood lasts. Here a failing
//!   `accept` waits, 10 ms doubling to 1 s, and the listener is polled again after that.
//!
//! Memory of closed connections: glibc keeps freed heap for reuse rather than returning it,
//! so what a flood costs is bounded by how many connections can be open at once, not
//! reclaimed afterwards; the bound above is what keeps it small (`malloc_trim` is a C call
//! this crate, which forbids `unsafe`, does not make).

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Sleep;
use tokio_stream::Stream;
use tonic::transport::server::{Connected, TlsConnectInfo};

/// Default bound on open connections: room for a ps that 1,000 workers and their
/// coordinator connect to, while a flood of idle connections stays a few tens of MB.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// Default bound on concurrent HTTP/2 streams per connection (hyper's own default is 200,
/// which tonic replaces with "unbounded"). A coordinator uses one stream plus a few calls;
/// a worker process's ps client shares one connection between its threads.
pub const DEFAULT_MAX_STREAMS_PER_CONNECTION: u32 = 128;
/// Default time a connection has to send an authenticated request.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// File descriptors left for everything else a process opens besides connections.
const RESERVED_FILES: u64 = 64;
/// First and longest wait after `accept` failed for lack of resources.
const ACCEPT_BACKOFF: (Duration, Duration) = (Duration::from_millis(10), Duration::from_secs(1));

/// How many connections and streams a server admits, and how long a connection may stay
/// without authenticating.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    /// Connections open at once (lowered to what the file limit allows).
    pub max_connections: usize,
    /// Concurrent HTTP/2 streams (calls) on one connection.
    pub max_streams_per_connection: u32,
    /// Time for a new connection to complete its handshakes and send an authenticated
    /// request.
    pub handshake_timeout: Duration,
}

impl Default for ServerLimits {
    fn default() -> Self {
        Self {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_streams_per_connection: DEFAULT_MAX_STREAMS_PER_CONNECTION,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
        }
    }
}

impl ServerLimits {
    /// Checks every bound, saying which is wrong and what is expected.
    pub fn validate(self) -> Result<Self, String> {
        if self.max_connections == 0 {
            return Err(format!(
                "max_connections=0 would refuse every client; expected at least 1 (default \
                 {DEFAULT_MAX_CONNECTIONS})"
            ));
        }
        if self.max_streams_per_connection == 0 {
            return Err(format!(
                "max_streams_per_connection=0 would refuse every call; expected at least 1 \
                 (default {DEFAULT_MAX_STREAMS_PER_CONNECTION})"
            ));
        }
        if self.handshake_timeout.is_zero() {
            return Err(format!(
                "handshake_timeout=0 would close every connection at once; expected a positive \
                 number of seconds (default {} s)",
                DEFAULT_HANDSHAKE_TIMEOUT.as_secs()
            ));
        }
        Ok(self)
    }
}

/// Raises this process's soft limit on open files to its hard limit, so connections are
/// bounded by [`ServerLimits`] rather than by a low default soft limit (often 1024).
/// Returns the soft limit in force afterwards; `None` where it cannot be read.
#[cfg(unix)]
pub fn raise_file_limit() -> Option<u64> {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => Some(limit),
        Err(error) => {
            tracing::warn!(
                target: "jaxcluster.server",
                %error,
                "could not raise the open-file limit; connections are bounded by the current one"
            );
            rlimit::getrlimit(rlimit::Resource::NOFILE)
                .ok()
                .map(|(soft, _)| soft)
        }
    }
}

/// Without Unix resource limits (Windows) there is no soft limit to raise or read: `None`,
/// so connections are bounded by [`ServerLimits`] alone.
#[cfg(not(unix))]
pub fn raise_file_limit() -> Option<u64> {
    None
}

/// How many files this process has open now (Linux; `None` elsewhere).
fn open_files() -> Option<u64> {
    std::fs::read_dir("/proc/self/fd")
        .ok()
        .map(|entries| entries.count() as u64)
}

/// `configured`, lowered so connections leave room for the process's other files under
/// `file_limit`.
pub fn effective_max_connections(configured: usize, file_limit: Option<u64>) -> usize {
    let Some(limit) = file_limit else {
        return configured;
    };
    let reserved = RESERVED_FILES + open_files().unwrap_or(RESERVED_FILES);
    let room = usize::try_from(limit.saturating_sub(reserved)).unwrap_or(usize::MAX);
    configured.min(room).max(1)
}

/// Counters of what admission did, reported in `GetStatus`.
#[derive(Debug, Default)]
pub struct ConnectionStats {
    /// Connections open now.
    pub open: AtomicU64,
    /// Connections accepted so far.
    pub accepted: AtomicU64,
    /// Connections closed because they did not authenticate in time, were closed to admit
    /// a newer one, or found the server full of authenticated connections.
    pub dropped: AtomicU64,
}

/// What runs when a connection closes (see [`on_close`]).
type CloseHook = Box<dyn FnOnce() + Send>;

/// Source of [`ConnectionInfo::id`]s, unique within the process.
static NEXT_CONNECTION_ID: AtomicU64 = AtomicU64::new(1);

/// One connection's admission state, shared by its I/O wrapper and its requests.
struct ConnectionState {
    id: u64,
    authenticated: AtomicBool,
    evicted: AtomicBool,
    /// The connection task's waker while it waits, so an eviction wakes it.
    waker: Mutex<Option<Waker>>,
    /// Run once when the connection closes (the session registry's release of the
    /// sessions it carried).
    on_close: Mutex<Vec<CloseHook>>,
}

impl Default for ConnectionState {
    fn default() -> Self {
        Self {
            id: NEXT_CONNECTION_ID.fetch_add(1, Ordering::Relaxed),
            authenticated: AtomicBool::new(false),
            evicted: AtomicBool::new(false),
            waker: Mutex::new(None),
            on_close: Mutex::new(Vec::new()),
        }
    }
}

impl std::fmt::Debug for ConnectionState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionState")
            .field("id", &self.id)
            .field("authenticated", &self.authenticated)
            .field("evicted", &self.evicted)
            .finish_non_exhaustive()
    }
}

impl ConnectionState {
    fn lock_waker(&self) -> MutexGuard<'_, Option<Waker>> {
        self.waker.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn evict(&self) {
        self.evicted.store(true, Ordering::Release);
        if let Some(waker) = self.lock_waker().take() {
            waker.wake();
        }
    }
}

/// What a request knows of its connection (tonic puts it in the request's extensions).
#[derive(Debug, Clone)]
pub struct ConnectionInfo {
    state: Arc<ConnectionState>,
    remote: Option<SocketAddr>,
}

impl ConnectionInfo {
    /// The client's address.
    pub fn remote_addr(&self) -> Option<SocketAddr> {
        self.remote
    }

    /// Records that the connection sent an authenticated request: it is no longer timed
    /// out or closed to make room.
    pub fn mark_authenticated(&self) {
        self.state.authenticated.store(true, Ordering::Release);
    }

    /// The connection's id, unique within the process.
    pub fn id(&self) -> u64 {
        self.state.id
    }

    /// Runs `hook` once when the connection closes.
    pub fn on_close(&self, hook: impl FnOnce() + Send + 'static) {
        self.state
            .on_close
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Box::new(hook));
    }
}

/// The [`ConnectionInfo`] of the connection a request came on (plaintext or TLS); `None`
/// for a request that did not come through [`Incoming`] (an in-process test service).
pub fn connection_info(extensions: &tonic::Extensions) -> Option<&ConnectionInfo> {
    extensions.get::<ConnectionInfo>().or_else(|| {
        extensions
            .get::<TlsConnectInfo<ConnectionInfo>>()
            .map(TlsConnectInfo::get_ref)
    })
}

/// The client's address of the connection a request came on (plaintext or TLS). tonic's
/// `Request::remote_addr` knows only its own connection types, not [`ConnectionInfo`].
pub fn remote_addr(extensions: &tonic::Extensions) -> Option<SocketAddr> {
    if let Some(info) = extensions.get::<ConnectionInfo>() {
        info.remote_addr()
    } else {
        extensions
            .get::<TlsConnectInfo<ConnectionInfo>>()
            .and_then(|info| info.get_ref().remote_addr())
    }
}

/// Marks the connection a request came on as authenticated (plaintext or TLS).
pub fn mark_authenticated(extensions: &tonic::Extensions) {
    if let Some(info) = extensions.get::<ConnectionInfo>() {
        info.mark_authenticated();
    } else if let Some(info) = extensions.get::<TlsConnectInfo<ConnectionInfo>>() {
        info.get_ref().mark_authenticated();
    }
}

/// The open connections and which of them have not authenticated, oldest first.
struct Registry {
    open: usize,
    pending: VecDeque<Weak<ConnectionState>>,
}

/// Admission shared by a server's accept loop and its connections.
pub(crate) struct Admission {
    registry: Mutex<Registry>,
    max: usize,
    limits: ServerLimits,
    stats: Arc<ConnectionStats>,
}

impl Admission {
    pub(crate) fn new(limits: ServerLimits, max: usize, stats: Arc<ConnectionStats>) -> Self {
        Self {
            registry: Mutex::new(Registry {
                open: 0,
                pending: VecDeque::new(),
            }),
            max,
            limits,
            stats,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A slot for a new connection, closing the oldest unauthenticated one if the server
    /// is full; `None` if every open connection has authenticated.
    fn admit(&self) -> Option<Arc<ConnectionState>> {
        let mut registry = self.lock();
        if registry.open >= self.max && !Self::evict_oldest(&mut registry) {
            return None;
        }
        let state = Arc::new(ConnectionState::default());
        registry.open += 1;
        registry.pending.push_back(Arc::downgrade(&state));
        if registry.pending.len() > 2 * self.max {
            registry
                .pending
                .retain(|weak| weak.upgrade().is_some_and(|s| Self::is_pending(&s)));
        }
        drop(registry);
        self.stats.open.fetch_add(1, Ordering::Relaxed);
        self.stats.accepted.fetch_add(1, Ordering::Relaxed);
        Some(state)
    }

    fn is_pending(state: &ConnectionState) -> bool {
        !state.authenticated.load(Ordering::Acquire) && !state.evicted.load(Ordering::Acquire)
    }

    /// Closes the oldest connection still unauthenticated; `false` if there is none. Its
    /// slot is released when its task notices, a moment later, so the bound may be passed
    /// by the evictions in flight.
    fn evict_oldest(registry: &mut Registry) -> bool {
        while let Some(weak) = registry.pending.pop_front() {
            if let Some(state) = weak.upgrade() {
                if Self::is_pending(&state) {
                    state.evict();
                    return true;
                }
            }
        }
        false
    }

    fn release(&self) {
        self.lock().open -= 1;
        self.stats.open.fetch_sub(1, Ordering::Relaxed);
    }

    fn dropped(&self) {
        self.stats.dropped.fetch_add(1, Ordering::Relaxed);
    }
}

/// An admitted TCP connection: closed with an error once its handshake deadline passes
/// unauthenticated or it is evicted; gives its slot back when dropped.
pub struct GuardedStream {
    io: TcpStream,
    state: Arc<ConnectionState>,
    remote: Option<SocketAddr>,
    /// Until the connection authenticates.
    deadline: Option<Pin<Box<Sleep>>>,
    admission: Arc<Admission>,
    counted: bool,
}

impl GuardedStream {
    /// `Err` once the connection must close; registers for an eviction's wake-up.
    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        let Some(deadline) = self.deadline.as_mut() else {
            return Ok(());
        };
        if self.state.authenticated.load(Ordering::Acquire) {
            self.deadline = None;
            return Ok(());
        }
        *self.state.lock_waker() = Some(cx.waker().clone());
        let why = if self.state.evicted.load(Ordering::Acquire) {
            Some((
                io::ErrorKind::ConnectionAborted,
                "closed to admit a newer connection: the server is full and this one had not \
                 sent an authenticated request",
            ))
        } else if deadline.as_mut().poll(cx).is_ready() {
            Some((
                io::ErrorKind::TimedOut,
                "closed: no authenticated request within the handshake timeout",
            ))
        } else {
            None
        };
        match why {
            None => Ok(()),
            Some((kind, message)) => {
                if !std::mem::replace(&mut self.counted, true) {
                    self.admission.dropped();
                    tracing::debug!(
                        target: "jaxcluster.server",
                        remote = ?self.remote,
                        "{message}"
                    );
                }
                Err(io::Error::new(kind, message))
            }
        }
    }
}

impl Drop for GuardedStream {
    fn drop(&mut self) {
        self.admission.release();
        let hooks = std::mem::take(
            &mut *self
                .state
                .on_close
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for hook in hooks {
            hook();
        }
    }
}

impl AsyncRead for GuardedStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Err(error) = this.check(cx) {
            return Poll::Ready(Err(error));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for GuardedStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Err(error) = this.check(cx) {
            return Poll::Ready(Err(error));
        }
        Pin::new(&mut this.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Err(error) = this.check(cx) {
            return Poll::Ready(Err(error));
        }
        Pin::new(&mut this.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl Connected for GuardedStream {
    type ConnectInfo = ConnectionInfo;

    fn connect_info(&self) -> ConnectionInfo {
        ConnectionInfo {
            state: Arc::clone(&self.state),
            remote: self.remote,
        }
    }
}

/// The connections a server accepts: admitted by [`Admission`], with `accept` failures
/// waited out instead of retried at once.
pub struct Incoming {
    listener: TcpListener,
    admission: Arc<Admission>,
    pause: Option<Pin<Box<Sleep>>>,
    next_pause: Duration,
}

impl Incoming {
    /// Accepts on `listener` under `limits`, at most `max` connections at once, counting
    /// in `stats`.
    pub fn new(
        listener: TcpListener,
        limits: ServerLimits,
        max: usize,
        stats: Arc<ConnectionStats>,
    ) -> Self {
        Self {
            listener,
            admission: Arc::new(Admission::new(limits, max, stats)),
            pause: None,
            next_pause: ACCEPT_BACKOFF.0,
        }
    }

    fn guard(
        &self,
        io: TcpStream,
        remote: SocketAddr,
        state: Arc<ConnectionState>,
    ) -> GuardedStream {
        // Answers go out as soon as they are written (the protocol batches them itself).
        let _ = io.set_nodelay(true);
        GuardedStream {
            io,
            state,
            remote: Some(remote),
            deadline: Some(Box::pin(tokio::time::sleep(
                self.admission.limits.handshake_timeout,
            ))),
            admission: Arc::clone(&self.admission),
            counted: false,
        }
    }
}

/// Whether an `accept` error concerns only the one connection being accepted.
fn is_per_connection(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    )
}

impl Stream for Incoming {
    type Item = io::Result<GuardedStream>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(pause) = this.pause.as_mut() {
                if pause.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                this.pause = None;
            }
            match this.listener.poll_accept(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok((io, remote))) => {
                    this.next_pause = ACCEPT_BACKOFF.0;
                    if let Some(state) = this.admission.admit() {
                        return Poll::Ready(Some(Ok(this.guard(io, remote, state))));
                    }
                    // Full of authenticated connections: close this one now rather than
                    // leave it hanging in the backlog.
                    this.admission.dropped();
                    drop(io);
                }
                Poll::Ready(Err(error)) if is_per_connection(&error) => {}
                Poll::Ready(Err(error)) => {
                    // Out of file descriptors or memory: retrying at once would spin.
                    if this.next_pause == ACCEPT_BACKOFF.0 {
                        tracing::warn!(
                            target: "jaxcluster.server",
                            %error,
                            "accepting connections failed; pausing before the next attempt"
                        );
                    }
                    this.pause = Some(Box::pin(tokio::time::sleep(this.next_pause)));
                    this.next_pause = (this.next_pause * 2).min(ACCEPT_BACKOFF.1);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
