//! Whether a worker's software can run what this coordinator sends it: its Python, JAX
//! and jaxcluster versions against the coordinator's own.
//!
//! Some combinations fail only later, inside a closure, with an error that says nothing
//! about versions; the link therefore checks every `GetStatus` it connects with (as it
//! checks a slice's shape, see `slices.rs`) and applies these rules:
//!
//! - Python `major.minor` differs: **refused**. Closures travel as cloudpickled code
//!   objects, whose bytecode does not load across Python minor versions. The link stays
//!   out of service (it keeps asking, since the worker may be restarted with another
//!   Python, and gives up after the recovery bound), its last error naming both versions
//!   and the fix; logged at ERROR once per link.
//! - The coordinator's JAX `major.minor` is newer than the worker's: **refused**. A
//!   `jax.export` artifact serialized by a newer JAX may not deserialize on an older one.
//! - The worker's JAX is newer, or only the patch level differs: a WARNING once per link.
//! - jaxcluster versions differ: a WARNING once per link (the protocol revision already
//!   guards the wire).
//! - A version empty or unparseable on either side (an older worker that does not report
//!   its Python version, a coordinator that did not say its own): a WARNING, never a
//!   refusal.

use crate::rpc::pb;

/// The Python, JAX and jaxcluster versions of one process (e.g. `3.11.4`, `0.6.2`,
/// `0.10.2`); an empty string is "not known".
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Versions {
    /// `major.minor.micro` of the interpreter.
    pub python: String,
    /// `jax.__version__`.
    pub jax: String,
    /// `jaxcluster.__version__`.
    pub jaxcluster: String,
}

impl Versions {
    /// What a worker reported in its `GetStatus`.
    #[must_use]
    pub fn of_worker(status: &pb::GetStatusResponse) -> Self {
        Self {
            python: status.python_version.clone(),
            jax: status.jax_version.clone(),
            jaxcluster: status.jaxcluster_version.clone(),
        }
    }
}

/// What the comparison found: a reason to refuse the worker, and what to warn about.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// Why the worker cannot serve this coordinator, or `None` when it can.
    pub refusal: Option<String>,
    /// Differences that may matter, each a sentence naming both versions.
    pub warnings: Vec<String>,
}

/// `major.minor` of a version string (`3.11.4`, `0.4.36.dev20241201`, `3.13.0rc1`), or
/// `None` when it does not start with two numbers.
fn major_minor(version: &str) -> Option<(u32, u32)> {
    let mut parts = version.trim().split('.');
    let major = parts.next()?.parse().ok()?;
    let minor: String = parts
        .next()?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    Some((major, minor.parse().ok()?))
}

/// Compares the worker at `address` (`theirs`) with this coordinator (`own`).
pub(crate) fn compare(own: &Versions, theirs: &Versions, address: &str) -> Verdict {
    let mut verdict = Verdict::default();
    let (ours, worker) = (&own.python, &theirs.python);
    match (major_minor(ours), major_minor(worker)) {
        (Some(a), Some(b)) if a != b => {
            verdict.refusal = Some(format!(
                "worker {address} runs Python {worker}, this coordinator Python {ours}: \
                 closures are pickled code objects, which do not load across Python minor \
                 versions; run the coordinator and workers on the same Python minor version"
            ));
        }
        (Some(_), Some(_)) => {}
        _ => verdict.warnings.push(format!(
            "cannot compare the Python version of worker {address} ({}) with this \
             coordinator's ({}); closures fail to load if their minor versions differ",
            or_unknown(worker),
            or_unknown(ours),
        )),
    }
    let (ours, worker) = (&own.jax, &theirs.jax);
    match (major_minor(ours), major_minor(worker)) {
        (Some(a), Some(b)) if a > b => {
            if verdict.refusal.is_none() {
                verdict.refusal = Some(format!(
                    "worker {address} runs JAX {worker}, older than this coordinator's JAX \
                     {ours}: a jax.export artifact from a newer JAX may not deserialize on an \
                     older one; upgrade the worker's JAX to {ours}"
                ));
            }
        }
        (Some(_), Some(_)) if ours != worker => verdict.warnings.push(format!(
            "worker {address} runs JAX {worker}, this coordinator JAX {ours}; run the same \
             JAX version everywhere to rule out differences"
        )),
        (Some(_), Some(_)) => {}
        _ => verdict.warnings.push(format!(
            "cannot compare the JAX version of worker {address} ({}) with this \
             coordinator's ({})",
            or_unknown(worker),
            or_unknown(ours),
        )),
    }
    if own.jaxcluster != theirs.jaxcluster {
        verdict.warnings.push(format!(
            "worker {address} runs jaxcluster {}, this coordinator jaxcluster {}; install \
             the same release everywhere",
            or_unknown(&theirs.jaxcluster),
            or_unknown(&own.jaxcluster),
        ));
    }
    verdict
}

fn or_unknown(version: &str) -> &str {
    if version.trim().is_empty() {
        "not reported"
    } else {
        version
    }
}

/// One link's version check: the coordinator's versions and what it already logged, so
/// a worker that keeps answering is reported once, not on every probe.
#[derive(Debug, Default)]
pub(crate) struct VersionCheck {
    /// The refusal last logged at ERROR.
    refused: Option<String>,
    /// Whether this link's warnings were logged.
    warned: bool,
}

