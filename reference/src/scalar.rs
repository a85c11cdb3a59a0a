//! The element type of the reference: `f32` or `f64` (`f64` is the oracle).

use std::fmt::{Debug, Display};

/// A real scalar the reference computes in. Half-precision inputs are widened to one of these
/// before any arithmetic.
pub trait Real:
    num_traits::Float
    + num_traits::FromPrimitive
    + num_traits::NumAssign
    + ndarray::ScalarOperand
    + std::iter::Sum
    + Default
    + Debug
    + Display
    + Send
    + Sync
    + 'static
{
    /// `"float32"` or `"float64"`.
    const NAME: &'static str;
    /// The value of an `f64` constant in this type (rounded once).
    fn c(x: f64) -> Self;
    /// Widen (or keep) to `f64`.
    fn f64(self) -> f64;
}

impl Real for f32 {
    const NAME: &'static str = "float32";
    fn c(x: f64) -> Self {
        x as f32
    }
    fn f64(self) -> f64 {
        self as f64
    }
}

impl Real for f64 {
    const NAME: &'static str = "float64";
    fn c(x: f64) -> Self {
        x
    }
    fn f64(self) -> f64 {
        self
    }
}

/// `1/ln 2` as FLA's kernels use it: the fp32 value `1.4426950216`. Callers pass it as the
/// `scale` of the chunk scans (KDA does); the float64 oracle's own conversions to log2 units (the
/// chunked forms of `kda_fwd` and `gdn_fwd`) use the exact `1/ln 2` instead
/// (`conformance/spec/ops-delta-rule.md` §9.2).
pub const RCP_LN2: f64 = 1.4426950216;
