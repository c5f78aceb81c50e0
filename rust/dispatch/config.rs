//! The dispatcher's settings, their defaults, and the environment variables kept from TF.

use std::time::Duration;

use super::ps_failures::DEFAULT_TRANSIENT_PS_FAILURES;
use super::DispatchError;

/// TF's `_CLOSURE_QUEUE_MAX_SIZE`.
pub const DEFAULT_MAX_QUEUE_SIZE: usize = 256 * 1024;
/// How long a failed worker is retried before it is given up (`JAXCLUSTER_WORKER_RECOVERY_SEC`).
pub const DEFAULT_RECOVERY_TIMEOUT: Duration = Duration::from_secs(3600);
/// Reconnection backoff cap, so a restarted worker is back in use within seconds.
pub const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// Closures a busy worker may have queued behind its running one when no worker is idle
/// (see `link/pipeline.rs` for the measurements behind the number).
pub const DEFAULT_PIPELINE_DEPTH: usize = 64;
/// Argument bytes a busy worker may have outstanding before its link stops pipelining: a
/// deep pipeline is for small closures, whose cost is per message; large arguments keep a
/// worker busy with two or three queued, and 64 of them would be gigabytes held on it.
pub const DEFAULT_PIPELINE_BYTES: usize = 32 * 1024 * 1024;
/// How long a worker running closures may stay silent before it is declared failed
/// (`JAXCLUSTER_HEARTBEAT_TIMEOUT_SEC`): a frozen or cut-off worker is noticed this fast.
pub const DEFAULT_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(5);
/// Deaths of its worker a closure survives before it fails (`JAXCLUSTER_MAX_CLOSURE_RETRIES`),
/// as Ray's `max_retries`.
pub const DEFAULT_MAX_CLOSURE_RETRIES: u32 = 3;
/// How long the coordinator waits to reach its first worker before failing what is
/// scheduled (`JAXCLUSTER_CONNECT_TIMEOUT_SEC`).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(60);

/// What a closure error does to the rest (see SPEC §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorPolicy {
    /// TF's behaviour: the first error is raised by the next `schedule`/`join`/`done`,
    /// cancelling every queued closure.
    CancelAll,
    /// The error stays on that closure's result only.
    PerClosure,
}

impl ErrorPolicy {
    /// Parses `"cancel_all"` or `"per_closure"`.
    pub fn parse(text: &str) -> Result<Self, DispatchError> {
        match text {
            "cancel_all" => Ok(Self::CancelAll),
            "per_closure" => Ok(Self::PerClosure),
            other => Err(DispatchError::InvalidArgument(format!(
                "error_policy={other:?} is not a policy; expected 'cancel_all' (TF's: the first \
                 error cancels every queued closure) or 'per_closure'"
            ))),
        }
    }
}

/// Staggered start, as TF's `TF_COORDINATOR_SCHEDULE_START_DELAY(_MAX)`: worker `i` waits
/// `i * per_worker` (at most `max`, when set) before taking its first work item.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StartDelay {
    /// Delay per worker index.
    pub per_worker: Duration,
    /// Cap on any worker's delay; `None` for no cap.
    pub max: Option<Duration>,
}

impl StartDelay {
    /// The delay of worker `index`.
    pub fn for_worker(&self, index: usize) -> Duration {
        let delay = self
            .per_worker
            .saturating_mul(u32::try_from(index).unwrap_or(u32::MAX));
        self.max.map_or(delay, |max| delay.min(max))
    }
}

/// Reconnection backoff: the first retry after `initial`, doubling up to `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackoffConfig {
    /// Delay before the first reconnection attempt after a failed probe.
    pub initial: Duration,
    /// Largest delay between attempts.
    pub max: Duration,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(50),
            max: MAX_BACKOFF,
        }
    }
}

