//! Shared helpers of the reference's integration tests: a seeded generator for fresh random
//! inputs, and the spec's comparison rule (README "Comparison").
#![allow(dead_code)] // each test binary uses its own subset

use ndarray::{ArrayD, IxDyn};
use rand::rngs::StdRng;
use rand::{Rng as _, RngCore, SeedableRng};
use rand_distr::{StandardNormal, Uniform};

/// Seeded random inputs: a thin layer over `rand`'s [`StdRng`] (the seed comes from proptest, so
/// every case is fresh and every failure reproducible).
pub struct Rng(StdRng);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(StdRng::seed_from_u64(seed))
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }
    /// Uniform in `[lo, hi)` (`lo < hi`).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        self.0.random_range(lo..hi)
    }
    /// Uniform integer in `0 .. n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        self.0.random_range(0..n)
    }
    /// Standard normal.
    pub fn normal(&mut self) -> f64 {
        self.0.sample(StandardNormal)
    }
    /// A tensor of `shape` with entries uniform in `[lo, hi)`.
    pub fn array(&mut self, shape: &[usize], lo: f64, hi: f64) -> ArrayD<f64> {
        let u = Uniform::new(lo, hi).expect("lo < hi, both finite");
        ArrayD::from_shape_simple_fn(IxDyn(shape), || self.0.sample(u))
    }
    /// A tensor of `shape` with standard-normal entries.
    pub fn randn<D: ndarray::Dimension, Sh: ndarray::ShapeBuilder<Dim = D>>(
        &mut self,
        shape: Sh,
    ) -> ndarray::Array<f64, D> {
        ndarray::Array::from_shape_simple_fn(shape, || self.normal())
    }
    /// A random subset of `0 .. n` of size `k`, in random order.
    pub fn distinct(&mut self, n: usize, k: usize) -> Vec<usize> {
        rand::seq::index::sample(&mut self.0, n, k).into_vec()
    }
}

/// `max |ref - x|` over the elements.
pub fn max_abs<'a>(
    r: impl IntoIterator<Item = &'a f64>,
    x: impl IntoIterator<Item = &'a f64>,
) -> f64 {
    r.into_iter()
        .zip(x)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max)
}

/// `RMS(ref - x) / (RMS(ref) + 1e-8)`.
pub fn ratio<'a>(
    r: impl IntoIterator<Item = &'a f64>,
    x: impl IntoIterator<Item = &'a f64>,
) -> f64 {
    let (mut num, mut den, mut n) = (0.0, 0.0, 0usize);
    for (a, b) in r.into_iter().zip(x) {
        num += (a - b) * (a - b);
        den += a * a;
        n += 1;
    }
    if n == 0 {
        return 0.0;
    }
    (num / n as f64).sqrt() / ((den / n as f64).sqrt() + 1e-8)
}

/// The README rule: same shape, no NaN/Inf in `x` where `ref` is finite, and `max_abs <= 1e-6`
/// or `ratio <= threshold`. Non-finite `ref` entries must be matched exactly (NaN by NaN, Inf by
/// the same Inf) and are left out of `max_abs`/`ratio`.
pub fn check_close(
    name: &str,
    r: &ArrayD<f64>,
    x: &ArrayD<f64>,
    threshold: f64,
) -> Result<(), String> {
    if r.shape() != x.shape() {
        return Err(format!("{name}: shape {:?} vs {:?}", r.shape(), x.shape()));
    }
    let mut fr = Vec::new();
    let mut fx = Vec::new();
    for (i, (&a, &b)) in r.iter().zip(x.iter()).enumerate() {
        if a.is_finite() {
            if !b.is_finite() {
                return Err(format!(
                    "{name}: non-finite {b} at flat {i} where ref = {a}"
                ));
            }
            fr.push(a);
            fx.push(b);
        } else if !(a.is_nan() && b.is_nan() || a == b) {
            return Err(format!("{name}: ref {a} vs {b} at flat {i}"));
        }
    }
    let (m, q) = (max_abs(&fr, &fx), ratio(&fr, &fx));
    if m <= 1e-6 || q <= threshold {
        Ok(())
    } else {
        Err(format!(
            "{name}: max_abs {m:e}, ratio {q:e} > {threshold:e}"
        ))
    }
}

/// Bitwise equality of two `f64` tensors (NaN payloads included).
pub fn same_bits<D: ndarray::Dimension>(
    a: &ndarray::Array<f64, D>,
    b: &ndarray::Array<f64, D>,
) -> bool {
    a.shape() == b.shape()
        && a.iter()
            .zip(b.iter())
            .all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Widen an `f32` result for comparison against the oracle.
pub fn widen<D: ndarray::Dimension>(a: &ndarray::Array<f32, D>) -> ArrayD<f64> {
    a.mapv(f64::from).into_dyn()
}

/// Narrow an `f64` input to `f32` (the f32 run sees the rounded inputs).
pub fn narrow<D: ndarray::Dimension>(a: &ndarray::Array<f64, D>) -> ndarray::Array<f32, D> {
    a.mapv(|v| v as f32)
}
