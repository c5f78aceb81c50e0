//! The owned device spec: printing, merging, and conversion from a parse.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

use super::error::DeviceSpecError;
use super::parse::{normalize_device_type, parse, DeviceSpecRef};

/// A job name or device type: borrowed from a static table for common names, so parsing
/// `/job:worker/.../device:GPU:0` allocates nothing, and owned otherwise.
pub type Name = Cow<'static, str>;

/// Returns `name` as a [`Name`], sharing a static copy when it is a common one.
pub fn intern(name: &str) -> Name {
    // A `match` compiles to a switch on length before comparing bytes.
    Cow::Borrowed(match name {
        "CPU" => "CPU",
        "GPU" => "GPU",
        "TPU" => "TPU",
        "TPU_SYSTEM" => "TPU_SYSTEM",
        "CUSTOM" => "CUSTOM",
        "EPU" => "EPU",
        "worker" => "worker",
        "chief" => "chief",
        "ps" => "ps",
        "localhost" => "localhost",
        "evaluator" => "evaluator",
        "master" => "master",
        "coordinator" => "coordinator",
        "tpu_worker" => "tpu_worker",
        other => return Cow::Owned(other.to_owned()),
    })
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

    /// The canonical string, as `to_string()` but allocated once at the right size.
    pub fn render(&self) -> String {
        let spec = self.as_ref();
        let names = spec.job.map_or(0, str::len) + spec.device_type.map_or(0, str::len);
        // Four prefixes and four numbers fit in 100 bytes beyond the names.
        let mut out = String::with_capacity(names + 100);
        let _ = fmt::Write::write_fmt(&mut out, format_args!("{spec}"));
        out
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
///
/// Written piecewise with a hand-rolled integer formatter: `write!` with format arguments
/// made printing several times slower than parsing.
impl fmt::Display for DeviceSpecRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut digits = [0u8; 20];
        if let Some(job) = self.job {
            f.write_str("/job:")?;
            f.write_str(job)?;
        }
        if let Some(replica) = self.replica {
            f.write_str("/replica:")?;
            f.write_str(decimal(replica, &mut digits))?;
        }
        if let Some(task) = self.task {
            f.write_str("/task:")?;
            f.write_str(decimal(task, &mut digits))?;
        }
        if let Some(kind) = self.device_type {
            f.write_str("/device:")?;
            f.write_str(kind)?;
            f.write_str(":")?;
            match self.device_index {
                Some(index) => f.write_str(decimal(index, &mut digits))?,
                None => f.write_str("*")?,
            }
        }
        Ok(())
    }
}

/// Formats `value` in base 10 into the end of `buf`.
fn decimal(mut value: u64, buf: &mut [u8; 20]) -> &str {
    let mut start = buf.len();
    loop {
        start -= 1;
        buf[start] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    std::str::from_utf8(&buf[start..]).unwrap_or("")
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.as_ref().fmt(f)
    }
}