/// Everything a [`Dispatcher`](super::Dispatcher) is configured with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DispatcherConfig {
    /// Bound of the global closure queue; 0 for unbounded.
    pub max_queue_size: usize,
    /// What a closure error does to the rest.
    pub error_policy: ErrorPolicy,
    /// Bound on one execution; expiry retries once elsewhere, then fails the closure.
    pub closure_timeout: Option<Duration>,
    /// How long a failed worker is retried before it is given up.
    pub recovery_timeout: Duration,
    /// Staggered start.
    pub start_delay: StartDelay,
    /// Reconnection backoff.
    pub backoff: BackoffConfig,
    /// Bound on one `GetStatus` probe.
    pub probe_timeout: Duration,
    /// Closures a busy worker may have queued behind its running one, sent only while no
    /// worker is idle; 0 turns pipelining off. Ignored (0) under `closure_timeout`.
    pub pipeline_depth: usize,
    /// Argument bytes (pickles and buffers) a link may have outstanding on its worker and
    /// still pipeline another closure; an idle link sends what it takes, whatever its size.
    pub pipeline_bytes: usize,
    /// Reports about one ps task at which its failure stops being transient (TF's
    /// `TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES`); 0 treats every report as lasting.
    pub transient_ps_failures: u32,
    /// Silence after which a worker running closures is declared failed (workers of
    /// protocol revision 4 and later, which answer heartbeats); `None`: only the transport
    /// notices (HTTP/2 keepalive, about 40 s).
    pub heartbeat_timeout: Option<Duration>,
    /// Times a closure may run again after its worker died under it; `None`: without
    /// bound (TF's behaviour).
    pub max_closure_retries: Option<u32>,
    /// If no worker has answered this long after the dispatcher started, what is scheduled
    /// fails with `UNAVAILABLE` naming every worker and its last error; `None`: wait for
    /// the recovery bound (TF's behaviour).
    pub connect_timeout: Option<Duration>,
    /// Hosts per slice of the first workers, by index (1 past the end; workers added
    /// later say their own through `Dispatcher::add_slices`): a worker whose `GetStatus`
    /// reports another slice size, or a rank other than 0, is not used (see `slices.rs`).
    pub slice_sizes: Vec<u32>,
    /// The coordinator's own Python, JAX and jaxcluster versions, against which each
    /// worker's are checked when its link connects (see `versions.rs`); `None`: not checked.
    pub versions: Option<crate::dispatch::versions::Versions>,
}

impl Default for DispatcherConfig {
    fn default() -> Self {
        Self {
            max_queue_size: DEFAULT_MAX_QUEUE_SIZE,
            error_policy: ErrorPolicy::CancelAll,
            closure_timeout: None,
            recovery_timeout: DEFAULT_RECOVERY_TIMEOUT,
            start_delay: StartDelay::default(),
            backoff: BackoffConfig::default(),
            probe_timeout: Duration::from_secs(5),
            pipeline_depth: DEFAULT_PIPELINE_DEPTH,
            pipeline_bytes: DEFAULT_PIPELINE_BYTES,
            transient_ps_failures: DEFAULT_TRANSIENT_PS_FAILURES,
            heartbeat_timeout: Some(DEFAULT_HEARTBEAT_TIMEOUT),
            max_closure_retries: Some(DEFAULT_MAX_CLOSURE_RETRIES),
            connect_timeout: Some(DEFAULT_CONNECT_TIMEOUT),
            slice_sizes: Vec::new(),
            versions: None,
        }
    }
}

impl DispatcherConfig {
    /// How many hosts worker `index`'s slice must have (1: a worker of its own).
    #[must_use]
    pub fn slice_size(&self, index: usize) -> u32 {
        self.slice_sizes.get(index).copied().unwrap_or(1)
    }

    /// The defaults, with the environment variables applied: `JAXCLUSTER_WORKER_RECOVERY_SEC`,
    /// the staggered-start pair (`TF_COORDINATOR_SCHEDULE_START_DELAY(_MAX)`) and
    /// `TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES`, each `TF_` name with a
    /// `JAXCLUSTER_COORDINATOR_…` alias that wins when both are set; and
    /// `JAXCLUSTER_HEARTBEAT_TIMEOUT_SEC`, `JAXCLUSTER_MAX_CLOSURE_RETRIES` and
    /// `JAXCLUSTER_CONNECT_TIMEOUT_SEC`, where `none` means no bound.
    pub fn from_env() -> Result<Self, DispatchError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// [`from_env`](Self::from_env) reading variables through `lookup`.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, DispatchError> {
        let mut config = Self::default();
        if let Some(recovery) = seconds_var(&lookup, &["JAXCLUSTER_WORKER_RECOVERY_SEC"])? {
            config.recovery_timeout = recovery;
        }
        let per_worker = seconds_var(
            &lookup,
            &[
                "JAXCLUSTER_COORDINATOR_SCHEDULE_START_DELAY",
                "TF_COORDINATOR_SCHEDULE_START_DELAY",
            ],
        )?;
        let max = seconds_var(
            &lookup,
            &[
                "JAXCLUSTER_COORDINATOR_SCHEDULE_START_DELAY_MAX",
                "TF_COORDINATOR_SCHEDULE_START_DELAY_MAX",
            ],
        )?;
        config.start_delay = StartDelay {
            per_worker: per_worker.unwrap_or_default(),
            // As in TF, a cap of 0 means "no cap".
            max: max.filter(|max| !max.is_zero()),
        };
        if let Some(threshold) = count_var(
            &lookup,
            &[
                "JAXCLUSTER_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES",
                "TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES",
            ],
        )? {
            config.transient_ps_failures = threshold;
        }
        if let Some(timeout) = optional_var(&lookup, "JAXCLUSTER_HEARTBEAT_TIMEOUT_SEC", |text| {
            positive_seconds(text)
        })? {
            config.heartbeat_timeout = timeout;
        }
        if let Some(retries) = optional_var(&lookup, "JAXCLUSTER_MAX_CLOSURE_RETRIES", |text| {
            text.parse::<u32>().ok()
        })? {
            config.max_closure_retries = retries;
        }
        if let Some(timeout) = optional_var(&lookup, "JAXCLUSTER_CONNECT_TIMEOUT_SEC", |text| {
            positive_seconds(text)
        })? {
            config.connect_timeout = timeout;
        }
        Ok(config)
    }

    /// How often a link pings a worker it waits on (a fifth of the heartbeat timeout).
    pub fn ping_interval(&self) -> Option<Duration> {
        self.heartbeat_timeout.map(|timeout| timeout / 5)
    }

    /// The lease a link grants its worker's streams: nine tenths of the heartbeat timeout,
    /// which leaves room for the two clocks running at slightly different rates (see
    /// `worker/stream.rs` for why a lease no longer than the timeout is safe).
    pub fn lease(&self) -> Option<Duration> {
        self.heartbeat_timeout.map(|timeout| timeout * 9 / 10)
    }
}

