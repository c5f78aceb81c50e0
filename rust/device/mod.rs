//! TF device names: the `DeviceSpec` grammar and the TPU device map, with no `PyO3` here.
//!
//! [`parse`] reads a device string into a borrowed [`DeviceSpecRef`] without allocating;
//! [`DeviceSpec`] is the owned form that prints back in TF's canonical order and merges.
//! [`tpu_device_map`] and [`verify_same_core_count`] read a TPU system's layout off device
//! names, as TF's `tpu_system_metadata` does.
//!
//! ```
//! use _core::device::DeviceSpec;
//! let spec = DeviceSpec::parse("/task:1/job:worker/replica:0/gpu:*").unwrap();
//! assert_eq!(spec.to_string(), "/job:worker/replica:0/task:1/device:GPU:*");
//! ```

mod canonical;
mod error;
mod parse;
mod spec;
mod split;
mod tpu;

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

pub use error::{CoreCountMismatch, DeviceSpecError, Field, IndexProblem, TpuMapError};
pub use parse::{normalize_device_type, parse, parse_index, DeviceSpecRef};
pub use spec::{intern, DeviceSpec, Name};
pub use tpu::{tpu_device_map, verify_same_core_count, TpuDeviceMap};
