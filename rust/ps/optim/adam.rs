//! Adam and `AdamW` as optax's `adam`/`adamw`: moments `mu`, `nu`; bias correction with the
//! step count after this update; epsilon OUTSIDE the square root of the corrected `nu`
//! (`mu_hat / (sqrt(nu_hat) + eps)`), where Keras puts it outside the uncorrected one.
//! `AdamW` adds `weight_decay * param` to the Adam direction before scaling by the rate.

use super::real::Real;

/// Adam's hyperparameters, already in the compute type.
#[derive(Debug, Clone, Copy)]
pub struct Hyper<T> {
    /// Decay of the first moment.
    pub beta_1: T,
    /// Decay of the second moment.
    pub beta_2: T,
    /// Added to the root of the corrected second moment.
    pub epsilon: T,
    /// Decoupled weight decay (`AdamW`); zero for Adam.
    pub weight_decay: T,
}

/// One Adam step: `count` is the number of this update (1 for the first).
pub fn step<T: Real>(
    lr: T,
    h: Hyper<T>,
    count: i32,
    param: &mut [T],
    grad: &[T],
    mu: &mut [T],
    nu: &mut [T],
) {
    let c1 = T::ONE - h.beta_1.powi(count);
    let c2 = T::ONE - h.beta_2.powi(count);
    for (((p, &g), m), v) in param
        .iter_mut()
        .zip(grad)
        .zip(mu.iter_mut())
        .zip(nu.iter_mut())
    {
        *m = (T::ONE - h.beta_1) * g + h.beta_1 * *m;
        *v = (T::ONE - h.beta_2) * (g * g) + h.beta_2 * *v;
        let m_hat = *m / c1;
        let v_hat = *v / c2;
        let mut update = m_hat / (v_hat.sqrt() + h.epsilon);
        if h.weight_decay != T::ZERO {
            update = update + h.weight_decay * *p;
        }
        *p = *p + update * -lr;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: Hyper<f64> = Hyper {
        beta_1: 0.9,
        beta_2: 0.999,
        epsilon: 0.0,
        weight_decay: 0.0,
    };

    #[test]
    fn first_step_moves_by_the_rate_in_the_gradients_sign() {
        // With bias correction the first step is lr * g / |g| (epsilon 0).
        let (mut p, mut m, mut v) = ([1.0f64, 1.0], [0.0; 2], [0.0; 2]);
        step(0.1, H, 1, &mut p, &[3.0, -0.5], &mut m, &mut v);
        assert!(
            (p[0] - 0.9).abs() < 1e-12 && (p[1] - 1.1).abs() < 1e-12,
            "{p:?}"
        );
        assert!((m[0] - 0.3).abs() < 1e-12 && (v[0] - 0.009).abs() < 1e-12);
    }

    #[test]
    fn second_step_uses_the_second_bias_correction() {
        let (mut p, mut m, mut v) = ([0.0f64], [0.0], [0.0]);
        step(1.0, H, 1, &mut p, &[1.0], &mut m, &mut v);
        step(1.0, H, 2, &mut p, &[2.0], &mut m, &mut v);
        let m2 = 0.1 * 2.0 + 0.9 * 0.1;
        let v2 = 0.001 * 4.0 + 0.999 * 0.001;
        let expected = -1.0 - (m2 / (1.0 - 0.81)) / (v2 / (1.0 - 0.999f64.powi(2))).sqrt();
        assert!((p[0] - expected).abs() < 1e-12, "{} vs {expected}", p[0]);
    }

    #[test]
    fn adamw_decays_the_weights() {
        let h = Hyper {
            weight_decay: 0.5,
            ..H
        };
        let (mut p, mut m, mut v) = ([2.0f64], [0.0], [0.0]);
        step(0.1, h, 1, &mut p, &[1.0], &mut m, &mut v);
        // Adam direction 1, decay 0.5 * 2 = 1: p -= 0.1 * 2.
        assert!((p[0] - 1.8).abs() < 1e-12, "{}", p[0]);
    }
}
