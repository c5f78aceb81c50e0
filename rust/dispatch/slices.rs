//! Whether a worker is what the coordinator groups it as: a worker of its own, or rank 0
//! of a multi-host slice of the expected size.
//!
//! A sliced coordinator (`hosts_per_slice=K`) sends each closure to one host per slice,
//! which forwards it to the other K-1 and runs it SPMD with them. Sending closures to a
//! host that is not rank 0, or to a worker whose slice size differs, would run an SPMD
//! program on the wrong set of hosts: its collectives would wait for hosts that never
//! join, or a slice's hosts would sit idle. The link therefore checks every `GetStatus`
//! it connects with and treats a mismatch as a worker it cannot use (it keeps asking,
//! since the worker may be restarted with the right flags, and gives up after the
//! recovery bound), with a message that names both sides and the fix.

use crate::rpc::pb;

/// Why the worker that answered `status` cannot serve as a slice of `expected` hosts
/// (1: a worker of its own), or `None` when it can. `address` names it in the message.
pub(crate) fn mismatch(
    status: &pb::GetStatusResponse,
    expected: u32,
    address: &str,
) -> Option<String> {
    let expected = expected.max(1);
    let (rank, size, index) = match status.slice {
        Some(slice) if slice.size > 1 => (slice.rank, slice.size, slice.index),
        _ => (0, 1, 0),
    };
    if rank != 0 {
        return Some(format!(
            "worker {address} is rank {rank} of slice {index} ({size} hosts): closures go to \
             a slice's rank 0, which runs them on every host; list rank 0 first \
             (hosts_per_slice={size} groups consecutive worker tasks)"
        ));
    }
    if size == expected {
        return None;
    }
    Some(if size == 1 {
        format!(
            "worker {address} is not a host of a slice, but this coordinator groups its \
             workers into slices of {expected} hosts; start each host with `jaxcluster worker \
             --slice-size {expected}`, or use hosts_per_slice=1"
        )
    } else {
        format!(
            "worker {address} is rank 0 of slice {index} of {size} hosts, but this \
             coordinator expects slices of {expected} host(s); give it hosts_per_slice={size}"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(slice: Option<(u32, u32, u32)>) -> pb::GetStatusResponse {
        pb::GetStatusResponse {
            slice: slice.map(|(index, rank, size)| pb::SliceMembership { index, rank, size }),
            ..pb::GetStatusResponse::default()
        }
    }

    #[test]
    fn a_plain_worker_serves_a_plain_coordinator() {
        assert_eq!(mismatch(&status(None), 1, "h:1"), None);
        assert_eq!(mismatch(&status(None), 0, "h:1"), None); // 0: not said, as 1
        assert_eq!(mismatch(&status(Some((0, 0, 1))), 1, "h:1"), None);
    }

    #[test]
    fn rank_zero_of_the_expected_size_serves() {
        assert_eq!(mismatch(&status(Some((3, 0, 4))), 4, "h:1"), None);
    }

    #[test]
    fn another_rank_is_refused_naming_the_fix() {
        let why = mismatch(&status(Some((1, 2, 4))), 4, "h:7").unwrap();
        assert!(
            why.contains("worker h:7 is rank 2 of slice 1 (4 hosts)"),
            "{why}"
        );
        assert!(why.contains("hosts_per_slice=4"), "{why}");
    }

    #[test]
    fn a_size_mismatch_is_refused_both_ways() {
        let plain = mismatch(&status(None), 2, "h:1").unwrap();
        assert!(plain.contains("not a host of a slice"), "{plain}");
        assert!(plain.contains("--slice-size 2"), "{plain}");
        let sliced = mismatch(&status(Some((0, 0, 2))), 1, "h:1").unwrap();
        assert!(sliced.contains("rank 0 of slice 0 of 2 hosts"), "{sliced}");
        assert!(sliced.contains("hosts_per_slice=2"), "{sliced}");
    }
}
