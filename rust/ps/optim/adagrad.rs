//! Adagrad as optax's `adagrad` (and Keras's): `acc += g^2`, update
//! `-lr * g / sqrt(acc + eps)` (zero where `acc` is zero), `acc` starting at
//! `initial_accumulator_value`.

use super::real::Real;

/// One Adagrad step.
pub fn step<T: Real>(lr: T, epsilon: T, param: &mut [T], grad: &[T], acc: &mut [T]) {
    for ((p, &g), a) in param.iter_mut().zip(grad).zip(acc.iter_mut()) {
        *a = *a + g * g;
        let scale = if *a > T::ZERO {
            T::ONE / (*a + epsilon).sqrt()
        } else {
            T::ZERO
        };
        *p = *p + scale * g * -lr;
    }
}

#[cfg(test)]
#[allow(clippy::float_cmp)] // the values compared are exact in binary
mod tests {
    use super::*;

    #[test]
    fn accumulates_squares_and_divides_by_their_root() {
        let (mut p, mut acc) = ([1.0f64, 1.0], [0.0, 0.0]);
        step(0.5, 0.0, &mut p, &[3.0, 0.0], &mut acc);
        assert_eq!(acc, [9.0, 0.0]);
        assert!((p[0] - 0.5).abs() < 1e-12 && p[1] == 1.0, "{p:?}");
        step(0.5, 0.0, &mut p, &[4.0, 0.0], &mut acc);
        assert!((p[0] - (0.5 - 0.5 * 4.0 / 5.0)).abs() < 1e-12, "{p:?}");
    }
}
