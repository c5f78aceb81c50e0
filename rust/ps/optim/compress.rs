//! Compressed gradients for `ApplyUpdate`: a caller may send a float variable's gradient as
//! bfloat16 or as int8 with one scale per tensor, halving or quartering the bytes on the
//! wire; the ps widens it to the variable's dtype before the update.

use std::borrow::Cow;

use half::{bf16, f16};

use crate::ps::dtype::DType;

fn widen(values: impl Iterator<Item = f64>, target: DType) -> Vec<u8> {
    let mut out = Vec::new();
    for v in values {
        match target {
            DType::F16 => out.extend_from_slice(&f16::from_f64(v).to_le_bytes()),
            DType::BF16 => out.extend_from_slice(&bf16::from_f64(v).to_le_bytes()),
            DType::F32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
            _ => out.extend_from_slice(&v.to_le_bytes()),
        }
    }
    out
}

/// `data` (elements of `sent`) as bytes of the float dtype `target`: unchanged when the
/// dtypes agree, widened from bfloat16, or `int8 * scale`. An error names what was wrong.
pub fn to_dtype(
    data: &[u8],
    sent: DType,
    scale: f64,
    target: DType,
) -> Result<Cow<'_, [u8]>, String> {
    match sent {
        s if s == target => Ok(Cow::Borrowed(data)),
        DType::BF16 => Ok(Cow::Owned(widen(
            data.chunks_exact(2)
                .map(|c| f64::from(bf16::from_le_bytes([c[0], c[1]]))),
            target,
        ))),
        DType::I8 => {
            if !(scale.is_finite() && scale > 0.0) {
                return Err(format!(
                    "an int8 gradient has gradient_scale {scale}; expected a positive finite \
                     scale (the value of one step)"
                ));
            }
            Ok(Cow::Owned(widen(
                data.iter()
                    .map(|&b| f64::from(i8::from_le_bytes([b])) * scale),
                target,
            )))
        }
        other => Err(format!(
            "a gradient of dtype {other} for a {target} variable; expected {target}, bfloat16 \
             or int8 with gradient_scale"
        )),
    }
}

#[cfg(test)]
#[allow(clippy::float_cmp)] // the values compared are exact in binary
mod tests {
    use super::*;

    fn f32s(bytes: &[u8]) -> Vec<f32> {
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn same_dtype_is_borrowed_and_bf16_widens() {
        let raw = 1.5f32.to_le_bytes();
        assert!(matches!(
            to_dtype(&raw, DType::F32, 0.0, DType::F32).unwrap(),
            Cow::Borrowed(_)
        ));
        let b: Vec<u8> = [bf16::from_f32(-2.5), bf16::from_f32(0.25)]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(
            f32s(&to_dtype(&b, DType::BF16, 0.0, DType::F32).unwrap()),
            [-2.5, 0.25]
        );
    }

    #[test]
    fn int8_is_scaled_and_needs_a_scale() {
        let q = [127i8 as u8, (-64i8) as u8, 0];
        assert_eq!(
            f32s(&to_dtype(&q, DType::I8, 0.5, DType::F32).unwrap()),
            [63.5, -32.0, 0.0]
        );
        assert!(to_dtype(&q, DType::I8, 0.0, DType::F32)
            .unwrap_err()
            .contains("gradient_scale"));
        assert!(to_dtype(&[0; 4], DType::I32, 1.0, DType::F32)
            .unwrap_err()
            .contains("int8"));
    }
}
