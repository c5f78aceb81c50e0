//! Unit tests: every form of SPEC §3, TF's edge cases, errors, and the TPU map.

use super::*;

fn spec(input: &str) -> DeviceSpecRef<'_> {
    match parse(input) {
        Ok(spec) => spec,
        Err(err) => panic!("{input:?} should parse: {err}"),
    }
}

fn err(input: &str) -> DeviceSpecError {
    match parse(input) {
        Ok(spec) => panic!("{input:?} should not parse, got {spec:?}"),
        Err(err) => err,
    }
}

fn canonical(input: &str) -> String {
    spec(input).to_string()
}

#[test]
fn full_spec_in_canonical_order() {
    let s = spec("/job:worker/replica:0/task:3/device:TPU:7");
    assert_eq!(s.job, Some("worker"));
    assert_eq!(s.replica, Some(0));
    assert_eq!(s.task, Some(3));
    assert_eq!(s.device_type, Some("TPU"));
    assert_eq!(s.device_index, Some(7));
    assert_eq!(s.to_string(), "/job:worker/replica:0/task:3/device:TPU:7");
}

#[test]
fn segments_in_any_order_print_canonically() {
    assert_eq!(
        canonical("/device:GPU:1/task:2/replica:3/job:ps"),
        "/job:ps/replica:3/task:2/device:GPU:1"
    );
}

#[test]
fn legacy_bare_device_forms() {
    assert_eq!(canonical("/cpu:0"), "/device:CPU:0");
    assert_eq!(canonical("/gpu:*"), "/device:GPU:*");
    assert_eq!(canonical("/GPU"), "/device:GPU:*");
    assert_eq!(canonical("/tpu:1"), "/device:TPU:1");
    assert_eq!(canonical("/custom:3"), "/device:CUSTOM:3");
    assert_eq!(canonical("/epu:0"), "/device:EPU:0");
    assert_eq!(canonical("/Gpu:2"), "/device:GPU:2");
    // Python's str.upper() maps the long s to S, so TF accepts this spelling.
    assert_eq!(canonical("/cu\u{17f}tom:1"), "/device:CUSTOM:1");
}

#[test]
fn device_keyword_keeps_types_verbatim_except_cpu_gpu() {
    assert_eq!(spec("/device:cpu:0").device_type, Some("CPU"));
    assert_eq!(spec("/device:gpu:0").device_type, Some("GPU"));
    assert_eq!(spec("/device:Gpu:0").device_type, Some("Gpu"));
    assert_eq!(spec("/device:tpu:0").device_type, Some("tpu"));
    assert_eq!(spec("/device:TPU_SYSTEM:0").device_type, Some("TPU_SYSTEM"));
    assert_eq!(spec("/device:MyAccel:*").device_index, None);
    assert_eq!(canonical("/device::0"), "/device::0");
}

#[test]
fn leading_slash_optional_and_empty_segments_skipped() {
    assert_eq!(spec("job:a/task:1"), spec("/job:a/task:1"));
    assert_eq!(spec("//job:a///task:1//"), spec("/job:a/task:1"));
    assert_eq!(spec(""), DeviceSpecRef::default());
    assert_eq!(spec("/"), DeviceSpecRef::default());
    // TF skips any segment whose attribute is empty, not only empty segments.
    assert_eq!(spec("/:0/job:a/:x:y"), spec("/job:a"));
}

#[test]
fn last_job_replica_task_win() {
    let s = spec("/job:a/replica:1/task:1/job:b/replica:2/task:2");
    assert_eq!((s.job, s.replica, s.task), (Some("b"), Some(2), Some(2)));
    // As in TF, only the last replica/task value is converted to an integer.
    assert_eq!(spec("/task:x/task:4").task, Some(4));
}

#[test]
fn empty_job_and_whitespace_are_kept_verbatim() {
    assert_eq!(spec("/job:").job, Some(""));
    assert_eq!(canonical("/job:"), "/job:");
    assert_eq!(spec("/job: my job ").job, Some(" my job "));
}

