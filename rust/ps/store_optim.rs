//! `VariableStore::apply_update`: one optimizer step, atomic with the variable's slots.
//!
//! **Locking.** The slots are ordinary variables of the store (so reads, checkpoints and
//! restores see them), named `<name>/<prefix>/<slot>`. An update takes the variable's lock
//! first and then its slots' in a fixed order, so every `apply_update` of one variable is
//! serialised by the variable's lock and none of them can deadlock: other operations hold
//! one variable's lock at a time, and missing slots are created under the map's lock before
//! any variable lock is taken (as everywhere in the store).

use std::sync::Arc;

use super::{StoreError, Updated, Variable, VariableStore};
use crate::ps::dtype::DType;
use crate::ps::optim::{Gradient, Optimizer, ITERATIONS};
use crate::ps::tensor::TensorView;

/// The name of slot `slot` of variable `name` for optimizer `prefix`.
pub fn slot_name(name: &str, prefix: &str, slot: &str) -> String {
    format!("{name}/{prefix}/{slot}")
}

fn filled(dtype: DType, shape: &[usize], value: f64) -> Vec<u8> {
    let count = super::element_count(shape).unwrap_or(0);
    let one: Vec<u8> = match dtype {
        DType::F16 => half::f16::from_f64(value).to_le_bytes().to_vec(),
        DType::BF16 => half::bf16::from_f64(value).to_le_bytes().to_vec(),
        DType::F32 => (value as f32).to_le_bytes().to_vec(),
        DType::F64 => value.to_le_bytes().to_vec(),
        _ => vec![0; dtype.size()],
    };
    one.repeat(count)
}

impl VariableStore {
    /// The slot `name`, created holding `initial` (all elements) if missing; refused if an
    /// existing one has another dtype or shape.
    fn slot(
        &self,
        name: &str,
        dtype: DType,
        shape: &[usize],
        initial: f64,
    ) -> Result<Arc<Variable>, StoreError> {
        if let Some(found) = self.map().get(name).cloned() {
            if found.dtype != dtype || found.shape != shape {
                return Err(StoreError::Invalid(format!(
                    "slot variable {name:?} is {}; expected {} (a slot has its variable's \
                     dtype and shape, the step count int64[]): restore it from a matching \
                     checkpoint or delete it",
                    found.describe(),
                    super::describe(dtype, shape)
                )));
            }
            return Ok(found);
        }
        let data = filled(dtype, shape, initial);
        let view = TensorView {
            dtype,
            shape: shape.to_vec(),
            data: &data,
        };
        let mut map = self.map_mut();
        // Another caller may have created it since the read lock was released.
        let var = map
            .entry(name.to_owned())
            .or_insert_with(|| Arc::new(Variable::new(&view)));
        Ok(Arc::clone(var))
    }

