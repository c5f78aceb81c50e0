//! Adam as optax's `adam` (and `amsgrad`): moments `mu`, `nu`; bias correction with the
//! step count after this update; epsilon OUTSIDE the square root of the corrected `nu`
//! (`mu_hat / (sqrt(nu_hat) + eps)`), where Keras puts it outside the uncorrected one. With
//! `AMSGrad` the root is of the largest corrected `nu` seen so far (`nu_max`), as optax's
//! `scale_by_amsgrad` keeps it; Keras keeps the largest uncorrected one. `AdamW`'s decay is
//! the optimizer's, applied before this step (`super::Optimizer::weight_decay`).

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
}

/// Adam's slots for one stretch of a variable.
#[derive(Debug)]
pub struct Moments<'a, T> {
    /// The first moment.
    pub mu: &'a mut [T],
    /// The second moment.
    pub nu: &'a mut [T],
    /// The largest corrected second moment so far (`AMSGrad`); empty for plain Adam.
    pub nu_max: &'a mut [T],
}

/// One Adam step: `count` is the number of this update (1 for the first).
pub fn step<T: Real>(
    lr: T,
    h: Hyper<T>,
    count: i32,
    param: &mut [T],
    grad: &[T],
    s: &mut Moments<'_, T>,
) {
    let c1 = T::ONE - h.beta_1.powi(count);
    let c2 = T::ONE - h.beta_2.powi(count);
    let amsgrad = !s.nu_max.is_empty();
    for (i, (p, &g)) in param.iter_mut().zip(grad).enumerate() {
        let m = (T::ONE - h.beta_1) * g + h.beta_1 * s.mu[i];
        let v = (T::ONE - h.beta_2) * (g * g) + h.beta_2 * s.nu[i];
        s.mu[i] = m;
        s.nu[i] = v;
        let m_hat = m / c1;
        let mut v_hat = v / c2;
        if amsgrad {
            if s.nu_max[i] > v_hat {
                v_hat = s.nu_max[i];
            }
            s.nu_max[i] = v_hat;
        }
        *p = *p + (m_hat / (v_hat.sqrt() + h.epsilon)) * -lr;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: Hyper<f64> = Hyper {
        beta_1: 0.9,
        beta_2: 0.999,
        epsilon: 0.0,
    };

    fn plain<'a>(mu: &'a mut [f64], nu: &'a mut [f64]) -> Moments<'a, f64> {
        Moments {
            mu,
            nu,
            nu_max: &mut [],
        }
    }

    #[test]
    fn first_step_moves_by_the_rate_in_the_gradients_sign() {
        // With bias correction the first step is lr * g / |g| (epsilon 0).
        let (mut p, mut m, mut v) = ([1.0f64, 1.0], [0.0; 2], [0.0; 2]);
        step(0.1, H, 1, &mut p, &[3.0, -0.5], &mut plain(&mut m, &mut v));
        assert!(
            (p[0] - 0.9).abs() < 1e-12 && (p[1] - 1.1).abs() < 1e-12,
            "{p:?}"
        );
        assert!((m[0] - 0.3).abs() < 1e-12 && (v[0] - 0.009).abs() < 1e-12);
    }

    #[test]
    fn second_step_uses_the_second_bias_correction() {
        let (mut p, mut m, mut v) = ([0.0f64], [0.0], [0.0]);
        step(1.0, H, 1, &mut p, &[1.0], &mut plain(&mut m, &mut v));
        step(1.0, H, 2, &mut p, &[2.0], &mut plain(&mut m, &mut v));
        let m2 = 0.1 * 2.0 + 0.9 * 0.1;
        let v2 = 0.001 * 4.0 + 0.999 * 0.001;
        let expected = -1.0 - (m2 / (1.0 - 0.81)) / (v2 / (1.0 - 0.999f64.powi(2))).sqrt();
        assert!((p[0] - expected).abs() < 1e-12, "{} vs {expected}", p[0]);
    }

    #[test]
    fn amsgrad_divides_by_the_largest_corrected_second_moment_seen() {
        // A large gradient, then a small one: plain Adam's denominator shrinks with the
        // second moment, AMSGrad's keeps the first step's.
        let (mut p, mut m, mut v) = ([0.0f64], [0.0], [0.0]);
        let (mut pa, mut ma, mut va, mut vmax) = ([0.0f64], [0.0], [0.0], [0.0]);
        for (count, g) in [(1, 10.0), (2, 0.1)] {
            step(0.1, H, count, &mut p, &[g], &mut plain(&mut m, &mut v));
            let mut amsgrad = Moments {
                mu: &mut ma,
                nu: &mut va,
                nu_max: &mut vmax,
            };
            step(0.1, H, count, &mut pa, &[g], &mut amsgrad);
        }
        assert!(
            (vmax[0] - 100.0).abs() < 1e-9,
            "the first step's corrected nu is 100"
        );
        let v2_hat = va[0] / (1.0 - 0.999f64.powi(2));
        assert!(v2_hat < vmax[0]);
        let m2_hat = ma[0] / (1.0 - 0.81);
        let expected = -0.1 - 0.1 * m2_hat / vmax[0].sqrt();
        assert!((pa[0] - expected).abs() < 1e-12, "{} vs {expected}", pa[0]);
        assert!(pa[0] > p[0], "AMSGrad's second step is the smaller one");
    }
}
