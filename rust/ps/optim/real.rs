//! The float arithmetic the update rules need, for `f32` and `f64`: rules are written once,
//! and a float32 variable is updated in float32 as optax does (float16 and bfloat16 go
//! through float32).

use std::ops::{Add, Div, Mul, Neg, Sub};

/// A float type an update rule computes in.
pub trait Real:
    Copy
    + PartialOrd
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
{
    /// Zero.
    const ZERO: Self;
    /// One.
    const ONE: Self;
    /// A hyperparameter (sent as float64) rounded to this type.
    fn of(value: f64) -> Self;
    /// Square root.
    #[must_use]
    fn sqrt(self) -> Self;
    /// `self` to an integer power (bias corrections).
    #[must_use]
    fn powi(self, n: i32) -> Self;
}

macro_rules! real {
    ($t:ty) => {
        impl Real for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            #[inline]
            fn of(value: f64) -> Self {
                value as $t
            }
            #[inline]
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            #[inline]
            fn powi(self, n: i32) -> Self {
                <$t>::powi(self, n)
            }
        }
    };
}

real!(f32);
real!(f64);
