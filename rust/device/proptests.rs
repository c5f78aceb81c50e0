//! Property tests: no input panics, and generated specs survive a print/parse round trip.

use proptest::prelude::*;

use super::canonical::parse_canonical;
use super::parse::parse_general;
use super::split::Segments;
use super::*;

/// Strings built from the grammar's own pieces, which reach far more branches than
/// uniformly random text.
fn tokenish() -> impl Strategy<Value = String> {
    let token = prop_oneof![
        Just("/"),
        Just(":"),
        Just("job"),
        Just("replica"),
        Just("task"),
        Just("device"),
        Just("cpu"),
        Just("GPU"),
        Just("tPu"),
        Just("custom"),
        Just("cu\u{17f}tom"),
        Just("epu"),
        Just("TPU_SYSTEM"),
        Just("*"),
        Just("0"),
        Just("17"),
        Just("-"),
        Just("+"),
        Just("_"),
        Just(" "),
        Just("99999999999999999999"),
        Just("\u{e9}"),
        Just("\u{1f600}"),
    ];
    prop::collection::vec(token, 0..24).prop_map(|parts| parts.concat())
}

/// Names that survive inside a segment: anything but `/` and `:`.
fn name() -> impl Strategy<Value = String> {
    prop_oneof![Just(String::new()), "[a-z_]{1,10}", "[^/:]{0,12}",]
}

/// Device types a constructor would keep as given (`cpu`/`gpu` would be upper-cased).
fn device_type() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("CPU".to_owned()),
        Just("GPU".to_owned()),
        Just("TPU".to_owned()),
        name(),
    ]
    .prop_filter("cpu/gpu are normalised", |t| t != "cpu" && t != "gpu")
}

fn valid_spec() -> impl Strategy<Value = DeviceSpec> {
    (
        prop::option::of(name()),
        prop::option::of(any::<u64>()),
        prop::option::of(any::<u64>()),
        prop::option::of((device_type(), prop::option::of(any::<u64>()))),
    )
        .prop_map(|(job, replica, task, device)| DeviceSpec {
            job: job.map(Into::into),
            replica,
            task,
            device_index: device.as_ref().and_then(|(_, index)| *index),
            device_type: device.map(|(kind, _)| kind.into()),
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_strings_never_panic(input in any::<String>()) {
        let _ = parse(&input);
        let _ = tpu_device_map([&input]);
    }

    #[test]
    fn grammar_soup_never_panics_and_reparses(input in tokenish()) {
        match parse(&input) {
            // Whatever parses prints to a canonical form that parses to the same spec.
            Ok(spec) => {
                let printed = spec.to_string();
                prop_assert_eq!(parse(&printed), Ok(spec));
            }
            Err(err) => {
                let quoted = format!("{input:?}");
                prop_assert!(err.to_string().contains(&quoted), "{} lacks {}", err, quoted);
            }
        }
    }

    #[test]
    fn splitter_matches_str_split(input in prop_oneof![tokenish(), any::<String>()]) {
        let expected: Vec<(String, Vec<&str>)> = input
            .split('/')
            .map(|segment| (segment.to_owned(), segment.split(':').collect()))
            .collect();
        let seen: Vec<_> = Segments::new(&input).collect();
        prop_assert_eq!(seen.len(), expected.len());
        for (parts, (segment, pieces)) in seen.iter().zip(&expected) {
            prop_assert_eq!(parts.segment, segment.as_str());
            prop_assert_eq!(parts.attribute, pieces[0]);
            prop_assert_eq!(parts.second, pieces.get(1).copied());
            prop_assert_eq!(parts.third, pieces.get(2).copied());
            prop_assert_eq!(parts.too_many, pieces.len() > 3);
        }
    }

    #[test]
    fn canonical_fast_path_agrees_with_the_grammar(
        input in prop_oneof![tokenish(), valid_spec().prop_map(|s| s.to_string()), any::<String>()]
    ) {
        if let Some(fast) = parse_canonical(&input) {
            prop_assert_eq!(parse_general(&input), Ok(fast));
        }
    }

    #[test]
    fn valid_specs_round_trip(spec in valid_spec()) {
        let printed = spec.to_string();
        // Every printed spec takes the fast path.
        prop_assert!(parse_canonical(&printed).is_some());
        prop_assert_eq!(DeviceSpec::parse(&printed), Ok(spec));
    }

    #[test]
    fn merge_takes_each_set_field_from_other(a in valid_spec(), b in valid_spec()) {
        let merged = a.merged(&b);
        prop_assert_eq!(merged.job, b.job.or(a.job));
        prop_assert_eq!(merged.task, b.task.or(a.task));
        prop_assert_eq!(merged.device_index, b.device_index.or(a.device_index));
    }

    #[test]
    fn index_parsing_agrees_with_u64_display(value in any::<u64>(), pad in "[ \t]{0,2}") {
        prop_assert_eq!(parse_index(&format!("{pad}{value}{pad}")), Ok(value));
        let expected = if value == 0 { Ok(0) } else { Err(IndexProblem::Negative) };
        prop_assert_eq!(parse_index(&format!("-{value}")), expected);
    }

    #[test]
    fn core_counts_agree_iff_one_count(counts in prop::collection::vec(1usize..4, 0..12)) {
        let hosts = counts.iter().enumerate().map(|(h, c)| (h as u64, *c));
        let distinct: std::collections::BTreeSet<_> = counts.iter().collect();
        match verify_same_core_count(hosts) {
            Ok(n) => prop_assert!(distinct.len() <= 1 && (counts.is_empty() || n == counts[0])),
            Err(e) => {
                prop_assert!(distinct.len() > 1);
                let listed: usize = e.groups.iter().map(|(_, h)| h.len()).sum();
                prop_assert_eq!(listed, counts.len());
            }
        }
    }
}
