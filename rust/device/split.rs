//! Splitting a device string into `/`-separated segments and their `:`-separated parts.
//!
//! Behaves like Python's `[s.split(":") for s in spec.split("/")]`, keeping only what the
//! grammar needs: three parts and whether there were more. One byte scan per segment:
//! `str::split` plus `splitn` per segment cost about half of a parse, since names are short
//! and the generic searchers' set-up dominates. (A branch-free SWAR bitmask of the
//! delimiters was also tried; on baseline x86-64 it measured slower than this scan.)

/// One segment split on its first `:`s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Parts<'a> {
    /// The whole segment.
    pub segment: &'a str,
    /// Text before the first `:` (the whole segment when it has none).
    pub attribute: &'a str,
    /// Text between the first and second `:`, if there is a first.
    pub second: Option<&'a str>,
    /// Text between the second and third `:` (or the end), if there is a second.
    pub third: Option<&'a str>,
    /// True when the segment has more than three parts.
    pub too_many: bool,
}

impl<'a> Parts<'a> {
    /// Builds the parts of `segment` from the offsets of its first three colons (`count`
    /// of them are valid; a count of 3 means "three or more").
    fn new(segment: &'a str, colons: [usize; 3], count: usize) -> Self {
        // ':' is ASCII, so every offset is a char boundary.
        let end = segment.len();
        let piece = |from: usize, to: usize| segment.get(from..to).unwrap_or("");
        match count {
            0 => Parts {
                segment,
                attribute: segment,
                second: None,
                third: None,
                too_many: false,
            },
            1 => Parts {
                segment,
                attribute: piece(0, colons[0]),
                second: Some(piece(colons[0] + 1, end)),
                third: None,
                too_many: false,
            },
            _ => Parts {
                segment,
                attribute: piece(0, colons[0]),
                second: Some(piece(colons[0] + 1, colons[1])),
                third: Some(piece(
                    colons[1] + 1,
                    if count >= 3 { colons[2] } else { end },
                )),
                too_many: count >= 3,
            },
        }
    }
}

/// Iterator over the segments of a device string.
pub(super) struct Segments<'a> {
    rest: Option<&'a str>,
}

impl<'a> Segments<'a> {
    pub(super) fn new(input: &'a str) -> Self {
        Segments { rest: Some(input) }
    }
}

impl<'a> Iterator for Segments<'a> {
    type Item = Parts<'a>;

    fn next(&mut self) -> Option<Parts<'a>> {
        let text = self.rest?;
        let bytes = text.as_bytes();
        let mut colons = [0usize; 3];
        let mut count = 0;
        let mut end = bytes.len();
        for (i, &byte) in bytes.iter().enumerate() {
            if byte == b'/' {
                end = i;
                break;
            }
            if byte == b':' && count < 3 {
                colons[count] = i;
                count += 1;
            }
        }
        self.rest = text.get(end + 1..);
        Some(Parts::new(text.get(..end).unwrap_or(""), colons, count))
    }
}
