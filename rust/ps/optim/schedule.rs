//! Learning-rate schedules the ps can evaluate: data, not Python callables, so the rate for
//! an update is computed under the variable's lock from the step count kept beside it.
//!
//! Each follows optax's definition (and Keras's, where the two agree):
//! `exponential_decay`, `cosine_decay_schedule` and Keras's `PiecewiseConstantDecay`.

use std::f64::consts::PI;

/// A learning rate as a function of the step (the updates applied before this one).
#[derive(Debug, Clone, PartialEq)]
pub enum Schedule {
    /// The same rate at every step.
    Constant(f64),
    /// `initial * decay_rate ^ (step / decay_steps)`, the exponent floored when `staircase`.
    ExponentialDecay {
        /// Rate at step 0.
        initial: f64,
        /// Steps per factor of `decay_rate`; positive.
        decay_steps: u64,
        /// Factor per `decay_steps` steps.
        decay_rate: f64,
        /// Decay in whole periods only.
        staircase: bool,
    },
    /// `initial * ((1 - alpha) * c + alpha)` with
    /// `c = 0.5 * (1 + cos(pi * min(step, decay_steps) / decay_steps))`.
    CosineDecay {
        /// Rate at step 0.
        initial: f64,
        /// Steps to decay over; positive.
        decay_steps: u64,
        /// Final rate as a fraction of `initial`.
        alpha: f64,
    },
    /// `values[i]` for `boundaries[i-1] < step <= boundaries[i]` (Keras's
    /// `PiecewiseConstantDecay`): one more value than boundaries, boundaries increasing.
    PiecewiseConstant {
        /// Increasing step boundaries.
        boundaries: Vec<u64>,
        /// `boundaries.len() + 1` rates.
        values: Vec<f64>,
    },
}

impl Schedule {
    /// Checks the parameters; the message says what is wrong and what is expected.
    pub fn validate(&self) -> Result<(), String> {
        match self {
            Schedule::Constant(_) => Ok(()),
            Schedule::ExponentialDecay { decay_steps, .. }
            | Schedule::CosineDecay { decay_steps, .. } => {
                if *decay_steps == 0 {
                    Err("a decay schedule has decay_steps = 0; expected 1 or more".to_owned())
                } else {
                    Ok(())
                }
            }
            Schedule::PiecewiseConstant { boundaries, values } => {
                if values.len() != boundaries.len() + 1 {
                    return Err(format!(
                        "a piecewise constant schedule has {} boundaries and {} values; \
                         expected one value more than boundaries",
                        boundaries.len(),
                        values.len()
                    ));
                }
                if boundaries.windows(2).any(|w| w[0] >= w[1]) {
                    return Err(format!(
                        "a piecewise constant schedule has boundaries {boundaries:?}; expected \
                         them strictly increasing"
                    ));
                }
                Ok(())
            }
        }
    }

    /// The rate at `step`.
    #[allow(clippy::cast_precision_loss)]
    pub fn at(&self, step: u64) -> f64 {
        match self {
            Schedule::Constant(rate) => *rate,
            Schedule::ExponentialDecay {
                initial,
                decay_steps,
                decay_rate,
                staircase,
            } => {
                let mut p = step as f64 / *decay_steps as f64;
                if *staircase {
                    p = p.floor();
                }
                initial * decay_rate.powf(p)
            }
            Schedule::CosineDecay {
                initial,
                decay_steps,
                alpha,
            } => {
                let done = step.min(*decay_steps) as f64 / *decay_steps as f64;
                let cosine = 0.5 * (1.0 + (PI * done).cos());
                initial * ((1.0 - alpha) * cosine + alpha)
            }
            Schedule::PiecewiseConstant { boundaries, values } => {
                let i = boundaries.iter().take_while(|&&b| step > b).count();
                values[i]
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::float_cmp)] // the values compared are exact in binary
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * b.abs().max(1.0)
    }

    #[test]
    fn constant_is_constant() {
        assert_eq!(Schedule::Constant(0.5).at(0), 0.5);
        assert_eq!(Schedule::Constant(0.5).at(1 << 40), 0.5);
    }

    #[test]
    fn exponential_decay_smooth_and_staircase() {
        let smooth = Schedule::ExponentialDecay {
            initial: 1.0,
            decay_steps: 10,
            decay_rate: 0.5,
            staircase: false,
        };
        assert!(close(smooth.at(0), 1.0));
        assert!(close(smooth.at(5), 0.5f64.sqrt()));
        assert!(close(smooth.at(20), 0.25));
        let stairs = Schedule::ExponentialDecay {
            initial: 1.0,
            decay_steps: 10,
            decay_rate: 0.5,
            staircase: true,
        };
        assert!(close(stairs.at(9), 1.0));
        assert!(close(stairs.at(10), 0.5));
    }

    #[test]
    fn cosine_decay_ends_at_alpha() {
        let s = Schedule::CosineDecay {
            initial: 2.0,
            decay_steps: 100,
            alpha: 0.1,
        };
        assert!(close(s.at(0), 2.0));
        assert!(close(s.at(50), 2.0 * (0.9 * 0.5 + 0.1)));
        assert!(close(s.at(100), 0.2));
        assert!(close(s.at(1000), 0.2));
    }

    #[test]
    fn piecewise_constant_uses_keras_boundaries() {
        let s = Schedule::PiecewiseConstant {
            boundaries: vec![10, 20],
            values: vec![1.0, 0.5, 0.1],
        };
        assert_eq!(
            [0, 10, 11, 20, 21].map(|t| s.at(t)),
            [1.0, 1.0, 0.5, 0.5, 0.1]
        );
    }

    #[test]
    fn invalid_schedules_are_refused() {
        let bad = Schedule::PiecewiseConstant {
            boundaries: vec![5, 5],
            values: vec![1.0, 2.0, 3.0],
        };
        assert!(bad.validate().unwrap_err().contains("increasing"));
        let bad = Schedule::PiecewiseConstant {
            boundaries: vec![5],
            values: vec![1.0],
        };
        assert!(bad.validate().unwrap_err().contains("one value more"));
        let bad = Schedule::CosineDecay {
            initial: 1.0,
            decay_steps: 0,
            alpha: 0.0,
        };
        assert!(bad.validate().unwrap_err().contains("decay_steps"));
    }
}
