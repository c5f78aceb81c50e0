//! Typed errors of the device-name grammar and the TPU device map.
//!
//! Every message says what was wrong, the value seen, and what was expected; parse errors
//! also carry the bad segment and the whole input so a user can find it in a long name.

use std::fmt::{self, Write as _};

/// Which numeric field of a device spec a value was meant for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Field {
    /// `/replica:<int>`.
    Replica,
    /// `/task:<int>`.
    Task,
    /// The `<int>` of `/device:<TYPE>:<int>` or of a legacy `/gpu:<int>`.
    DeviceIndex,
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Field::Replica => "replica",
            Field::Task => "task",
            Field::DeviceIndex => "device index",
        })
    }
}

/// Why a string is not a valid replica, task or device index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IndexProblem {
    /// Nothing but whitespace.
    Empty,
    /// A well-formed integer below zero.
    Negative,
    /// Not an integer at all (letters, a decimal point, a stray `_`, ...).
    NotAnInteger,
    /// An integer that does not fit in 64 bits.
    TooLarge,
}

impl fmt::Display for IndexProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IndexProblem::Empty => "is empty",
            IndexProblem::Negative => "is negative",
            IndexProblem::NotAnInteger => "is not an integer",
            IndexProblem::TooLarge => "does not fit in 64 bits",
        })
    }
}

/// A device string that does not follow the TF device-name grammar.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceSpecError {
    /// A segment whose attribute is none of `job`, `replica`, `task`, `device` or a known
    /// bare device type.
    #[error(
        "invalid device spec {input:?}: unknown attribute {attribute:?} in segment {segment:?}; \
         expected job:<name>, replica:<int>, task:<int>, device:<TYPE>:<int|*>, or a bare \
         device type (cpu, gpu, tpu, custom, epu) with an optional :<int|*>{}",
        suggestion_suffix(*.suggestion)
    )]
    UnknownAttribute {
        /// The whole string being parsed.
        input: String,
        /// The `/`-separated segment that failed.
        segment: String,
        /// The text before the segment's first `:`.
        attribute: String,
        /// A known attribute the user probably meant (differs in case or whitespace).
        suggestion: Option<&'static str>,
    },
    /// A known attribute with the wrong number of `:`-separated parts.
    #[error("invalid device spec {input:?}: malformed segment {segment:?}; expected {expected}")]
    Malformed {
        /// The whole string being parsed.
        input: String,
        /// The `/`-separated segment that failed.
        segment: String,
        /// The shape this attribute takes.
        expected: &'static str,
    },
    /// A second device component after the first one.
    #[error(
        "invalid device spec {input:?}: multiple device types: segment {second:?} names a \
         device after {first:?}; expected at most one device component such as \
         '/device:GPU:0'"
    )]
    MultipleDeviceTypes {
        /// The whole string being parsed.
        input: String,
        /// The segment that named the first device.
        first: String,
        /// The segment that named another one.
        second: String,
    },
    /// A replica, task or device index that is not a non-negative integer.
    #[error(
        "invalid device spec {input:?}: segment {segment:?} has {field} {value:?}, which \
         {problem}; expected a non-negative integer{}",
        if matches!(.field, Field::DeviceIndex) { " or '*'" } else { "" }
    )]
    InvalidIndex {
        /// The whole string being parsed.
        input: String,
        /// The `/`-separated segment that failed.
        segment: String,
        /// Which field the value was for.
        field: Field,
        /// The text seen for it.
        value: String,
        /// What is wrong with it.
        problem: IndexProblem,
    },
}

fn suggestion_suffix(suggestion: Option<&'static str>) -> String {
    match suggestion {
        Some(known) => format!(
            "; did you mean {known:?}? (attribute names are case-sensitive and not trimmed)"
        ),
        None => String::new(),
    }
}

/// A list of device names that does not describe a TPU system.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TpuMapError {
    /// One of the names is not a device spec at all.
    #[error("cannot build the TPU device map: {0}")]
    BadName(#[from] DeviceSpecError),
    /// A TPU device without `/task:<int>`, so its host is unknown.
    #[error(
        "TPU device {name:?} has no task, so its host is unknown; expected a name like \
         '/job:worker/replica:0/task:3/device:TPU:7'"
    )]
    MissingTask {
        /// The device name.
        name: String,
    },
    /// A TPU device whose core index is absent or `*`.
    #[error(
        "TPU device {name:?} has no core index; expected a name like \
         '/job:worker/replica:0/task:3/device:TPU:7'"
    )]
    MissingCore {
        /// The device name.
        name: String,
    },
    /// The same (host, core) pair appears twice.
    #[error(
        "TPU core {core} of host {host} is listed twice (again as {name:?}); expected each core \
         once"
    )]
    DuplicateCore {
        /// The host (task) id.
        host: u64,
        /// The core index.
        core: u64,
        /// The name of the second occurrence.
        name: String,
    },
}

/// TPU hosts that do not all have the same number of cores.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "TPU hosts do not all have the same number of cores: {}; expected every host to have \
     the same count",
    describe_groups(.groups)
)]
pub struct CoreCountMismatch {
    /// `(cores per host, hosts with that many)`, most common count first, hosts sorted.
    pub groups: Vec<(usize, Vec<u64>)>,
}

/// Hosts listed per group before the rest are summarised, so a message about a
/// thousand-host slice stays readable.
const HOSTS_SHOWN: usize = 8;

fn describe_groups(groups: &[(usize, Vec<u64>)]) -> String {
    let parts: Vec<String> = groups
        .iter()
        .map(|(count, hosts)| {
            let shown: Vec<String> = hosts.iter().take(HOSTS_SHOWN).map(u64::to_string).collect();
            let mut list = shown.join(", ");
            if hosts.len() > HOSTS_SHOWN {
                let _ = write!(list, " and {} more", hosts.len() - HOSTS_SHOWN);
            }
            let noun = if hosts.len() == 1 { "host" } else { "hosts" };
            let cores = if *count == 1 { "core" } else { "cores" };
            format!("{noun} {list}: {count} {cores}")
        })
        .collect();
    parts.join("; ")
}