#[test]
fn integers_follow_python_int() {
    assert_eq!(spec("/task: 7 ").task, Some(7));
    assert_eq!(spec("/task:+7").task, Some(7));
    assert_eq!(spec("/task:007").task, Some(7));
    assert_eq!(spec("/task:1_000").task, Some(1000));
    assert_eq!(spec("/task:-0").task, Some(0));
    assert_eq!(spec("/gpu:\t3\n").device_index, Some(3));
    assert_eq!(
        spec("/replica:18446744073709551615").replica,
        Some(u64::MAX)
    );
    assert_eq!(parse_index("_1"), Err(IndexProblem::NotAnInteger));
    assert_eq!(parse_index("1_"), Err(IndexProblem::NotAnInteger));
    assert_eq!(parse_index("1__0"), Err(IndexProblem::NotAnInteger));
    assert_eq!(parse_index("+"), Err(IndexProblem::NotAnInteger));
    assert_eq!(parse_index("- 1"), Err(IndexProblem::NotAnInteger));
    assert_eq!(parse_index("  "), Err(IndexProblem::Empty));
    assert_eq!(parse_index("-3"), Err(IndexProblem::Negative));
    assert_eq!(
        parse_index("18446744073709551616"),
        Err(IndexProblem::TooLarge)
    );
    assert_eq!(
        parse_index("-99999999999999999999"),
        Err(IndexProblem::Negative)
    );
}

#[test]
fn negative_and_non_integer_indices_name_the_segment() {
    for (input, segment, field, problem) in [
        (
            "/job:w/task:-1",
            "task:-1",
            Field::Task,
            IndexProblem::Negative,
        ),
        (
            "/replica:one",
            "replica:one",
            Field::Replica,
            IndexProblem::NotAnInteger,
        ),
        (
            "/device:GPU:1.5",
            "device:GPU:1.5",
            Field::DeviceIndex,
            IndexProblem::NotAnInteger,
        ),
        ("/gpu:", "gpu:", Field::DeviceIndex, IndexProblem::Empty),
        (
            "/cpu: *",
            "cpu: *",
            Field::DeviceIndex,
            IndexProblem::NotAnInteger,
        ),
    ] {
        match err(input) {
            DeviceSpecError::InvalidIndex {
                input: seen,
                segment: seg,
                field: f,
                problem: p,
                ..
            } => {
                assert_eq!(
                    (seen.as_str(), seg.as_str(), f, p),
                    (input, segment, field, problem)
                );
            }
            other => panic!("{input:?}: wrong error {other:?}"),
        }
        let message = err(input).to_string();
        assert!(
            message.contains(segment) && message.contains(input),
            "{message}"
        );
    }
}

#[test]
fn two_device_components_are_rejected() {
    for input in [
        "/cpu:0/gpu:0",
        "/device:CPU:0/device:GPU:0",
        "/gpu:0/gpu:0",
        "/tpu/device:X:1",
    ] {
        let e = err(input);
        assert!(
            matches!(e, DeviceSpecError::MultipleDeviceTypes { .. }),
            "{e:?}"
        );
        assert!(e.to_string().contains("multiple device types"), "{e}");
    }
}

#[test]
fn unknown_attributes_name_segment_and_suggest() {
    let cases = [
        ("/jb:worker", "jb", Some("job")),
        ("/JOB:a", "JOB", Some("job")),
        ("/Device:GPU:0", "Device", Some("device")),
        (" /job:a", " ", None),
        ("/ task:1", " task", Some("task")),
        ("/xyzzy:1", "xyzzy", None),
        ("/host:1", "host", None),
    ];
    for (input, attribute, suggestion) in cases {
        match err(input) {
            DeviceSpecError::UnknownAttribute {
                attribute: a,
                suggestion: s,
                ..
            } => assert_eq!((a.as_str(), s), (attribute, suggestion), "{input:?}"),
            other => panic!("{input:?}: wrong error {other:?}"),
        }
    }
    let message = err("/job:a/jb:worker").to_string();
    assert!(message.contains("\"jb:worker\"") && message.contains("\"/job:a/jb:worker\""));
    assert!(message.contains("did you mean \"job\""), "{message}");
}

#[test]
fn known_attributes_with_wrong_arity_are_malformed() {
    // `/device:CPU` (no index) is an error in TF too.
    for input in [
        "/device:CPU",
        "/device",
        "/device:GPU:0:1",
        "/job",
        "/job:a:b",
        "/task",
        "/replica:1:2",
        "/cpu:0:1",
    ] {
        let e = err(input);
        assert!(
            matches!(e, DeviceSpecError::Malformed { .. }),
            "{input:?}: {e:?}"
        );
        assert!(e.to_string().contains("malformed segment"), "{e}");
    }
}

