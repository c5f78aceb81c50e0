//! Optimizers that run on the parameter server (`ApplyUpdate`): a caller sends a gradient,
//! the ps updates the variable, its slots and its step count together under the variable's
//! lock (see `store::VariableStore::apply_update`).
//!
//! [`Rule`] is the typed form of `OptimizerSpec`; each rule's math lives in its own module
//! and follows optax's reference implementation (the docs of each module say where Keras
//! differs). Float32 and float64 variables are updated in their own precision, float16 and
//! bfloat16 through float32, as the ps's other arithmetic is.

pub mod adagrad;
pub mod adam;
pub mod compress;
pub mod real;
pub mod rmsprop;
pub mod schedule;
pub mod sgd;

use std::ops::Range;

use half::{bf16, f16};

use super::dtype::DType;
use crate::rpc::pb;
pub use compress::Gradient;
use real::Real;
pub use schedule::Schedule;

/// Name of the int64 scalar slot counting the updates a variable had from one optimizer.
pub const ITERATIONS: &str = "iterations";

/// An update rule with its hyperparameters (Keras's names).
#[derive(Debug, Clone, PartialEq)]
pub enum Rule {
    /// SGD; a `momentum` slot when `momentum > 0`.
    Sgd {
        /// Momentum of the gradient trace; 0 for none.
        momentum: f64,
        /// Nesterov's look-ahead.
        nesterov: bool,
    },
    /// Adam, and `AdamW` (Adam with a weight decay).
    Adam {
        /// First-moment decay.
        beta_1: f64,
        /// Second-moment decay.
        beta_2: f64,
        /// Added to the root of the corrected second moment.
        epsilon: f64,
        /// Divide by the largest corrected second moment seen (a `v_max` slot).
        amsgrad: bool,
    },
    /// `RMSprop`.
    RmsProp {
        /// Decay of the squared-gradient average.
        rho: f64,
        /// Momentum of the update trace; 0 for none.
        momentum: f64,
        /// Added inside the root.
        epsilon: f64,
        /// Subtract the squared mean gradient.
        centered: bool,
    },
    /// Adagrad.
    Adagrad {
        /// Starting value of the accumulator.
        initial_accumulator_value: f64,
        /// Added inside the root.
        epsilon: f64,
    },
}

/// A rule, its learning-rate schedule and its weight decay, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Optimizer {
    /// The update rule.
    pub rule: Rule,
    /// The learning rate by step.
    pub learning_rate: Schedule,
    /// Keras's decoupled weight decay, for every rule: `param -= lr * weight_decay * param`
    /// before the rule's step (0: none). For Adam this is `AdamW`, and optax's `adamw`.
    pub weight_decay: f64,
}

fn schedule_from_pb(spec: Option<&pb::LearningRateSchedule>) -> Result<Schedule, String> {
    use pb::learning_rate_schedule::Kind;
    let spec = spec.ok_or("the optimizer has no learning_rate; expected a schedule")?;
    let schedule = match Kind::try_from(spec.kind).unwrap_or(Kind::Unspecified) {
        Kind::Constant => Schedule::Constant(spec.initial),
        Kind::ExponentialDecay => Schedule::ExponentialDecay {
            initial: spec.initial,
            decay_steps: spec.decay_steps,
            decay_rate: spec.decay_rate,
            staircase: spec.staircase,
        },
        Kind::CosineDecay => Schedule::CosineDecay {
            initial: spec.initial,
            decay_steps: spec.decay_steps,
            alpha: spec.alpha,
        },
        Kind::PiecewiseConstant => Schedule::PiecewiseConstant {
            boundaries: spec.boundaries.clone(),
            values: spec.values.clone(),
        },
        Kind::Unspecified => {
            return Err(format!(
                "learning-rate schedule kind {} is unknown to this ps; expected constant, \
                 exponential decay, cosine decay or piecewise constant",
                spec.kind
            ))
        }
    };
    schedule.validate()?;
    Ok(schedule)
}

