//! Workers that died under a closure: what the coordinator knows of each death, and the
//! failure of a closure that killed its workers too often (`max_closure_retries`).
//!
//! # What counts
//!
//! A death counts against a closure when the worker's `RunClosures` stream broke (or the
//! worker fell silent, see `link/answers.rs`) while that closure was the oldest one
//! outstanding on it: the one the worker runs, since it runs a stream's closures in order.
//! Not counted: a worker that died while idle (the stream had nothing outstanding, or the
//! stream could not even be opened), closures queued behind the running one (they are
//! handed to other workers unstarted), a worker that drained for shutdown, and a silent
//! worker whose last heartbeat said it was not running the closure. Under pipelining the
//! oldest outstanding closure can be the wrong one: the worker finished it and died in the
//! next one before the answer left. So a closure charged once runs *alone* from then on
//! (no closure is pipelined behind it and it is not pipelined behind another); its later
//! deaths, if any, are its own.
//!
//! # How each died
//!
//! The link records what it saw (the stream's error, or the silence). How the process
//! ended is known only to whoever started it: a worker started by `LocalCluster`, or by a
//! supervisor that sets `JAXCLUSTER_PREVIOUS_EXIT`, reports its predecessor's exit status
//! or signal in `GetStatus.previous_exit`. The link reads it when the worker answers again
//! and fills it into every death it recorded for that address; a closure that reached its
//! bound waits up to [`POSTMORTEM_WAIT`] for that answer before it fails, so its error can
//! say how the last worker died. A worker that answers as the same process was frozen or
//! cut off, not dead; one that never answers stays "unknown".

use std::fmt::Write as _;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use super::closure::Closure;
use super::failure::{ClosureFailure, FailureKind};
use super::status::Incarnation;

/// How long a closure that reached `max_closure_retries` waits for its last worker to
/// answer again (and say how its predecessor ended) before failing with what is known.
pub const POSTMORTEM_WAIT: Duration = Duration::from_secs(5);

/// The `jaxcluster.errors` class of a closure that killed its workers too often.
pub const CRASHED_ERROR: &str = "WorkerCrashedError";

/// One death of a worker while it ran a closure.
#[derive(Debug)]
pub(crate) struct Death {
    /// The worker's index and address.
    pub index: usize,
    pub worker: String,
    /// What the link saw: the stream's error or the silence.
    pub observed: String,
    /// When the link saw it.
    pub at: Instant,
    /// The worker process the link knew when it died (its incarnation), to tell a restart
    /// from a freeze when the worker answers again.
    pub incarnation: Option<Incarnation>,
    /// How the process ended, once known (see the module documentation).
    ended: OnceLock<String>,
}

impl Death {
    pub fn new(
        index: usize,
        worker: &str,
        observed: &str,
        incarnation: Option<Incarnation>,
    ) -> Arc<Self> {
        Arc::new(Self {
            index,
            worker: worker.to_owned(),
            observed: observed.to_owned(),
            at: Instant::now(),
            incarnation,
            ended: OnceLock::new(),
        })
    }

    /// Explains the death from the worker's next `GetStatus` answer (its incarnation and
    /// `previous_exit`).
    pub fn explain(&self, now: Incarnation, previous_exit: &str) {
        let restarted = self.incarnation.is_some_and(|then| then != now);
        self.ended(how_it_ended(restarted, previous_exit));
    }

    /// Records how the process ended (the first answer wins).
    pub fn ended(&self, how: String) {
        let _ = self.ended.set(how);
    }

    /// Whether how it ended is known.
    pub fn is_explained(&self) -> bool {
        self.ended.get().is_some()
    }

    fn describe(&self) -> String {
        let ended = self.ended.get().map_or(
            "how the process ended is unknown (it has not answered since)",
            String::as_str,
        );
        format!(
            "worker {} ({}): {}; {ended}",
            self.index, self.worker, self.observed
        )
    }
}

/// What the successor's `GetStatus` says of the process that died: `previous_exit` when
/// the worker restarted, or that it is the same process.
pub(crate) fn how_it_ended(restarted: bool, previous_exit: &str) -> String {
    match (restarted, previous_exit.is_empty()) {
        (false, _) => "the same process answered again later (it was frozen or cut off, not \
                       dead)"
            .to_owned(),
        (true, false) => {
            format!("a new process took its place; the previous one ended: {previous_exit}")
        }
        (true, true) => "a new process took its place; how the previous one ended was not \
                         reported (its launcher can say so with JAXCLUSTER_PREVIOUS_EXIT)"
            .to_owned(),
    }
}

/// Whether `closure` has used up its retries: it was charged more deaths than `limit`.
pub(crate) fn exhausted(closure: &Closure, limit: Option<u32>) -> bool {
    limit.is_some_and(|limit| closure.deaths.len() > limit as usize)
}

/// The failure of a closure whose workers died under it more than `limit` times.
pub(crate) fn crashed(closure: &Closure, limit: u32) -> ClosureFailure {
    let mut message = format!(
        "closure {}{} was run {} times and its worker died under it every time, more than \
         max_closure_retries={limit} allows, so it was not run again; the closure itself may \
         be what kills its workers (a crash in native code, os._exit, running out of \
         memory). The deaths:",
        closure.id(),
        closure
            .function
            .name()
            .map_or_else(String::new, |name| format!(" ({name})")),
        closure.deaths.len(),
    );
    for (n, death) in closure.deaths.iter().enumerate() {
        let _ = write!(message, " {}. {}.", n + 1, death.describe());
    }
    let worker = closure
        .deaths
        .last()
        .map_or_else(String::new, |death| death.worker.clone());
    ClosureFailure {
        kind: FailureKind::Infra(tonic::Code::Aborted),
        type_name: CRASHED_ERROR.to_owned(),
        ..ClosureFailure::infra(tonic::Code::Aborted, message, &worker)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_death_says_what_was_seen_and_how_it_ended_once_known() {
        let death = Death::new(
            1,
            "h:2",
            "the stream broke: connection reset",
            Some(Incarnation::Random(7)),
        );
        assert!(!death.is_explained());
        assert!(death.describe().contains("unknown"), "{}", death.describe());
        death.explain(Incarnation::Random(8), "killed by signal 9 (SIGKILL)");
        death.ended("ignored".to_owned());
        let text = death.describe();
        assert!(
            text.starts_with("worker 1 (h:2): the stream broke"),
            "{text}"
        );
        assert!(
            text.contains("SIGKILL") && !text.contains("ignored"),
            "{text}"
        );
    }

    #[test]
    fn the_same_incarnation_answering_again_was_a_freeze() {
        let death = Death::new(
            0,
            "h:1",
            "sent nothing for 5.0 s",
            Some(Incarnation::Random(7)),
        );
        death.explain(Incarnation::Random(7), "");
        assert!(
            death.describe().contains("frozen or cut off"),
            "{}",
            death.describe()
        );
    }

    #[test]
    fn the_successor_tells_a_restart_from_a_freeze() {
        assert!(how_it_ended(false, "").contains("frozen"));
        assert!(how_it_ended(true, "exit status 3").contains("exit status 3"));
        assert!(how_it_ended(true, "").contains("JAXCLUSTER_PREVIOUS_EXIT"));
    }
}
