//! Compressed gradients for `ApplyUpdate`: a caller may send a float variable's gradient as
//! bfloat16 or as int8 with one scale per tensor, halving or quartering the bytes on the
//! wire; the ps widens it to the variable's dtype before the update.
//!
//! A [`Gradient`] is the received bytes and how to read them: the update widens it a chunk
//! at a time as it steps (`Optimizer::apply_gradient`), so a compressed gradient is never
//! expanded into a whole-variable buffer (for a 64 MiB variable, 64 MiB allocated, faulted
//! in and written element by element per update).

use crate::ps::dtype::DType;

/// A gradient as received: its bytes and how they become values of the variable's dtype.
#[derive(Debug, Clone, Copy)]
pub enum Gradient<'a> {
    /// Already the variable's dtype.
    Same(&'a [u8]),
    /// bfloat16, widened through float64 to the variable's dtype.
    Bf16(&'a [u8]),
    /// int8 times `scale` (float64), rounded to the variable's dtype.
    Int8 {
        /// One byte per element.
        data: &'a [u8],
        /// The value of one step.
        scale: f64,
    },
}

impl<'a> Gradient<'a> {
    /// Checks how `data` (elements of `sent`) becomes `target` values: unchanged when the
    /// dtypes agree, widened from bfloat16, or `int8 * scale`. An error names what was wrong.
    pub fn new(data: &'a [u8], sent: DType, scale: f64, target: DType) -> Result<Self, String> {
        match sent {
            s if s == target => Ok(Self::Same(data)),
            DType::BF16 => Ok(Self::Bf16(data)),
            DType::I8 => {
                if !(scale.is_finite() && scale > 0.0) {
                    return Err(format!(
                        "an int8 gradient has gradient_scale {scale}; expected a positive \
                         finite scale (the value of one step)"
                    ));
                }
                Ok(Self::Int8 { data, scale })
            }
            other => Err(format!(
                "a gradient of dtype {other} for a {target} variable; expected {target}, \
                 bfloat16 or int8 with gradient_scale"
            )),
        }
    }

    /// Elements `items` of this gradient; `element_bytes` is the size of an element of the
    /// variable's dtype (that of a [`Gradient::Same`]).
    #[must_use]
    pub fn part(&self, items: std::ops::Range<usize>, element_bytes: usize) -> Self {
        match *self {
            Self::Same(data) => {
                Self::Same(&data[items.start * element_bytes..items.end * element_bytes])
            }
            Self::Bf16(data) => Self::Bf16(&data[items.start * 2..items.end * 2]),
            Self::Int8 { data, scale } => Self::Int8 {
                data: &data[items],
                scale,
            },
        }
    }
}

#[cfg(test)]
#[allow(clippy::float_cmp)] // the values compared are exact in binary
mod tests {
    use super::*;

    #[test]
    fn same_dtype_is_as_sent_and_bf16_or_int8_widen() {
        let raw = 1.5f32.to_le_bytes();
        assert!(matches!(
            Gradient::new(&raw, DType::F32, 0.0, DType::F32).unwrap(),
            Gradient::Same(_)
        ));
        assert!(matches!(
            Gradient::new(&[0, 0], DType::BF16, 0.0, DType::F32).unwrap(),
            Gradient::Bf16(_)
        ));
        assert!(matches!(
            Gradient::new(&[1], DType::I8, 0.5, DType::F64).unwrap(),
            Gradient::Int8 { scale, .. } if scale == 0.5
        ));
    }

    #[test]
    fn int8_needs_a_scale_and_other_dtypes_are_refused() {
        let q = [127i8 as u8, (-64i8) as u8, 0];
        assert!(Gradient::new(&q, DType::I8, 0.0, DType::F32)
            .unwrap_err()
            .contains("gradient_scale"));
        assert!(Gradient::new(&[0; 4], DType::I32, 1.0, DType::F32)
            .unwrap_err()
            .contains("int8"));
    }
}