impl Optimizer {
    /// Checks and converts a protocol `OptimizerSpec`.
    pub fn from_pb(spec: Option<&pb::OptimizerSpec>) -> Result<Self, String> {
        use pb::optimizer_spec::Kind;
        let spec = spec.ok_or("the request has no optimizer; expected an OptimizerSpec")?;
        let rule = match Kind::try_from(spec.kind).unwrap_or(Kind::Unspecified) {
            Kind::Sgd => Rule::Sgd {
                momentum: spec.momentum,
                nesterov: spec.nesterov,
            },
            Kind::Adam | Kind::Adamw => Rule::Adam {
                beta_1: spec.beta_1,
                beta_2: spec.beta_2,
                epsilon: spec.epsilon,
                amsgrad: spec.amsgrad,
            },
            Kind::Rmsprop => Rule::RmsProp {
                rho: spec.rho,
                momentum: spec.momentum,
                epsilon: spec.epsilon,
                centered: spec.centered,
            },
            Kind::Adagrad => Rule::Adagrad {
                initial_accumulator_value: spec.initial_accumulator_value,
                epsilon: spec.epsilon,
            },
            Kind::Unspecified => {
                return Err(format!(
                    "optimizer kind {} is unknown to this ps; expected SGD, Adam, AdamW, \
                     RMSprop or Adagrad",
                    spec.kind
                ))
            }
        };
        if let Rule::Sgd { momentum, .. } | Rule::RmsProp { momentum, .. } = rule {
            if !(0.0..1.0).contains(&momentum) {
                return Err(format!(
                    "the optimizer has momentum {momentum}; expected 0 <= momentum < 1"
                ));
            }
        }
        if !(spec.weight_decay.is_finite() && spec.weight_decay >= 0.0) {
            return Err(format!(
                "the optimizer has weight_decay {}; expected a finite number >= 0",
                spec.weight_decay
            ));
        }
        Ok(Self {
            rule,
            learning_rate: schedule_from_pb(spec.learning_rate.as_ref())?,
            weight_decay: spec.weight_decay,
        })
    }

    /// The slots this optimizer keeps beside a variable, with their starting value, in the
    /// order [`Optimizer::apply`] takes them (the step count is kept apart).
    pub fn slots(&self) -> Vec<(&'static str, f64)> {
        match self.rule {
            Rule::Sgd { momentum, .. } if momentum > 0.0 => vec![("momentum", 0.0)],
            Rule::Sgd { .. } => vec![],
            Rule::Adam { amsgrad: false, .. } => vec![("m", 0.0), ("v", 0.0)],
            Rule::Adam { amsgrad: true, .. } => vec![("m", 0.0), ("v", 0.0), ("v_max", 0.0)],
            Rule::RmsProp {
                momentum, centered, ..
            } => {
                let mut slots = vec![("velocity", 0.0)];
                if centered {
                    slots.push(("average_gradient", 0.0));
                }
                if momentum > 0.0 {
                    slots.push(("momentum", 0.0));
                }
                slots
            }
            Rule::Adagrad {
                initial_accumulator_value,
                ..
            } => vec![("accumulator", initial_accumulator_value)],
        }
    }

    /// Whether this optimizer can update a variable of `dtype` (floats only).
    pub fn supports(dtype: DType) -> bool {
        matches!(dtype, DType::F16 | DType::BF16 | DType::F32 | DType::F64)
    }

    /// One step on `param` (raw little-endian bytes of `dtype`) with `grad` (bytes of the
    /// same dtype), updating `slots` (as [`Optimizer::slots`] lists them); `done` is the
    /// number of updates this optimizer applied to the variable before. The caller checks
    /// dtypes and lengths.
    pub fn apply(
        &self,
        dtype: DType,
        done: u64,
        param: &mut [u8],
        grad: &[u8],
        slots: &mut [&mut [u8]],
    ) {
        self.apply_gradient(dtype, done, param, &Gradient::Same(grad), slots);
    }

