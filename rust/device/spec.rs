//! The owned device spec: printing, merging, and conversion from a parse.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use super::error::DeviceSpecError;
use super::parse::{normalize_device_type, parse, DeviceSpecRef};

/// A job name or device type: borrowed from a static table for common names, so parsing
/// `/job:worker/.../device:GPU:0` allocates nothing, and owned otherwise.
pub type Name = Cow<'static, str>;

/// Names common enough to be worth sharing instead of allocating.
const COMMON_NAMES: [&str; 14] = [
    "CPU",
    "GPU",
    "TPU",
    "TPU_SYSTEM",
    "CUSTOM",
    "EPU",
    "worker",
    "chief",
    "ps",
    "localhost",
    "evaluator",
    "master",
    "coordinator",
    "tpu_worker",
];

/// Returns `name` as a [`Name`], sharing a static copy when it is a common one.
pub fn intern(name: &str) -> Name {
    match COMMON_NAMES.into_iter().find(|known| *known == name) {
        Some(known) => Cow::Borrowed(known),
        None => Cow::Owned(name.to_owned()),
    }
}

/// A TF device spec: `/job:<name>/replica:<int>/task:<int>/device:<TYPE>:<int|*>`, each
/// part optional.
///
/// ```
/// use _core::device::DeviceSpec;
/// let spec: DeviceSpec = "gpu:1/job:worker".parse().unwrap();
/// assert_eq!(spec.to_string(), "/job:worker/device:GPU:1");
/// let merged = spec.merged(&"/task:2".parse().unwrap());
/// assert_eq!(merged.to_string(), "/job:worker/task:2/device:GPU:1");
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct DeviceSpec {
    /// The job name (may be empty).
    pub job: Option<Name>,
    /// The replica index.
    pub replica: Option<u64>,
    /// The task index.
    pub task: Option<u64>,
    /// The device type, e.g. `GPU` or `TPU`.
    pub device_type: Option<Name>,
    /// The device index; `None` prints as `*` when a device type is set.
    pub device_index: Option<u64>,
}

impl DeviceSpec {
    /// Parses a TF device string; see [`parse`] for the grammar.
    pub fn parse(input: &str) -> Result<Self, DeviceSpecError> {
        parse(input).map(Self::from)
    }

    /// Sets the device type the way TF's constructor does (`cpu`/`gpu` upper-cased).
    #[must_use]
    pub fn with_device_type(mut self, device_type: Option<&str>) -> Self {
        self.device_type = device_type.map(|kind| intern(normalize_device_type(kind)));
        self
    }

    /// A spec with each field taken from `other` when `other` has it, else from `self`.
    #[must_use]
    pub fn merged(&self, other: &DeviceSpec) -> DeviceSpec {
        DeviceSpec {
            job: other.job.clone().or_else(|| self.job.clone()),
            replica: other.replica.or(self.replica),
            task: other.task.or(self.task),
            device_type: other
                .device_type
                .clone()
                .or_else(|| self.device_type.clone()),
            device_index: other.device_index.or(self.device_index),
        }
    }

    /// The borrowed view of this spec.
    pub fn as_ref(&self) -> DeviceSpecRef<'_> {
        DeviceSpecRef {
            job: self.job.as_deref(),
            replica: self.replica,
            task: self.task,
            device_type: self.device_type.as_deref(),
            device_index: self.device_index,
        }
    }

    /// True when no field is set (the spec of `""`).
    pub fn is_empty(&self) -> bool {
        *self == DeviceSpec::default()
    }
}

impl From<DeviceSpecRef<'_>> for DeviceSpec {
    fn from(spec: DeviceSpecRef<'_>) -> Self {
        DeviceSpec {
            job: spec.job.map(intern),
            replica: spec.replica,
            task: spec.task,
            device_type: spec.device_type.map(intern),
            device_index: spec.device_index,
        }
    }
}

impl FromStr for DeviceSpec {
    type Err = DeviceSpecError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        DeviceSpec::parse(input)
    }
}

/// Prints the present parts in TF's fixed order: job, replica, task, device.
impl fmt::Display for DeviceSpecRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(job) = self.job {
            write!(f, "/job:{job}")?;
        }
        if let Some(replica) = self.replica {
            write!(f, "/replica:{replica}")?;
        }
        if let Some(task) = self.task {
            write!(f, "/task:{task}")?;
        }
        if let Some(kind) = self.device_type {
            match self.device_index {
                Some(index) => write!(f, "/device:{kind}:{index}")?,
                None => write!(f, "/device:{kind}:*")?,
            }
        }
        Ok(())
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.as_ref().fmt(f)
    }
}
