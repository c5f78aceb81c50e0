//! `RMSprop` as optax's `rmsprop` (and Keras's): `nu = rho * nu + (1 - rho) * g^2`, update
//! `g / sqrt(nu + eps)` (epsilon INSIDE the root; centered: `g / sqrt(nu - mu^2 + eps)` with
//! `mu` the mean gradient), scaled by `-lr`, then a momentum trace of the scaled update when
//! momentum is on.

use super::real::Real;

/// `RMSprop`'s hyperparameters, already in the compute type.
#[derive(Debug, Clone, Copy)]
pub struct Hyper<T> {
    /// Decay of the squared-gradient average.
    pub rho: T,
    /// Added inside the square root.
    pub epsilon: T,
    /// Momentum of the trace of updates (used when the trace slot exists).
    pub momentum: T,
}

/// `RMSprop`'s slots: `mu` empty unless centered, `trace` empty without momentum.
pub struct Slots<'a, T> {
    /// Average of squared gradients.
    pub nu: &'a mut [T],
    /// Average of gradients (centered only).
    pub mu: &'a mut [T],
    /// Momentum trace (momentum only).
    pub trace: &'a mut [T],
}

/// One `RMSprop` step.
pub fn step<T: Real>(lr: T, h: Hyper<T>, param: &mut [T], grad: &[T], s: &mut Slots<'_, T>) {
    let centered = !s.mu.is_empty();
    let with_momentum = !s.trace.is_empty();
    for (i, (p, &g)) in param.iter_mut().zip(grad).enumerate() {
        let nu = (T::ONE - h.rho) * (g * g) + h.rho * s.nu[i];
        s.nu[i] = nu;
        let denominator = if centered {
            let mu = (T::ONE - h.rho) * g + h.rho * s.mu[i];
            s.mu[i] = mu;
            nu - mu * mu
        } else {
            nu
        };
        let mut update = g / (denominator + h.epsilon).sqrt() * -lr;
        if with_momentum {
            update = update + h.momentum * s.trace[i];
            s.trace[i] = update;
        }
        *p = *p + update;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: Hyper<f64> = Hyper {
        rho: 0.9,
        epsilon: 0.0,
        momentum: 0.0,
    };

    #[test]
    fn plain_step_normalises_by_the_root_mean_square() {
        let (mut p, mut nu) = ([0.0f64], [0.0]);
        let mut slots = Slots {
            nu: &mut nu,
            mu: &mut [],
            trace: &mut [],
        };
        step(0.1, H, &mut p, &[2.0], &mut slots);
        assert!((nu[0] - 0.4).abs() < 1e-12);
        assert!((p[0] + 0.1 * 2.0 / 0.4f64.sqrt()).abs() < 1e-12, "{}", p[0]);
    }

    #[test]
    fn centered_subtracts_the_squared_mean() {
        let (mut p, mut nu, mut mu) = ([0.0f64], [0.0], [0.0]);
        let mut slots = Slots {
            nu: &mut nu,
            mu: &mut mu,
            trace: &mut [],
        };
        step(1.0, H, &mut p, &[1.0], &mut slots);
        assert!((mu[0] - 0.1).abs() < 1e-12);
        assert!(
            (p[0] + 1.0 / (0.1f64 - 0.01).sqrt()).abs() < 1e-12,
            "{}",
            p[0]
        );
    }

    #[test]
    fn momentum_keeps_a_trace_of_scaled_updates() {
        let h = Hyper { momentum: 0.5, ..H };
        let (mut p, mut nu, mut trace) = ([0.0f64], [0.0], [0.0]);
        step(
            1.0,
            h,
            &mut p,
            &[1.0],
            &mut Slots {
                nu: &mut nu,
                mu: &mut [],
                trace: &mut trace,
            },
        );
        let first = -1.0 / 0.1f64.sqrt();
        assert!((trace[0] - first).abs() < 1e-12);
        step(
            1.0,
            h,
            &mut p,
            &[1.0],
            &mut Slots {
                nu: &mut nu,
                mu: &mut [],
                trace: &mut trace,
            },
        );
        let second = -1.0 / 0.19f64.sqrt() + 0.5 * first;
        assert!((p[0] - (first + second)).abs() < 1e-12, "{}", p[0]);
    }
}