#[test]
fn owned_spec_interns_common_names_and_merges() {
    let worker = DeviceSpec::parse("/job:worker/device:GPU:0").unwrap();
    assert!(matches!(worker.job, Some(std::borrow::Cow::Borrowed(_))));
    assert!(matches!(
        worker.device_type,
        Some(std::borrow::Cow::Borrowed(_))
    ));
    let odd = DeviceSpec::parse("/job:trainer7").unwrap();
    assert!(matches!(odd.job, Some(std::borrow::Cow::Owned(_))));

    let merged = worker.merged(&DeviceSpec::parse("/task:3/device:CPU:*").unwrap());
    // The device index is merged on its own: CPU from the other, index 0 from self.
    assert_eq!(merged.to_string(), "/job:worker/task:3/device:CPU:0");
    assert_eq!(worker.merged(&DeviceSpec::default()), worker);
    assert!(DeviceSpec::parse("//").unwrap().is_empty());
    assert_eq!(
        DeviceSpec::default()
            .with_device_type(Some("gpu"))
            .device_type
            .as_deref(),
        Some("GPU")
    );
}

#[test]
fn index_without_type_is_not_printed() {
    let spec = DeviceSpec {
        device_index: Some(3),
        ..DeviceSpec::default()
    };
    assert_eq!(spec.to_string(), "");
}

#[test]
fn tpu_device_map_groups_cores_by_host() {
    let names = [
        "/job:worker/replica:0/task:1/device:TPU:1",
        "/job:worker/replica:0/task:0/device:TPU:1",
        "/job:worker/replica:0/task:1/device:TPU:0",
        "/job:worker/replica:0/task:0/device:TPU:0",
        "/job:worker/replica:0/task:0/device:CPU:0",
        "/job:worker/replica:0/task:0/device:TPU_SYSTEM:0",
        "/job:worker/replica:0/task:0/device:GPU:0",
    ];
    let map = tpu_device_map(names).unwrap();
    assert_eq!(map.total_cores, 4);
    assert_eq!(
        map.hosts.into_iter().collect::<Vec<_>>(),
        vec![(0, vec![0, 1]), (1, vec![0, 1])]
    );
    assert_eq!(
        tpu_device_map(Vec::<String>::new()).unwrap(),
        TpuDeviceMap::default()
    );
}

#[test]
fn tpu_device_map_rejects_ambiguous_names() {
    assert!(matches!(
        tpu_device_map(["/job:w/device:TPU:0"]),
        Err(TpuMapError::MissingTask { .. })
    ));
    assert!(matches!(
        tpu_device_map(["/job:w/task:0/device:TPU:*"]),
        Err(TpuMapError::MissingCore { .. })
    ));
    assert!(matches!(
        tpu_device_map(["/task:0/tpu:1", "/job:w/task:0/device:TPU:1"]),
        Err(TpuMapError::DuplicateCore {
            host: 0,
            core: 1,
            ..
        })
    ));
    let e = tpu_device_map(["/task:0/tpu:0", "/task:zero/tpu:1"]).unwrap_err();
    assert!(e.to_string().contains("task:zero"), "{e}");
}

#[test]
fn verify_same_core_count_names_the_odd_hosts() {
    assert_eq!(verify_same_core_count([]), Ok(0));
    assert_eq!(verify_same_core_count([(3, 4), (0, 4)]), Ok(4));
    let err = verify_same_core_count([(0, 8), (2, 4), (1, 8), (3, 8)]).unwrap_err();
    assert_eq!(err.groups, vec![(8, vec![0, 1, 3]), (4, vec![2])]);
    let message = err.to_string();
    assert!(
        message.contains("hosts 0, 1, 3: 8 cores; host 2: 4 cores"),
        "{message}"
    );
    let many =
        verify_same_core_count((0..20).map(|h| (h, if h == 7 { 1 } else { 2 }))).unwrap_err();
    assert!(
        many.to_string()
            .contains("6, 8 and 11 more: 2 cores; host 7: 1 core"),
        "{many}"
    );
}