    /// One step of `optimizer` on `name` with `gradient`: the variable, its slots (created
    /// on first use) and its step count change together, atomically. Returns the
    /// variable's new version and, if asked, its value right after.
    pub fn apply_update(
        &self,
        name: &str,
        prefix: &str,
        optimizer: &Optimizer,
        gradient: &TensorView<'_>,
        gradient_scale: f64,
        read_value: bool,
    ) -> Result<Updated, StoreError> {
        if prefix.is_empty() {
            return Err(StoreError::Invalid(format!(
                "apply_update to {name:?} has an empty slot_prefix; expected the optimizer's \
                 name"
            )));
        }
        let var = self.get(name)?;
        if !Optimizer::supports(var.dtype) {
            return Err(StoreError::Invalid(format!(
                "apply_update to variable {name:?} ({}): optimizers update float variables \
                 only; expected float16, bfloat16, float32 or float64",
                var.describe()
            )));
        }
        if gradient.shape != var.shape {
            var.check(name, "apply_update", gradient)?;
        }
        let grad = Gradient::new(gradient.data, gradient.dtype, gradient_scale, var.dtype)
            .map_err(|e| StoreError::Invalid(format!("apply_update to variable {name:?}: {e}")))?;
        let slots = optimizer
            .slots()
            .into_iter()
            .map(|(slot, initial)| {
                self.slot(
                    &slot_name(name, prefix, slot),
                    var.dtype,
                    &var.shape,
                    initial,
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let iterations = self.slot(&slot_name(name, prefix, ITERATIONS), DType::I64, &[], 0.0)?;

        let mut state = var.lock();
        let mut slot_states: Vec<_> = slots.iter().map(|s| s.lock()).collect();
        let mut count = iterations.lock();
        let done = i64::from_le_bytes(count.data[..8].try_into().unwrap_or([0; 8]));
        let done = u64::try_from(done).unwrap_or(0);
        let mut slot_bytes: Vec<&mut [u8]> = slot_states
            .iter_mut()
            .map(|s| s.data.as_mut_slice())
            .collect();
        optimizer.apply_gradient(var.dtype, done, &mut state.data, &grad, &mut slot_bytes);
        count.data = (done.saturating_add(1) as i64).to_le_bytes().to_vec();
        count.version += 1;
        for s in &mut slot_states {
            s.version += 1;
        }
        state.version += 1;
        let after = read_value.then(|| var.snapshot(&state));
        Ok((state.version, after))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::pb;

    fn sgd_momentum() -> Optimizer {
        Optimizer::from_pb(Some(&pb::OptimizerSpec {
            kind: pb::optimizer_spec::Kind::Sgd as i32,
            momentum: 0.5,
            learning_rate: Some(pb::LearningRateSchedule {
                kind: pb::learning_rate_schedule::Kind::Constant as i32,
                initial: 1.0,
                ..Default::default()
            }),
            ..Default::default()
        }))
        .unwrap()
    }

    fn f32s(value: &pb::Tensor) -> Vec<f32> {
        value
            .data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn slots_and_count_are_created_and_updated_with_the_variable() {
        let store = VariableStore::new(0);
        let zero: &'static [u8] = &[0, 0, 0, 0];
        let view = |d: &'static [u8]| TensorView {
            dtype: DType::F32,
            shape: vec![1],
            data: d,
        };
        store.create("w", &view(zero), false).unwrap();
        let one: &'static [u8] = &[0, 0, 128, 63];
        let opt = sgd_momentum();
        store
            .apply_update("w", "SGD", &opt, &view(one), 0.0, false)
            .unwrap();
        let (version, value) = store
            .apply_update("w", "SGD", &opt, &view(one), 0.0, true)
            .unwrap();
        assert_eq!(version, 2);
        // trace 1 then 1.5: w = -2.5.
        assert_eq!(f32s(&value.unwrap()), [-2.5]);
        assert_eq!(f32s(&store.read("w/SGD/momentum").unwrap().0), [1.5]);
        let (count, _) = store.read("w/SGD/iterations").unwrap();
        assert_eq!(count.data.as_ref(), 2i64.to_le_bytes());
        assert!(store
            .apply_update("w", "", &opt, &view(one), 0.0, false)
            .is_err());
    }

    #[test]
    fn concurrent_updates_are_all_applied() {
        let store = Arc::new(VariableStore::new(0));
        let zero = 0f32.to_le_bytes();
        let view = TensorView {
            dtype: DType::F32,
            shape: vec![1],
            data: &zero,
        };
        store.create("w", &view, false).unwrap();
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let store = Arc::clone(&store);
                std::thread::spawn(move || {
                    let one = 1f32.to_le_bytes();
                    let g = TensorView {
                        dtype: DType::F32,
                        shape: vec![1],
                        data: &one,
                    };
                    for _ in 0..50 {
                        store
                            .apply_update("w", "SGD", &sgd_momentum(), &g, 0.0, false)
                            .unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let (count, _) = store.read("w/SGD/iterations").unwrap();
        assert_eq!(count.data.as_ref(), 400i64.to_le_bytes());
        // The trace after n unit gradients is 2 - 2^(1-n); the sum of traces is w.
        let trace = f32s(&store.read("w/SGD/momentum").unwrap().0)[0];
        assert!((trace - 2.0).abs() < 1e-6, "{trace}");
        let w = f32s(&store.read("w").unwrap().0)[0];
        assert!((w + 798.0).abs() < 1e-2, "{w}");
    }
}