    /// [`Optimizer::apply`] with a gradient that may be compressed: it is widened a chunk
    /// at a time as the update goes, exactly as if it had been widened whole first.
    pub fn apply_gradient(
        &self,
        dtype: DType,
        done: u64,
        param: &mut [u8],
        grad: &Gradient<'_>,
        slots: &mut [&mut [u8]],
    ) {
        match dtype {
            DType::F16 => self.apply_as::<f16, f32>(done, param, grad, slots),
            DType::BF16 => self.apply_as::<bf16, f32>(done, param, grad, slots),
            DType::F32 => self.apply_as::<f32, f32>(done, param, grad, slots),
            DType::F64 => self.apply_as::<f64, f64>(done, param, grad, slots),
            other => unreachable!("apply_update on {other}: the store checks float dtypes"),
        }
    }

    /// Steps a large variable in parts on scoped threads, one part per core (every rule is
    /// elementwise, so the result is the same bits): the caller waits for the answer while
    /// the ps computes, so its core is free. A 64 MiB Adam update was two thirds of the ps's
    /// CPU and most of the time of a call; below [`PART_ELEMENTS`] per part, threads cost
    /// more than they save.
    fn apply_as<S: Stored<T>, T: Real + Send>(
        &self,
        done: u64,
        param: &mut [u8],
        grad: &Gradient<'_>,
        slots: &mut [&mut [u8]],
    ) {
        let elements = param.len() / S::SIZE;
        let cores = cores();
        let parts = cores.min(MAX_PARTS).min(elements / PART_ELEMENTS).max(1);
        if parts == 1 {
            return self.apply_range::<S, T>(done, param, grad, slots);
        }
        let per_part = elements.div_ceil(parts).next_multiple_of(CHUNK);
        std::thread::scope(|scope| {
            let mut rest_param = param;
            let mut rest_slots: Vec<&mut [u8]> = slots.iter_mut().map(|s| &mut **s).collect();
            let mut start = 0;
            while start < elements {
                let n = per_part.min(elements - start);
                let (part_param, tail) = std::mem::take(&mut rest_param).split_at_mut(n * S::SIZE);
                rest_param = tail;
                let mut part_slots = Vec::with_capacity(rest_slots.len());
                for slot in &mut rest_slots {
                    let (head, tail) = std::mem::take(slot).split_at_mut(n * S::SIZE);
                    part_slots.push(head);
                    *slot = tail;
                }
                let part_grad = grad.part(start..start + n, S::SIZE);
                start += n;
                if start < elements {
                    scope.spawn(move || {
                        self.apply_range::<S, T>(done, part_param, &part_grad, &mut part_slots);
                    });
                } else {
                    self.apply_range::<S, T>(done, part_param, &part_grad, &mut part_slots);
                }
            }
        });
    }

    /// One part of an update: in place when the variable and its slots are typed memory of
    /// the compute type ([`Stored::typed`]: float32 and float64 on a little-endian machine,
    /// aligned), else through scratch buffers ([`Optimizer::apply_decoded`]).
    fn apply_range<S: Stored<T>, T: Real>(
        &self,
        done: u64,
        param: &mut [u8],
        grad: &Gradient<'_>,
        slots: &mut [&mut [u8]],
    ) {
        let typed: Option<Vec<&mut [T]>> = slots.iter_mut().map(|s| S::typed(s)).collect();
        if let (Some(mut typed), Some(param)) = (typed, S::typed(param)) {
            return self.apply_typed::<S, T>(done, param, grad, &mut typed);
        }
        self.apply_decoded::<S, T>(done, param, grad, slots);
    }

    /// Steps typed memory in place, [`CHUNK`] elements at a time: only the gradient is
    /// decoded (its bytes sit at any offset in the request, so they are not aligned), into
    /// a scratch buffer that stays in cache. The variable and its slots are read and written
    /// once each, with no copy: the update's memory traffic is the rule's own.
    fn apply_typed<S: Stored<T>, T: Real>(
        &self,
        done: u64,
        param: &mut [T],
        grad: &Gradient<'_>,
        slots: &mut [&mut [T]],
    ) {
        let lr = T::of(self.learning_rate.at(done));
        let mut g = Vec::with_capacity(CHUNK);
        let mut start = 0;
        while start < param.len() {
            let items = start..(start + CHUNK).min(param.len());
            S::decode_gradient(grad, items.clone(), &mut g);
            let mut views: Vec<&mut [T]> =
                slots.iter_mut().map(|s| &mut s[items.clone()]).collect();
            self.rule_step(lr, done, &mut param[items.clone()], &g, &mut views);
            start = items.end;
        }
    }

