//! The one process-wide tokio runtime.
//!
//! **Ownership rule.** Every async piece of jaxcluster (worker servers, worker clients, the
//! coordinator's dispatcher) runs on a single multi-threaded runtime created lazily on first
//! use and never dropped: tonic channels and servers are bound to the runtime that spawned
//! their background tasks, so one global avoids a whole class of "runtime dropped while a
//! channel still used it" bugs.
//!
//! **Thread rule.** The runtime gets one thread fewer than the cores the process may use
//! (at least one, at most [`MAX_WORKER_THREADS`]; [`THREADS_ENV`] overrides): the remaining
//! core is the interpreter's, which runs the closures on a worker and the training loop on a
//! coordinator. A second runtime thread on a 2-core machine did not add throughput, but
//! tokio wakes an idle sibling to look for work each time a task is woken, and those
//! wake-ups took the core a serial round trip needed: with one thread a round trip woke
//! threads 5.8 times instead of 8.0, and its p50 fell about 10% (`docs/benchmarks.md`).
//!
//! **Fork rule.** A forked child inherits the runtime's memory but none of its threads, so
//! the inherited runtime would hang on first use. [`runtime`] records the pid that created
//! it and refuses, with [`RuntimeError::Forked`], to hand it out in any other process. A
//! child must not use servers or clients created before the fork; it starts its own
//! process (`subprocess`, or multiprocessing's `spawn`/`forkserver` start methods), or it
//! forks before jaxcluster first touches the network.

pub mod awake;
pub mod lend;

use std::sync::OnceLock;

use tokio::runtime::{Builder, Runtime};

use crate::setting::{Read, Setting};

/// Most worker threads of the shared runtime: enough to overlap the I/O of many links and
/// transfers without competing with JAX for cores.
pub const MAX_WORKER_THREADS: usize = 4;

/// The environment variable that sets the runtime's worker threads (a whole number from 1
/// to [`MAX_WORKER_THREADS`]), read when the runtime is created.
pub const THREADS_ENV: &str = "JAXCLUSTER_RUNTIME_THREADS";

/// The runtime's worker threads on a machine where the process may use `cores` cores, with
/// [`THREADS_ENV`] set to `set` (if at all): one core is left to the interpreter. A value
/// that is not a whole number in range is refused (the caller warns), as unset.
fn threads_for(set: Option<&str>, cores: usize) -> Read<usize> {
    Read::parse(
        THREADS_ENV,
        set,
        |text| {
            text.parse::<usize>()
                .ok()
                .filter(|threads| (1..=MAX_WORKER_THREADS).contains(threads))
        },
        &format!("a whole number from 1 to {MAX_WORKER_THREADS}"),
        || cores.saturating_sub(1).clamp(1, MAX_WORKER_THREADS),
    )
}

/// The runtime's worker threads, read once per process.
fn configured_threads() -> usize {
    static THREADS: Setting<usize> = Setting::new();
    *THREADS.get(|| {
        let cores = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
        threads_for(std::env::var(THREADS_ENV).ok().as_deref(), cores)
    })
}

/// Whether a runtime of `threads` threads lends its work to the threads that wait for it
/// (`lend.rs`): it has one thread, spinning is on, and [`lend::LEND_ENV`] does not say `0`.
fn lends(threads: usize) -> bool {
    // Read whatever the threads: a refused value is warned about on every machine.
    let allowed = lend::allowed();
    allowed && threads == 1 && !crate::spin::configured_budget().is_zero()
}

/// Whether this process's runtime lends (or will, once made): see [`lends`]. Decided once
/// and kept: `awake::spins` asks on every event of a round trip.
pub(crate) fn will_lend() -> bool {
    static LENDS: OnceLock<bool> = OnceLock::new();
    if let Some(&lends) = LENDS.get() {
        return lends;
    }
    // Decided outside the lock: reading the settings may log a refused value, which takes
    // the GIL (`crate::setting`).
    let decided = lends(configured_threads());
    *LENDS.get_or_init(|| decided)
}

/// The runtime together with the process that created it.
struct Owned {
    pid: u32,
    runtime: Runtime,
}

static RUNTIME: OnceLock<Result<Owned, String>> = OnceLock::new();