impl VersionCheck {
    /// Why the worker that answered `status` cannot serve a coordinator of versions `own`
    /// (`None`: not checked), logging the refusal or the warnings once per link.
    pub fn refusal(
        &mut self,
        own: Option<&Versions>,
        status: &pb::GetStatusResponse,
        address: &str,
        index: usize,
    ) -> Option<String> {
        let verdict = compare(own?, &Versions::of_worker(status), address);
        if let Some(reason) = &verdict.refusal {
            if self.refused.as_ref() != Some(reason) {
                tracing::error!(
                    target: crate::log_target::DISPATCH,
                    worker = address,
                    worker_index = index,
                    "worker {address} (worker {index}) is not used: {reason}"
                );
                self.refused = Some(reason.clone());
            }
        } else if !self.warned && !verdict.warnings.is_empty() {
            self.warned = true;
            for warning in &verdict.warnings {
                tracing::warn!(
                    target: crate::log_target::DISPATCH,
                    worker = address,
                    worker_index = index,
                    "{warning}"
                );
            }
        }
        verdict.refusal
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(python: &str, jax: &str, jaxcluster: &str) -> Versions {
        Versions {
            python: python.to_owned(),
            jax: jax.to_owned(),
            jaxcluster: jaxcluster.to_owned(),
        }
    }

    #[test]
    fn parses_major_minor() {
        assert_eq!(major_minor("3.11.4"), Some((3, 11)));
        assert_eq!(major_minor("0.4.36.dev20241201"), Some((0, 4)));
        assert_eq!(major_minor("3.13rc1"), Some((3, 13)));
        assert_eq!(major_minor(""), None);
        assert_eq!(major_minor("unknown"), None);
        assert_eq!(major_minor("3"), None);
    }

    #[test]
    fn the_same_versions_pass_silently() {
        let own = v("3.11.4", "0.6.2", "0.10.2");
        assert_eq!(compare(&own, &own, "h:1"), Verdict::default());
    }

    #[test]
    fn another_python_patch_passes_silently() {
        let verdict = compare(
            &v("3.11.4", "0.6.2", "1"),
            &v("3.11.9", "0.6.2", "1"),
            "h:1",
        );
        assert_eq!(verdict, Verdict::default());
    }

    #[test]
    fn another_python_minor_is_refused_naming_both_and_the_fix() {
        let verdict = compare(
            &v("3.11.4", "0.6.2", "1"),
            &v("3.12.1", "0.6.2", "1"),
            "h:7",
        );
        let why = verdict.refusal.unwrap();
        assert!(why.contains("worker h:7 runs Python 3.12.1"), "{why}");
        assert!(why.contains("coordinator Python 3.11.4"), "{why}");
        assert!(why.contains("same Python minor version"), "{why}");
    }

    #[test]
    fn an_older_worker_jax_is_refused_a_newer_one_warned() {
        let older = compare(
            &v("3.11.4", "0.6.2", "1"),
            &v("3.11.4", "0.5.3", "1"),
            "h:1",
        );
        let why = older.refusal.unwrap();
        assert!(
            why.contains("JAX 0.5.3") && why.contains("JAX 0.6.2"),
            "{why}"
        );
        let newer = compare(
            &v("3.11.4", "0.5.3", "1"),
            &v("3.11.4", "0.6.0", "1"),
            "h:1",
        );
        assert_eq!(newer.refusal, None);
        assert_eq!(newer.warnings.len(), 1, "{:?}", newer.warnings);
        assert!(
            newer.warnings[0].contains("JAX 0.6.0"),
            "{:?}",
            newer.warnings
        );
        let patch = compare(
            &v("3.11.4", "0.6.2", "1"),
            &v("3.11.4", "0.6.0", "1"),
            "h:1",
        );
        assert_eq!(patch.refusal, None);
        assert_eq!(patch.warnings.len(), 1, "{:?}", patch.warnings);
    }

    #[test]
    fn another_jaxcluster_is_warned() {
        let verdict = compare(
            &v("3.11.4", "0.6.2", "0.10.2"),
            &v("3.11.4", "0.6.2", "0.9.0"),
            "h:1",
        );
        assert_eq!(verdict.refusal, None);
        assert_eq!(verdict.warnings.len(), 1);
        assert!(
            verdict.warnings[0].contains("jaxcluster 0.9.0"),
            "{:?}",
            verdict.warnings
        );
    }

    #[test]
    fn unknown_versions_are_warned_never_refused() {
        let verdict = compare(&v("3.11.4", "0.6.2", "1"), &v("", "garbage", "1"), "h:1");
        assert_eq!(verdict.refusal, None);
        assert_eq!(verdict.warnings.len(), 2, "{:?}", verdict.warnings);
        assert!(
            verdict.warnings[0].contains("not reported"),
            "{:?}",
            verdict.warnings
        );
    }

    #[test]
    fn a_check_logs_once_and_refuses_every_time() {
        let own = v("3.11.4", "0.6.2", "1");
        let status = pb::GetStatusResponse {
            python_version: "3.12.0".to_owned(),
            jax_version: "0.6.2".to_owned(),
            jaxcluster_version: "1".to_owned(),
            ..pb::GetStatusResponse::default()
        };
        let mut check = VersionCheck::default();
        assert!(check.refusal(Some(&own), &status, "h:1", 0).is_some());
        assert!(check.refusal(Some(&own), &status, "h:1", 0).is_some());
        assert_eq!(check.refusal(None, &status, "h:1", 0), None);
    }
}
