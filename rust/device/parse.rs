//! The TF device-name grammar, parsed without allocating.
//!
//! The rules are those of TF 2.x's `DeviceSpecV2._string_to_components`: split on `/`,
//! split each segment on `:`, skip segments with an empty attribute, let the last `job:`,
//! `replica:` and `task:` win, and accept one device component, either
//! `device:<TYPE>:<int|*>` or a bare type (`cpu`, `gpu:1`, `tpu:*`, ...). Numbers follow
//! Python's `int()` on strings (surrounding whitespace, a sign, `_` between digits) except
//! that negative values are rejected.

use super::canonical::parse_canonical;
use super::error::{DeviceSpecError, Field, IndexProblem};
use super::split::Segments;

/// A parsed device spec whose names borrow from the parsed string.
///
/// ```
/// let spec = _core::device::parse("/job:worker/task:3/device:TPU:7").unwrap();
/// assert_eq!((spec.job, spec.task, spec.device_index), (Some("worker"), Some(3), Some(7)));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct DeviceSpecRef<'a> {
    /// The job name, verbatim (may be empty: `/job:` names the empty job, as in TF).
    pub job: Option<&'a str>,
    /// The replica index.
    pub replica: Option<u64>,
    /// The task index.
    pub task: Option<u64>,
    /// The device type: `CPU`/`GPU` upper-cased, bare types canonical, others verbatim.
    pub device_type: Option<&'a str>,
    /// The device index; `None` for `*` or when absent.
    pub device_index: Option<u64>,
}

/// Bare device types TF accepts without the `device:` keyword, matched case-insensitively.
const BARE_TYPES: [&str; 5] = ["CPU", "GPU", "TPU", "CUSTOM", "EPU"];

/// Attribute keywords, for "did you mean" hints.
const KEYWORDS: [&str; 9] = [
    "job", "replica", "task", "device", "cpu", "gpu", "tpu", "custom", "epu",
];

/// Parses a TF device string such as `/job:worker/replica:0/task:1/device:GPU:0`.
///
/// The leading `/` is optional and the empty string is the empty spec. Errors name the bad
/// segment and the whole input.
pub fn parse(input: &str) -> Result<DeviceSpecRef<'_>, DeviceSpecError> {
    match parse_canonical(input) {
        Some(spec) => Ok(spec),
        None => parse_general(input),
    }
}

/// The full grammar, segment by segment.
pub(super) fn parse_general(input: &str) -> Result<DeviceSpecRef<'_>, DeviceSpecError> {
    let mut spec = DeviceSpecRef::default();
    // TF converts replica and task only after the loop, so only the last one must be valid.
    let mut replica: Option<(&str, &str)> = None;
    let mut task: Option<(&str, &str)> = None;
    let mut device_segment: Option<&str> = None;

    for parts in Segments::new(input) {
        let segment = parts.segment;
        // TF skips a segment whose attribute is empty (`//`, but also `:0`).
        if parts.attribute.is_empty() {
            continue;
        }
        match (parts.attribute, parts.second, parts.third, parts.too_many) {
            ("job", Some(name), None, false) => spec.job = Some(name),
            ("replica", Some(value), None, false) => replica = Some((segment, value)),
            ("task", Some(value), None, false) => task = Some((segment, value)),
            ("device", Some(kind), Some(index), false) => {
                check_single_device(input, device_segment, segment)?;
                device_segment = Some(segment);
                spec.device_type = Some(normalize_device_type(kind));
                spec.device_index = parse_device_index(input, segment, index)?;
            }
            (attribute, second, None, false) => {
                let Some(kind) = bare_type(attribute) else {
                    return Err(bad_attribute(input, segment, attribute));
                };
                check_single_device(input, device_segment, segment)?;
                device_segment = Some(segment);
                spec.device_type = Some(kind);
                spec.device_index = match second {
                    Some(index) => parse_device_index(input, segment, index)?,
                    None => None,
                };
            }
            (attribute, ..) => return Err(bad_attribute(input, segment, attribute)),
        }
    }

    spec.replica = parse_field(input, replica, Field::Replica)?;
    spec.task = parse_field(input, task, Field::Task)?;
    Ok(spec)
}

/// Upper-cases `cpu` and `gpu` (only those spellings, as TF does) and keeps other types.
pub fn normalize_device_type(kind: &str) -> &str {
    match kind {
        "cpu" => "CPU",
        "gpu" => "GPU",
        other => other,
    }
}

