//! Element types of parameter-server variables, and elementwise arithmetic on their raw
//! little-endian bytes.
//!
//! Variables are stored as the bytes that travel on the wire, so a read is one copy; updates
//! decode, combine and re-encode element by element through [`Element`], which compiles to
//! plain loads and stores on little-endian machines.

use std::fmt;

use half::{bf16, f16};

use crate::rpc::pb;

/// The element type of a variable, named as numpy (and JAX) name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE half precision.
    F16,
    /// Brain floating point (8-bit exponent, 7-bit mantissa).
    BF16,
    /// IEEE single precision.
    F32,
    /// IEEE double precision.
    F64,
    /// Signed 8-bit integer.
    I8,
    /// Signed 16-bit integer.
    I16,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 8-bit integer.
    U8,
    /// Unsigned 16-bit integer.
    U16,
    /// Unsigned 32-bit integer.
    U32,
    /// Unsigned 64-bit integer.
    U64,
}

impl DType {
    /// Every supported type, in protocol order.
    pub const ALL: [DType; 12] = [
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::U16,
        DType::U32,
        DType::U64,
    ];

    /// The numpy name, e.g. `"float32"`.
    pub fn name(self) -> &'static str {
        match self {
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::I8 => "int8",
            DType::I16 => "int16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::U8 => "uint8",
            DType::U16 => "uint16",
            DType::U32 => "uint32",
            DType::U64 => "uint64",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::I8 | DType::U8 => 1,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 | DType::I64 | DType::U64 => 8,
        }
    }

    /// The type with numpy name `name`, if supported.
    ///
    /// ```
    /// use _core::ps::DType;
    /// assert_eq!(DType::from_name("bfloat16"), Some(DType::BF16));
    /// assert_eq!(DType::from_name("complex64"), None);
    /// ```
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|d| d.name() == name)
    }

    /// The protocol enum value.
    pub fn to_pb(self) -> pb::DataType {
        match self {
            DType::F16 => pb::DataType::Float16,
            DType::BF16 => pb::DataType::Bfloat16,
            DType::F32 => pb::DataType::Float32,
            DType::F64 => pb::DataType::Float64,
            DType::I8 => pb::DataType::Int8,
            DType::I16 => pb::DataType::Int16,
            DType::I32 => pb::DataType::Int32,
            DType::I64 => pb::DataType::Int64,
            DType::U8 => pb::DataType::Uint8,
            DType::U16 => pb::DataType::Uint16,
            DType::U32 => pb::DataType::Uint32,
            DType::U64 => pb::DataType::Uint64,
        }
    }

    /// The type of a protocol enum value; the error names the value and the known ones.
    pub fn from_pb(code: i32) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|d| d.to_pb() as i32 == code)
            .ok_or_else(|| {
                let known: Vec<&str> = Self::ALL.iter().map(|d| d.name()).collect();
                format!(
                    "tensor dtype code {code} is not a supported type; expected one of {} \
                     (DataType 1..=12)",
                    known.join(", ")
                )
            })
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How an update combines a variable's value with the value sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `variable = value`.
    Assign,
    /// `variable += value`.
    Add,
    /// `variable -= value`.
    Sub,
}

impl Op {
    /// The method name users call, for messages.
    pub fn verb(self) -> &'static str {
        match self {
            Op::Assign => "assign",
            Op::Add => "assign_add",
            Op::Sub => "assign_sub",
        }
    }
}

/// One element type's little-endian encoding and arithmetic.
trait Element: Copy {
    const SIZE: usize;
    fn load(bytes: &[u8]) -> Self;
    fn store(self, out: &mut [u8]);
    fn add(self, other: Self) -> Self;
    fn sub(self, other: Self) -> Self;
}

macro_rules! element {
    ($t:ty, $add:expr, $sub:expr) => {
        impl Element for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            #[inline]
            fn load(bytes: &[u8]) -> Self {
                let mut raw = [0u8; std::mem::size_of::<$t>()];
                raw.copy_from_slice(bytes);
                <$t>::from_le_bytes(raw)
            }
            #[inline]
            fn store(self, out: &mut [u8]) {
                out.copy_from_slice(&self.to_le_bytes());
            }
            #[inline]
            fn add(self, other: Self) -> Self {
                $add(self, other)
            }
            #[inline]
            fn sub(self, other: Self) -> Self {
                $sub(self, other)
            }
        }
    };
}

macro_rules! integers {
    ($($t:ty),*) => {$(element!($t, <$t>::wrapping_add, <$t>::wrapping_sub);)*};
}

macro_rules! floats {
    ($($t:ty),*) => {$(element!($t, |a: $t, b: $t| a + b, |a: $t, b: $t| a - b);)*};
}

integers!(i8, i16, i32, i64, u8, u16, u32, u64);
floats!(f16, bf16, f32, f64);

fn combine<T: Element>(op: Op, dst: &mut [u8], src: &[u8]) {
    let pairs = dst.chunks_exact_mut(T::SIZE).zip(src.chunks_exact(T::SIZE));
    match op {
        Op::Assign => dst.copy_from_slice(src),
        Op::Add => pairs.for_each(|(d, s)| T::load(d).add(T::load(s)).store(d)),
        Op::Sub => pairs.for_each(|(d, s)| T::load(d).sub(T::load(s)).store(d)),
    }
}