/// Why the shared runtime cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuntimeError {
    /// The runtime was created in a parent process before `fork()`.
    #[error(
        "jaxcluster's async runtime was created in process {created_in} and this is process \
         {current} (a fork of it); a forked child cannot use it. Create jaxcluster servers and \
         clients only in the child (start it with subprocess or multiprocessing's 'spawn' \
         method), or fork before jaxcluster is first used"
    )]
    Forked {
        /// Pid of the process that created the runtime.
        created_in: u32,
        /// Pid of the calling process.
        current: u32,
    },
    /// The operating system refused to create the runtime's threads.
    #[error("could not start jaxcluster's async runtime: {0}")]
    Build(String),
}

/// Returns the process-wide runtime, creating it on first use.
///
/// ```
/// let rt = _core::runtime::runtime().unwrap();
/// assert_eq!(rt.block_on(async { 1 + 1 }), 2);
/// ```
pub fn runtime() -> Result<&'static Runtime, RuntimeError> {
    // The thread count is read (and a refused value logged) before the runtime's lock is
    // taken: logging takes the GIL (`crate::setting`).
    let owned = RUNTIME.get().unwrap_or_else(|| {
        let threads = configured_threads();
        let lending = will_lend();
        let owned = RUNTIME.get_or_init(|| build(threads, lending));
        if let Ok(owned) = owned {
            if lending {
                // A driver thread that cannot start leaves nobody to drive the runtime: a
                // waiter would only ever drive it while it waits.
                if let Err(error) = lend::start(&owned.runtime) {
                    tracing::error!(
                        target: crate::log_target::DISPATCH,
                        %error,
                        "could not start the runtime's driver thread"
                    );
                }
            }
        }
        owned
    });
    match owned {
        Ok(owned) if owned.pid == std::process::id() => Ok(&owned.runtime),
        Ok(owned) => Err(RuntimeError::Forked {
            created_in: owned.pid,
            current: std::process::id(),
        }),
        Err(message) => Err(RuntimeError::Build(message.clone())),
    }
}

/// A runtime of `threads` worker threads owned by this process; one that `lends` is of
/// tokio's current-thread flavour, its thread started by [`lend::start`].
fn build(threads: usize, lends: bool) -> Result<Owned, String> {
    let mut builder = if lends {
        Builder::new_current_thread()
    } else {
        let mut builder = Builder::new_multi_thread();
        builder.worker_threads(threads);
        builder
    };
    builder
        .thread_name("jaxcluster-rt")
        .enable_all()
        .build()
        .map(|runtime| Owned {
            pid: std::process::id(),
            runtime,
        })
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_is_shared_and_usable() {
        let a = runtime().unwrap();
        let b = runtime().unwrap();
        assert!(std::ptr::eq(a, b));
        assert_eq!(a.block_on(async { 40 + 2 }), 42);
    }

    #[test]
    fn one_core_is_left_to_the_interpreter_unless_the_variable_says_otherwise() {
        let threads = |set, cores| threads_for(set, cores).value;
        assert_eq!(threads(None, 1), 1);
        assert_eq!(threads(None, 2), 1);
        assert_eq!(threads(None, 3), 2);
        assert_eq!(threads(None, 5), MAX_WORKER_THREADS);
        assert_eq!(threads(None, 96), MAX_WORKER_THREADS);
        assert_eq!(threads(Some("3"), 2), 3);
        assert_eq!(threads(Some(" 1 "), 96), 1);
        assert!(threads_for(Some("3"), 2).refused.is_none());
        for ignored in ["0", "5", "-1", "two", ""] {
            let read = threads_for(Some(ignored), 8);
            assert_eq!(read.value, 4, "{ignored:?}");
            let said = read.refused.unwrap();
            assert!(
                said.contains(THREADS_ENV) && said.contains("from 1 to 4"),
                "{said}"
            );
        }
    }

    #[test]
    fn forked_error_names_both_processes() {
        let e = RuntimeError::Forked {
            created_in: 10,
            current: 11,
        };
        let text = e.to_string();
        assert!(
            text.contains("process 10") && text.contains("process 11"),
            "{text}"
        );
    }
}
