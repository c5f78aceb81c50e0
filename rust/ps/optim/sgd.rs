//! SGD with optional (Nesterov) momentum, as optax's `sgd`: `trace = g + momentum * trace`,
//! update `-lr * trace` (Nesterov: `-lr * (g + momentum * trace)`). Keras's velocity form is
//! the same for a constant rate.

use super::real::Real;

/// One SGD step on `param`; `trace` is the momentum slot (empty without momentum).
pub fn step<T: Real>(
    lr: T,
    momentum: T,
    nesterov: bool,
    param: &mut [T],
    grad: &[T],
    trace: &mut [T],
) {
    if trace.is_empty() {
        for (p, &g) in param.iter_mut().zip(grad) {
            *p = *p + g * -lr;
        }
        return;
    }
    for ((p, &g), t) in param.iter_mut().zip(grad).zip(trace.iter_mut()) {
        *t = g + momentum * *t;
        let update = if nesterov { g + momentum * *t } else { *t };
        *p = *p + update * -lr;
    }
}

#[cfg(test)]
#[allow(clippy::float_cmp)] // the values compared are exact in binary
mod tests {
    use super::*;

    #[test]
    fn plain_sgd_subtracts_the_scaled_gradient() {
        let mut p = [1.0f64, 2.0];
        step(0.5, 0.0, false, &mut p, &[2.0, -2.0], &mut []);
        assert_eq!(p, [0.0, 3.0]);
    }

    #[test]
    fn momentum_accumulates_and_nesterov_looks_ahead() {
        let (mut p, mut t) = ([0.0f64], [0.0f64]);
        step(1.0, 0.9, false, &mut p, &[1.0], &mut t);
        step(1.0, 0.9, false, &mut p, &[1.0], &mut t);
        assert_eq!(t, [1.9]);
        assert!((p[0] + 2.9).abs() < 1e-12);
        let (mut p, mut t) = ([0.0f64], [0.0f64]);
        step(1.0, 0.9, true, &mut p, &[1.0], &mut t);
        assert!((p[0] + 1.9).abs() < 1e-12);
        assert_eq!(t, [1.0]);
    }
}