/// A positive, finite number of seconds.
fn positive_seconds(text: &str) -> Option<Duration> {
    parse_seconds(text).filter(|d| !d.is_zero())
}

/// Parses the variable `name` if set and not blank: `none` (any case) is `Some(None)`,
/// anything `parse` accepts is `Some(Some(value))`, the rest is refused saying what is
/// expected.
// The three cases are the variable's own (unset, `none`, a bound), each meaning something
// different to the caller; the nesting reads as exactly that.
#[allow(clippy::option_option)]
fn optional_var<V>(
    lookup: &impl Fn(&str) -> Option<String>,
    name: &str,
    parse: impl Fn(&str) -> Option<V>,
) -> Result<Option<Option<V>>, DispatchError> {
    let Some(raw) = lookup(name) else {
        return Ok(None);
    };
    let text = raw.trim();
    if text.is_empty() {
        return Ok(None);
    }
    if text.eq_ignore_ascii_case("none") {
        return Ok(Some(None));
    }
    parse(text).map(|value| Some(Some(value))).ok_or_else(|| {
        let expected = if name.ends_with("_SEC") {
            "a positive number of seconds such as 5 or 0.5"
        } else {
            "a count such as 3 (0: never run again)"
        };
        DispatchError::InvalidArgument(format!(
            "environment variable {name}={raw:?} is not valid; expected {expected}, or 'none' \
             for no bound"
        ))
    })
}

/// Parses an integer count from the first of `names` that is set and not blank; as in
/// TF, a negative count means the same as 0.
fn count_var(
    lookup: &impl Fn(&str) -> Option<String>,
    names: &[&str],
) -> Result<Option<u32>, DispatchError> {
    for name in names {
        let Some(raw) = lookup(name) else { continue };
        let text = raw.trim();
        if text.is_empty() {
            continue;
        }
        return match text.parse::<i64>() {
            Ok(count) => Ok(Some(u32::try_from(count.max(0)).unwrap_or(u32::MAX))),
            Err(_) => Err(DispatchError::InvalidArgument(format!(
                "environment variable {name}={raw:?} is not an integer; expected how many \
                 failure reports per ps task to treat as transient, such as 3 (0 treats \
                 every report as lasting)"
            ))),
        };
    }
    Ok(None)
}

/// Parses a non-negative number of seconds from the first of `names` that is set and not
/// blank.
fn seconds_var(
    lookup: &impl Fn(&str) -> Option<String>,
    names: &[&str],
) -> Result<Option<Duration>, DispatchError> {
    for name in names {
        let Some(raw) = lookup(name) else { continue };
        let text = raw.trim();
        if text.is_empty() {
            continue;
        }
        return parse_seconds(text).map(Some).ok_or_else(|| {
            DispatchError::InvalidArgument(format!(
                "environment variable {name}={raw:?} is not a number of seconds; expected \
                     a non-negative number such as 30 or 0.5"
            ))
        });
    }
    Ok(None)
}