/// Parses a replica, task or device index the way Python's `int()` parses a string, and
/// rejects negative values.
pub fn parse_index(raw: &str) -> Result<u64, IndexProblem> {
    let bytes = raw.as_bytes();
    // Fast path: up to 19 plain digits cannot overflow a u64.
    if !bytes.is_empty() && bytes.len() <= 19 && bytes.iter().all(u8::is_ascii_digit) {
        return Ok(bytes
            .iter()
            .fold(0, |acc, digit| acc * 10 + u64::from(digit - b'0')));
    }
    let trimmed = raw.trim_matches(is_python_space);
    let (negative, body) = match trimmed.as_bytes().first() {
        None => return Err(IndexProblem::Empty),
        Some(b'-') => (true, &trimmed[1..]),
        Some(b'+') => (false, &trimmed[1..]),
        Some(_) => (false, trimmed),
    };
    let mut value: Option<u64> = Some(0);
    // Python allows `_` only between digits: not first, not last, never doubled.
    let mut after_underscore = true;
    for byte in body.bytes() {
        match byte {
            b'0'..=b'9' => {
                value = value
                    .and_then(|v| v.checked_mul(10))
                    .and_then(|v| v.checked_add(u64::from(byte - b'0')));
                after_underscore = false;
            }
            b'_' if !after_underscore => after_underscore = true,
            _ => return Err(IndexProblem::NotAnInteger),
        }
    }
    if after_underscore {
        // Also covers an empty body (a lone sign).
        return Err(IndexProblem::NotAnInteger);
    }
    match value {
        Some(0) => Ok(0),
        _ if negative => Err(IndexProblem::Negative),
        Some(v) => Ok(v),
        None => Err(IndexProblem::TooLarge),
    }
}

/// Python's `str.isspace`, which `int()` trims: Unicode `White_Space` plus the four
/// information separators U+001C..U+001F.
fn is_python_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// The canonical name of a bare device type, matched like Python's `str.upper()`.
fn bare_type(attribute: &str) -> Option<&'static str> {
    if attribute.is_ascii() {
        return BARE_TYPES
            .into_iter()
            .find(|known| attribute.eq_ignore_ascii_case(known));
    }
    // Full Unicode upper-casing, as Python does: `cuſtom`.upper() == "CUSTOM". Every char
    // upper-cases to at least one char, so longer attributes cannot match.
    if attribute.chars().count() > 6 {
        return None;
    }
    BARE_TYPES.into_iter().find(|known| {
        attribute
            .chars()
            .flat_map(char::to_uppercase)
            .eq(known.chars())
    })
}

fn check_single_device(
    input: &str,
    first: Option<&str>,
    segment: &str,
) -> Result<(), DeviceSpecError> {
    match first {
        None => Ok(()),
        Some(first) => Err(DeviceSpecError::MultipleDeviceTypes {
            input: input.to_owned(),
            first: first.to_owned(),
            second: segment.to_owned(),
        }),
    }
}

fn parse_device_index(
    input: &str,
    segment: &str,
    index: &str,
) -> Result<Option<u64>, DeviceSpecError> {
    if index == "*" {
        return Ok(None);
    }
    parse_field(input, Some((segment, index)), Field::DeviceIndex)
}

fn parse_field(
    input: &str,
    seen: Option<(&str, &str)>,
    field: Field,
) -> Result<Option<u64>, DeviceSpecError> {
    let Some((segment, value)) = seen else {
        return Ok(None);
    };
    parse_index(value)
        .map(Some)
        .map_err(|problem| DeviceSpecError::InvalidIndex {
            input: input.to_owned(),
            segment: segment.to_owned(),
            field,
            value: value.to_owned(),
            problem,
        })
}

/// The error for a segment that matched no rule: malformed when its attribute is known,
/// unknown otherwise.
fn bad_attribute(input: &str, segment: &str, attribute: &str) -> DeviceSpecError {
    let expected = match attribute {
        "job" => Some("job:<name>, e.g. 'job:worker' (a job name cannot contain ':')"),
        "replica" => Some("replica:<int>, e.g. 'replica:0'"),
        "task" => Some("task:<int>, e.g. 'task:3'"),
        "device" => Some(
            "device:<TYPE>:<int|*>, e.g. 'device:GPU:0' or 'device:GPU:*' (the index is required)",
        ),
        _ if bare_type(attribute).is_some() => {
            Some("a bare device type with an optional index, e.g. 'gpu', 'gpu:1' or 'gpu:*'")
        }
        _ => None,
    };
    match expected {
        Some(expected) => DeviceSpecError::Malformed {
            input: input.to_owned(),
            segment: segment.to_owned(),
            expected,
        },
        None => DeviceSpecError::UnknownAttribute {
            input: input.to_owned(),
            segment: segment.to_owned(),
            attribute: attribute.to_owned(),
            suggestion: suggest(attribute),
        },
    }
}

/// A keyword within one edit of `attribute` once trimmed and lower-cased, if any.
fn suggest(attribute: &str) -> Option<&'static str> {
    let cleaned = attribute.trim_matches(is_python_space).to_lowercase();
    if cleaned.len() > 16 {
        return None;
    }
    KEYWORDS
        .into_iter()
        .find(|known| *known == cleaned)
        .or_else(|| {
            KEYWORDS
                .into_iter()
                .find(|known| within_one_edit(known.as_bytes(), cleaned.as_bytes()))
        })
}

/// True when `a` and `b` differ by at most one insertion, deletion, substitution or
/// transposition of adjacent bytes.
fn within_one_edit(a: &[u8], b: &[u8]) -> bool {
    let prefix = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let (a, b) = (&a[prefix..], &b[prefix..]);
    match (a.len(), b.len()) {
        (0, n) | (n, 0) => n <= 1,
        (x, y) if x == y => {
            a[1..] == b[1..] || (x >= 2 && a[0] == b[1] && a[1] == b[0] && a[2..] == b[2..])
        }
        (x, y) if x + 1 == y => a == &b[1..],
        (x, y) if y + 1 == x => &a[1..] == b,
        _ => false,
    }
}
