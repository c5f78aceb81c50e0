//! A fast path for names already in canonical order, as `to_string()`, TF and JAX print
//! them: `/job:<name>/replica:<int>/task:<int>/device:<TYPE>:<int|*>`, any part absent.
//!
//! It recognises that shape with prefix checks and plain digit runs and hands everything
//! else (other orders, legacy forms, whitespace, signs, errors) to the general parser, which
//! gives the same answer for every input this path accepts (a property test checks that).

use super::parse::{normalize_device_type, DeviceSpecRef};

/// Parses `input` if it is in canonical form with plain digits; `None` means "not this
/// shape", never "invalid".
#[inline]
pub(super) fn parse_canonical(input: &str) -> Option<DeviceSpecRef<'_>> {
    let mut spec = DeviceSpecRef::default();
    let mut rest = input;
    if let Some(after) = rest.strip_prefix("/job:") {
        let (name, delimiter, tail) = until_delimiter(after);
        if delimiter == Some(b':') {
            return None;
        }
        spec.job = Some(name);
        rest = tail;
    }
    if let Some(after) = rest.strip_prefix("/replica:") {
        let (value, tail) = digits(after)?;
        spec.replica = Some(value);
        rest = tail;
    }
    if let Some(after) = rest.strip_prefix("/task:") {
        let (value, tail) = digits(after)?;
        spec.task = Some(value);
        rest = tail;
    }
    if let Some(after) = rest.strip_prefix("/device:") {
        let (kind, delimiter, tail) = until_delimiter(after);
        if delimiter != Some(b':') {
            return None;
        }
        let index = tail.get(1..)?;
        spec.device_type = Some(normalize_device_type(kind));
        if index == "*" {
            rest = "";
        } else {
            let (value, tail) = digits(index)?;
            spec.device_index = Some(value);
            rest = tail;
        }
    }
    rest.is_empty().then_some(spec)
}

/// Splits `text` at its first `/` or `:`: the text before, that byte, and the rest
/// starting at it.
#[inline]
fn until_delimiter(text: &str) -> (&str, Option<u8>, &str) {
    let end = text
        .bytes()
        .position(|b| b == b'/' || b == b':')
        .unwrap_or(text.len());
    // '/' and ':' are ASCII, so `end` is a char boundary.
    let (head, tail) = text.split_at_checked(end).unwrap_or((text, ""));
    (head, tail.as_bytes().first().copied(), tail)
}

/// A run of ASCII digits that fits a `u64`, ending the text or followed by `/`; returns
/// the value and the rest starting at the `/`.
#[inline]
fn digits(text: &str) -> Option<(u64, &str)> {
    let bytes = text.as_bytes();
    let len = bytes.iter().take_while(|b| b.is_ascii_digit()).count();
    if len == 0 || !matches!(bytes.get(len), None | Some(b'/')) {
        return None;
    }
    let value = bytes[..len].iter().try_fold(0u64, |acc, digit| {
        acc.checked_mul(10)?.checked_add(u64::from(digit - b'0'))
    })?;
    Some((value, text.get(len..)?))
}
