//! Tensors as they arrive: a checked view of a protocol `Tensor` (dtype known, shape and byte
//! length consistent) that borrows the received bytes instead of copying them.

use bytes::Bytes;

use super::dtype::DType;
use crate::rpc::pb;

/// Most dimensions a tensor may have (as numpy's limit).
pub const MAX_RANK: usize = 64;

/// A checked, borrowed tensor: `data` holds exactly `product(shape)` elements of `dtype`.
#[derive(Debug, Clone)]
pub struct TensorView<'a> {
    /// Element type.
    pub dtype: DType,
    /// Dimensions; empty for a scalar.
    pub shape: Vec<usize>,
    /// Little-endian, row-major element bytes.
    pub data: &'a [u8],
}

/// `float32[2, 3]`, `int64[]` (a scalar): how messages show a dtype and shape.
pub fn describe(dtype: DType, shape: &[usize]) -> String {
    let dims: Vec<String> = shape.iter().map(ToString::to_string).collect();
    format!("{dtype}[{}]", dims.join(", "))
}

/// Number of elements of `shape`, or `None` if it overflows `usize`.
pub fn element_count(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}

impl<'a> TensorView<'a> {
    /// Checks `tensor` (`what` names it in errors, e.g. "the value for 'w'").
    pub fn from_pb(tensor: &'a pb::Tensor, what: &str) -> Result<Self, String> {
        let dtype = DType::from_pb(tensor.dtype).map_err(|e| format!("{what}: {e}"))?;
        if tensor.shape.len() > MAX_RANK {
            return Err(format!(
                "{what} has {} dimensions; at most {MAX_RANK} are supported",
                tensor.shape.len()
            ));
        }
        let shape = tensor
            .shape
            .iter()
            .map(|&d| usize::try_from(d))
            .collect::<Result<Vec<usize>, _>>()
            .map_err(|_| format!("{what} has a dimension too large for this machine"))?;
        let expected = element_count(&shape)
            .and_then(|n| n.checked_mul(dtype.size()))
            .ok_or_else(|| {
                format!(
                    "{what} has shape {shape:?}, whose size overflows; expected a shape whose \
                     bytes fit in memory"
                )
            })?;
        if tensor.data.len() != expected {
            return Err(format!(
                "{what} is {} but carries {} bytes of data; expected {expected} bytes \
                 ({} elements of {} bytes, little-endian, row-major)",
                describe(dtype, &shape),
                tensor.data.len(),
                expected / dtype.size(),
                dtype.size()
            ));
        }
        Ok(Self {
            dtype,
            shape,
            data: &tensor.data,
        })
    }

    /// `float32[2, 3]`.
    pub fn describe(&self) -> String {
        describe(self.dtype, &self.shape)
    }
}

/// Builds a protocol tensor from owned bytes.
pub fn to_pb(dtype: DType, shape: &[usize], data: Bytes) -> pb::Tensor {
    pb::Tensor {
        dtype: dtype.to_pb().into(),
        shape: shape.iter().map(|&d| d as u64).collect(),
        data,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(dtype: i32, shape: &[u64], len: usize) -> pb::Tensor {
        pb::Tensor {
            dtype,
            shape: shape.to_vec(),
            data: Bytes::from(vec![0u8; len]),
        }
    }

    #[test]
    fn consistent_tensors_are_accepted() {
        let t = tensor(pb::DataType::Float32 as i32, &[2, 3], 24);
        let v = TensorView::from_pb(&t, "x").unwrap();
        assert_eq!(v.dtype, DType::F32);
        assert_eq!(v.shape, vec![2, 3]);
        assert_eq!(v.describe(), "float32[2, 3]");
        let scalar = tensor(pb::DataType::Int64 as i32, &[], 8);
        assert_eq!(
            TensorView::from_pb(&scalar, "s").unwrap().describe(),
            "int64[]"
        );
        let empty = tensor(pb::DataType::Uint8 as i32, &[0, 5], 0);
        assert!(TensorView::from_pb(&empty, "e").is_ok());
    }

    #[test]
    fn inconsistent_tensors_are_refused_with_the_sizes() {
        let short = tensor(pb::DataType::Float32 as i32, &[2, 3], 20);
        let e = TensorView::from_pb(&short, "the value for 'w'").unwrap_err();
        assert!(
            e.contains("the value for 'w'") && e.contains("20 bytes") && e.contains("24 bytes"),
            "{e}"
        );
        let e = TensorView::from_pb(&tensor(0, &[1], 4), "v").unwrap_err();
        assert!(e.contains("dtype code 0"), "{e}");
        let huge = tensor(pb::DataType::Float64 as i32, &[u64::MAX, 4], 0);
        assert!(TensorView::from_pb(&huge, "h")
            .unwrap_err()
            .contains("overflow"));
        let deep = tensor(pb::DataType::Int8 as i32, &[1; 65], 1);
        assert!(TensorView::from_pb(&deep, "d")
            .unwrap_err()
            .contains("65 dimensions"));
    }
}