    /// Decodes, steps and encodes back [`CHUNK`] elements at a time (stored types that are
    /// not the compute type, or unaligned memory): each buffer is read and written once per
    /// update, with no copy of the whole variable, its slots or its (widened) gradient.
    fn apply_decoded<S: Stored<T>, T: Real>(
        &self,
        done: u64,
        param: &mut [u8],
        grad: &Gradient<'_>,
        slots: &mut [&mut [u8]],
    ) {
        let lr = T::of(self.learning_rate.at(done));
        let (mut p, mut g) = (Vec::with_capacity(CHUNK), Vec::with_capacity(CHUNK));
        let mut s: Vec<Vec<T>> = slots.iter().map(|_| Vec::with_capacity(CHUNK)).collect();
        let elements = param.len() / S::SIZE;
        let mut start = 0;
        while start < elements {
            let items = start..(start + CHUNK).min(elements);
            let range = items.start * S::SIZE..items.end * S::SIZE;
            S::decode_into(&param[range.clone()], &mut p);
            S::decode_gradient(grad, items.clone(), &mut g);
            for (values, bytes) in s.iter_mut().zip(slots.iter()) {
                S::decode_into(&bytes[range.clone()], values);
            }
            let mut views: Vec<&mut [T]> = s.iter_mut().map(Vec::as_mut_slice).collect();
            self.rule_step(lr, done, &mut p, &g, &mut views);
            S::encode(&p, &mut param[range.clone()]);
            for (values, bytes) in s.iter().zip(slots.iter_mut()) {
                S::encode(values, &mut bytes[range.clone()]);
            }
            start = items.end;
        }
    }

    fn rule_step<T: Real>(&self, lr: T, done: u64, p: &mut [T], g: &[T], s: &mut [&mut [T]]) {
        if self.weight_decay != 0.0 {
            // Keras's order: the decay first, from the parameter before this step.
            let decay = T::of(self.weight_decay) * lr;
            for x in p.iter_mut() {
                *x = *x - decay * *x;
            }
        }
        let mut rest = s.iter_mut().map(|slot| &mut **slot);
        let mut next = || rest.next().unwrap_or_default();
        match self.rule {
            Rule::Sgd { momentum, nesterov } => {
                sgd::step(lr, T::of(momentum), nesterov, p, g, next());
            }
            Rule::Adam {
                beta_1,
                beta_2,
                epsilon,
                amsgrad,
            } => {
                let h = adam::Hyper {
                    beta_1: T::of(beta_1),
                    beta_2: T::of(beta_2),
                    epsilon: T::of(epsilon),
                };
                // optax counts in int32 and saturates; so does this.
                let count = i32::try_from(done.saturating_add(1)).unwrap_or(i32::MAX);
                let (mu, nu) = (next(), next());
                let nu_max = if amsgrad { next() } else { &mut [] };
                adam::step(lr, h, count, p, g, &mut adam::Moments { mu, nu, nu_max });
            }
            Rule::RmsProp {
                rho,
                momentum,
                epsilon,
                centered,
            } => {
                let h = rmsprop::Hyper {
                    rho: T::of(rho),
                    epsilon: T::of(epsilon),
                    momentum: T::of(momentum),
                };
                let nu = next();
                let mu = if centered { next() } else { &mut [] };
                let trace = if momentum > 0.0 { next() } else { &mut [] };
                rmsprop::step(lr, h, p, g, &mut rmsprop::Slots { nu, mu, trace });
            }
            Rule::Adagrad { epsilon, .. } => adagrad::step(lr, T::of(epsilon), p, g, next()),
        }
    }
}

/// Elements an update decodes at a time: the chunk of the variable, its gradient and its
/// slots stays in cache between decoding, stepping and encoding.
const CHUNK: usize = 1024;

/// Fewest elements of a part stepped on a thread of its own (1 MiB of float32).
const PART_ELEMENTS: usize = 1 << 18;

/// Most threads one update uses.
const MAX_PARTS: usize = 8;

