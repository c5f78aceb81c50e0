//! `jaxcluster._core.OptimizerSpec`: an optimizer's rule, hyperparameters and schedule as a
//! typed, frozen value, checked when made (the same checks the ps makes), sent with each
//! `PsClient.apply_update`.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::ps::optim::Optimizer;
use crate::rpc::pb;

/// An optimizer for `PsClient.apply_update`; made by `jaxcluster.strategy.optimizers`.
#[pyclass(module = "jaxcluster._core", name = "OptimizerSpec", frozen)]
pub struct PyOptimizerSpec {
    pub(super) spec: pb::OptimizerSpec,
}

fn kind(name: &str) -> PyResult<i32> {
    use pb::optimizer_spec::Kind;
    Ok(match name {
        "sgd" => Kind::Sgd,
        "adam" => Kind::Adam,
        "adamw" => Kind::Adamw,
        "rmsprop" => Kind::Rmsprop,
        "adagrad" => Kind::Adagrad,
        other => {
            return Err(PyValueError::new_err(format!(
                "optimizer kind {other:?} is unknown; expected sgd, adam, adamw, rmsprop or \
                 adagrad"
            )))
        }
    } as i32)
}

fn schedule_kind(name: &str) -> PyResult<i32> {
    use pb::learning_rate_schedule::Kind;
    Ok(match name {
        "constant" => Kind::Constant,
        "exponential_decay" => Kind::ExponentialDecay,
        "cosine_decay" => Kind::CosineDecay,
        "piecewise_constant" => Kind::PiecewiseConstant,
        other => {
            return Err(PyValueError::new_err(format!(
                "schedule {other:?} is unknown; expected constant, exponential_decay, \
                 cosine_decay or piecewise_constant"
            )))
        }
    } as i32)
}

#[pymethods]
impl PyOptimizerSpec {
    #[new]
    #[pyo3(signature = (
        kind_name, *, schedule="constant", initial=0.0, decay_steps=0, decay_rate=0.0,
        staircase=false, alpha=0.0, boundaries=vec![], values=vec![], momentum=0.0,
        nesterov=false, beta_1=0.0, beta_2=0.0, epsilon=0.0, weight_decay=0.0, rho=0.0,
        centered=false, initial_accumulator_value=0.0, amsgrad=false
    ))]
    // Keras's keyword arguments, as Python passes them.
    #[allow(clippy::too_many_arguments, clippy::fn_params_excessive_bools)]
    fn new(
        kind_name: &str,
        schedule: &str,
        initial: f64,
        decay_steps: u64,
        decay_rate: f64,
        staircase: bool,
        alpha: f64,
        boundaries: Vec<u64>,
        values: Vec<f64>,
        momentum: f64,
        nesterov: bool,
        beta_1: f64,
        beta_2: f64,
        epsilon: f64,
        weight_decay: f64,
        rho: f64,
        centered: bool,
        initial_accumulator_value: f64,
        amsgrad: bool,
    ) -> PyResult<Self> {
        let spec = pb::OptimizerSpec {
            kind: kind(kind_name)?,
            learning_rate: Some(pb::LearningRateSchedule {
                kind: schedule_kind(schedule)?,
                initial,
                decay_steps,
                decay_rate,
                staircase,
                alpha,
                boundaries,
                values,
            }),
            momentum,
            nesterov,
            beta_1,
            beta_2,
            epsilon,
            weight_decay,
            rho,
            centered,
            initial_accumulator_value,
            amsgrad,
        };
        Optimizer::from_pb(Some(&spec)).map_err(PyValueError::new_err)?;
        Ok(Self { spec })
    }

    /// The slots the ps keeps beside each variable, with their starting values.
    fn slots(&self) -> Vec<(&'static str, f64)> {
        Optimizer::from_pb(Some(&self.spec))
            .map(|o| o.slots())
            .unwrap_or_default()
    }

    fn __repr__(&self) -> String {
        format!("OptimizerSpec({:?})", self.spec)
    }
}
