//! The TPU system layout read off a list of device names: which cores each host has.

use std::collections::{BTreeMap, HashSet};

use super::error::{CoreCountMismatch, TpuMapError};
use super::parse::parse;

/// TPU cores per host, as TF's `tpu_system_metadata` derives them from device names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TpuDeviceMap {
    /// Host (task) id → its TPU core indices, sorted; hosts in ascending order.
    pub hosts: BTreeMap<u64, Vec<u64>>,
    /// The number of TPU cores across all hosts.
    pub total_cores: usize,
}

/// Groups the TPU devices among `names` by host.
///
/// A name such as `/job:worker/replica:0/task:3/device:TPU:7` is core 7 of host 3. Devices
/// of other types (`CPU`, `GPU`, `TPU_SYSTEM`, ...) are ignored; a name that does not parse,
/// a TPU without a task or core index, or a core listed twice is an error.
///
/// ```
/// let map = _core::device::tpu_device_map([
///     "/job:worker/task:1/device:TPU:1",
///     "/job:worker/task:1/device:CPU:0",
///     "/job:worker/task:1/device:TPU:0",
/// ])
/// .unwrap();
/// assert_eq!(map.hosts[&1], vec![0, 1]);
/// assert_eq!(map.total_cores, 2);
/// ```
pub fn tpu_device_map<I, S>(names: I) -> Result<TpuDeviceMap, TpuMapError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let mut map = TpuDeviceMap::default();
    let mut seen: HashSet<(u64, u64)> = HashSet::new();
    for name in names {
        let name = name.as_ref();
        let spec = parse(name)?;
        if spec.device_type != Some("TPU") {
            continue;
        }
        let host = spec.task.ok_or_else(|| TpuMapError::MissingTask {
            name: name.to_owned(),
        })?;
        let core = spec.device_index.ok_or_else(|| TpuMapError::MissingCore {
            name: name.to_owned(),
        })?;
        if !seen.insert((host, core)) {
            return Err(TpuMapError::DuplicateCore {
                host,
                core,
                name: name.to_owned(),
            });
        }
        map.hosts.entry(host).or_default().push(core);
        map.total_cores += 1;
    }
    for cores in map.hosts.values_mut() {
        cores.sort_unstable();
    }
    Ok(map)
}

/// Returns the number of cores every host has (0 for no hosts), or an error naming the
/// hosts whose counts differ.
///
/// ```
/// use _core::device::verify_same_core_count;
/// assert_eq!(verify_same_core_count([(0, 8), (1, 8)]), Ok(8));
/// let err = verify_same_core_count([(0, 8), (1, 4)]).unwrap_err();
/// assert!(err.to_string().contains("host 1: 4 cores"));
/// ```
pub fn verify_same_core_count<I>(cores_per_host: I) -> Result<usize, CoreCountMismatch>
where
    I: IntoIterator<Item = (u64, usize)>,
{
    let mut by_count: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
    for (host, count) in cores_per_host {
        by_count.entry(count).or_default().push(host);
    }
    if by_count.len() <= 1 {
        return Ok(by_count.into_keys().next().unwrap_or(0));
    }
    let mut groups: Vec<(usize, Vec<u64>)> = by_count.into_iter().collect();
    for (_, hosts) in &mut groups {
        hosts.sort_unstable();
    }
    // The most common count first: the hosts that differ from it are the suspects.
    groups.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(b.0.cmp(&a.0)));
    Err(CoreCountMismatch { groups })
}