/// `dst = dst <op> src` elementwise, both holding whole elements of `dtype` and of equal
/// length (the caller checks shapes first).
pub fn apply(dtype: DType, op: Op, dst: &mut [u8], src: &[u8]) {
    debug_assert_eq!(dst.len(), src.len());
    match dtype {
        DType::F16 => combine::<f16>(op, dst, src),
        DType::BF16 => combine::<bf16>(op, dst, src),
        DType::F32 => combine::<f32>(op, dst, src),
        DType::F64 => combine::<f64>(op, dst, src),
        DType::I8 => combine::<i8>(op, dst, src),
        DType::I16 => combine::<i16>(op, dst, src),
        DType::I32 => combine::<i32>(op, dst, src),
        DType::I64 => combine::<i64>(op, dst, src),
        DType::U8 => combine::<u8>(op, dst, src),
        DType::U16 => combine::<u16>(op, dst, src),
        DType::U32 => combine::<u32>(op, dst, src),
        DType::U64 => combine::<u64>(op, dst, src),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn le<T: Element>(values: &[T]) -> Vec<u8> {
        let mut out = vec![0u8; values.len() * T::SIZE];
        for (v, chunk) in values.iter().zip(out.chunks_exact_mut(T::SIZE)) {
            v.store(chunk);
        }
        out
    }

    fn decode<T: Element>(bytes: &[u8]) -> Vec<T> {
        bytes.chunks_exact(T::SIZE).map(T::load).collect()
    }

    #[test]
    fn names_sizes_and_codes_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_name(d.name()), Some(d));
            assert_eq!(DType::from_pb(d.to_pb() as i32), Ok(d));
        }
        assert_eq!(DType::F32.size(), 4);
        assert_eq!(DType::BF16.size(), 2);
        let e = DType::from_pb(0).unwrap_err();
        assert!(e.contains("code 0") && e.contains("float32"), "{e}");
        assert!(DType::from_pb(99).is_err());
    }

    #[test]
    fn float_arithmetic() {
        let mut dst = le(&[1.5f32, -2.0, 0.25]);
        apply(DType::F32, Op::Add, &mut dst, &le(&[0.5f32, 2.0, 0.75]));
        assert_eq!(decode::<f32>(&dst), vec![2.0, 0.0, 1.0]);
        apply(DType::F32, Op::Sub, &mut dst, &le(&[1.0f32, 1.0, 1.0]));
        assert_eq!(decode::<f32>(&dst), vec![1.0, -1.0, 0.0]);
        let mut d64 = le(&[0.1f64]);
        apply(DType::F64, Op::Add, &mut d64, &le(&[0.2f64]));
        assert!((decode::<f64>(&d64)[0] - 0.3).abs() < 1e-12);
    }

    #[test]
    fn half_precision_arithmetic_rounds_back() {
        let mut dst = le(&[f16::from_f32(1.0), f16::from_f32(-3.5)]);
        apply(
            DType::F16,
            Op::Add,
            &mut dst,
            &le(&[f16::from_f32(0.5), f16::from_f32(1.5)]),
        );
        assert_eq!(
            decode::<f16>(&dst),
            vec![f16::from_f32(1.5), f16::from_f32(-2.0)]
        );
        let mut b = le(&[bf16::from_f32(2.0)]);
        apply(DType::BF16, Op::Sub, &mut b, &le(&[bf16::from_f32(0.5)]));
        assert_eq!(decode::<bf16>(&b), vec![bf16::from_f32(1.5)]);
    }

    #[test]
    fn integers_wrap_instead_of_panicking() {
        let mut dst = le(&[i8::MAX, 0]);
        apply(DType::I8, Op::Add, &mut dst, &le(&[1i8, -5]));
        assert_eq!(decode::<i8>(&dst), vec![i8::MIN, -5]);
        let mut u = le(&[0u64]);
        apply(DType::U64, Op::Sub, &mut u, &le(&[1u64]));
        assert_eq!(decode::<u64>(&u), vec![u64::MAX]);
        let mut i = le(&[40i32, 7]);
        apply(DType::I32, Op::Assign, &mut i, &le(&[2i32, 3]));
        assert_eq!(decode::<i32>(&i), vec![2, 3]);
    }

    #[test]
    fn every_dtype_adds_one() {
        for d in DType::ALL {
            // 1 in each type's encoding, built from its name rather than per-type code.
            let one: Vec<u8> = match d {
                DType::F16 => le(&[f16::ONE]),
                DType::BF16 => le(&[bf16::ONE]),
                DType::F32 => le(&[1.0f32]),
                DType::F64 => le(&[1.0f64]),
                _ => {
                    let mut v = vec![0u8; d.size()];
                    v[0] = 1;
                    v
                }
            };
            let mut acc = vec![0u8; d.size()];
            apply(d, Op::Add, &mut acc, &one);
            apply(d, Op::Add, &mut acc, &one);
            apply(d, Op::Sub, &mut acc, &one);
            assert_eq!(acc, one, "{d}");
        }
    }
}