/// The cores this process may use, asked once: `available_parallelism` reads the cgroup's
/// CPU quota from /proc on every call, a cost per update that is not the update's.
fn cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, std::num::NonZero::get))
}

/// How a stored float type converts to and from the type it is computed in.
trait Stored<T>: Sized {
    const SIZE: usize;
    /// Replaces the contents of `out` with the values in `bytes`.
    fn decode_into(bytes: &[u8], out: &mut Vec<T>);
    fn encode(values: &[T], out: &mut [u8]);
    /// `bytes` as values of the compute type in place, when they are that type's memory:
    /// this type is the compute type, the machine is little-endian (the wire's and the
    /// store's byte order) and `bytes` is aligned for it. `None` otherwise.
    fn typed(bytes: &mut [u8]) -> Option<&mut [T]> {
        let _ = bytes;
        None
    }
    /// A float64 rounded to this stored type, as the compute type.
    fn round(value: f64) -> T;
    /// Replaces the contents of `out` with elements `items` of `grad` as this stored type
    /// holds them (a compressed gradient widened through float64, then rounded to it).
    fn decode_gradient(grad: &Gradient<'_>, items: Range<usize>, out: &mut Vec<T>) {
        match *grad {
            Gradient::Same(bytes) => {
                Self::decode_into(
                    &bytes[items.start * Self::SIZE..items.end * Self::SIZE],
                    out,
                );
            }
            Gradient::Bf16(bytes) => {
                out.clear();
                out.extend(
                    bytes[items.start * 2..items.end * 2]
                        .chunks_exact(2)
                        .map(|c| Self::round(f64::from(bf16::from_le_bytes([c[0], c[1]])))),
                );
            }
            Gradient::Int8 { data, scale } => {
                out.clear();
                out.extend(
                    data[items]
                        .iter()
                        .map(|&b| Self::round(f64::from(i8::from_le_bytes([b])) * scale)),
                );
            }
        }
    }
    #[cfg(test)]
    fn decode(bytes: &[u8]) -> Vec<T> {
        let mut out = Vec::new();
        Self::decode_into(bytes, &mut out);
        out
    }
}

macro_rules! stored {
    ($s:ty, $t:ty, $to:expr, $from:expr, $round:expr, typed) => {
        stored!($s, $t, $to, $from, $round, {
            fn typed(bytes: &mut [u8]) -> Option<&mut [$t]> {
                if cfg!(target_endian = "little") {
                    <[$t] as zerocopy::FromBytes>::mut_from_bytes(bytes).ok()
                } else {
                    None
                }
            }
        });
    };
    ($s:ty, $t:ty, $to:expr, $from:expr, $round:expr) => {
        stored!($s, $t, $to, $from, $round, {});
    };
    ($s:ty, $t:ty, $to:expr, $from:expr, $round:expr, { $($typed:tt)* }) => {
        impl Stored<$t> for $s {
            const SIZE: usize = std::mem::size_of::<$s>();
            #[inline]
            fn round(value: f64) -> $t {
                $round(value)
            }
            $($typed)*
            fn decode_into(bytes: &[u8], out: &mut Vec<$t>) {
                out.clear();
                out.extend(bytes.chunks_exact(Self::SIZE).map(|c| {
                    let mut raw = [0u8; std::mem::size_of::<$s>()];
                    raw.copy_from_slice(c);
                    $to(<$s>::from_le_bytes(raw))
                }));
            }
            fn encode(values: &[$t], out: &mut [u8]) {
                for (v, c) in values.iter().zip(out.chunks_exact_mut(Self::SIZE)) {
                    let s: $s = $from(*v);
                    c.copy_from_slice(&s.to_le_bytes());
                }
            }
        }
    };
}

stored!(f32, f32, |x| x, |x| x, |v: f64| v as f32, typed);
stored!(f64, f64, |x| x, |x| x, |v: f64| v, typed);
stored!(f16, f32, f16::to_f32, f16::from_f32, |v| f16::from_f64(v)
    .to_f32());
stored!(bf16, f32, bf16::to_f32, bf16::from_f32, |v| bf16::from_f64(
    v
)
.to_f32());

#[cfg(test)]
mod tests;