/// A non-negative, finite number of seconds.
pub(crate) fn parse_seconds(text: &str) -> Option<Duration> {
    let seconds: f64 = text.parse().ok()?;
    Duration::try_from_secs_f64(seconds).ok()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn config_from(vars: &[(&str, &str)]) -> Result<DispatcherConfig, DispatchError> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        DispatcherConfig::from_lookup(|name| vars.get(name).cloned())
    }

    #[test]
    fn tf_start_delay_variables_are_read_and_capped() {
        let config = config_from(&[
            ("TF_COORDINATOR_SCHEDULE_START_DELAY", "2"),
            ("TF_COORDINATOR_SCHEDULE_START_DELAY_MAX", "5"),
        ])
        .unwrap();
        let delays: Vec<u64> = (0..5)
            .map(|i| config.start_delay.for_worker(i).as_secs())
            .collect();
        assert_eq!(delays, [0, 2, 4, 5, 5]);
    }

    #[test]
    fn jaxcluster_aliases_win_and_zero_cap_means_none() {
        let config = config_from(&[
            ("TF_COORDINATOR_SCHEDULE_START_DELAY", "2"),
            ("JAXCLUSTER_COORDINATOR_SCHEDULE_START_DELAY", "0.5"),
            ("TF_COORDINATOR_SCHEDULE_START_DELAY_MAX", "0"),
            ("JAXCLUSTER_WORKER_RECOVERY_SEC", "12"),
        ])
        .unwrap();
        assert_eq!(config.start_delay.per_worker, Duration::from_millis(500));
        assert_eq!(config.start_delay.max, None);
        assert_eq!(config.start_delay.for_worker(100), Duration::from_secs(50));
        assert_eq!(config.recovery_timeout, Duration::from_secs(12));
    }

    #[test]
    fn unset_variables_keep_the_defaults() {
        assert_eq!(config_from(&[]).unwrap(), DispatcherConfig::default());
        assert_eq!(
            config_from(&[("TF_COORDINATOR_SCHEDULE_START_DELAY", "  ")]).unwrap(),
            DispatcherConfig::default()
        );
    }

    #[test]
    fn bad_values_are_refused_naming_the_variable_and_value() {
        for bad in ["soon", "-1", "nan", "inf"] {
            let err = config_from(&[("JAXCLUSTER_WORKER_RECOVERY_SEC", bad)]).unwrap_err();
            let text = err.to_string();
            assert!(text.contains("JAXCLUSTER_WORKER_RECOVERY_SEC"), "{text}");
            assert!(text.contains(bad), "{text}");
        }
    }

    #[test]
    fn the_transient_ps_failure_threshold_is_read_with_its_alias() {
        assert_eq!(config_from(&[]).unwrap().transient_ps_failures, 3);
        let tf = config_from(&[("TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES", " 5 ")]).unwrap();
        assert_eq!(tf.transient_ps_failures, 5);
        let both = config_from(&[
            ("TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES", "5"),
            ("JAXCLUSTER_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES", "1"),
        ])
        .unwrap();
        assert_eq!(both.transient_ps_failures, 1);
        let negative =
            config_from(&[("TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES", "-2")]).unwrap();
        assert_eq!(negative.transient_ps_failures, 0);
        let err = config_from(&[("TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES", "2.5")])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES") && err.contains("2.5"),
            "{err}"
        );
    }

    #[test]
    fn the_issue_16_bounds_are_read_with_none_for_unbounded() {
        let defaults = config_from(&[]).unwrap();
        assert_eq!(defaults.heartbeat_timeout, Some(Duration::from_secs(5)));
        assert_eq!(defaults.max_closure_retries, Some(3));
        assert_eq!(defaults.connect_timeout, Some(Duration::from_secs(60)));
        assert_eq!(defaults.ping_interval(), Some(Duration::from_secs(1)));
        assert_eq!(defaults.lease(), Some(Duration::from_millis(4500)));
        let set = config_from(&[
            ("JAXCLUSTER_HEARTBEAT_TIMEOUT_SEC", "2.5"),
            ("JAXCLUSTER_MAX_CLOSURE_RETRIES", "0"),
            ("JAXCLUSTER_CONNECT_TIMEOUT_SEC", "None"),
        ])
        .unwrap();
        assert_eq!(set.heartbeat_timeout, Some(Duration::from_millis(2500)));
        assert_eq!(set.max_closure_retries, Some(0));
        assert_eq!(set.connect_timeout, None);
        for (name, bad) in [
            ("JAXCLUSTER_HEARTBEAT_TIMEOUT_SEC", "0"),
            ("JAXCLUSTER_MAX_CLOSURE_RETRIES", "-1"),
            ("JAXCLUSTER_CONNECT_TIMEOUT_SEC", "soon"),
        ] {
            let err = config_from(&[(name, bad)]).unwrap_err().to_string();
            assert!(
                err.contains(name) && err.contains(bad) && err.contains("'none'"),
                "{err}"
            );
        }
    }

    #[test]
    fn policies_parse_or_say_what_is_expected() {
        assert_eq!(
            ErrorPolicy::parse("per_closure").unwrap(),
            ErrorPolicy::PerClosure
        );
        let err = ErrorPolicy::parse("cancel-all").unwrap_err().to_string();
        assert!(
            err.contains("'cancel_all'") && err.contains("cancel-all"),
            "{err}"
        );
    }
}
