//! Shared helpers of the reference's integration tests: a seeded generator for fresh random
//! inputs, and the spec's comparison rule (README "Comparison").
#![allow(dead_code)] // each test binary uses its own subset

use ndarray::{ArrayD, IxDyn};

/// SplitMix64: a tiny seeded generator (the seed comes from proptest, so every case is fresh
/// and every failure reproducible).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }
    /// Uniform integer in `0 .. n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    /// A tensor of `shape` with entries uniform in `[lo, hi)`.
    pub fn array(&mut self, shape: &[usize], lo: f64, hi: f64) -> ArrayD<f64> {
        ArrayD::from_shape_simple_fn(IxDyn(shape), || self.uniform(lo, hi))
    }
    /// A random subset of `0 .. n` of size `k`, in random order.
    pub fn distinct(&mut self, n: usize, k: usize) -> Vec<usize> {
        let mut all: Vec<usize> = (0..n).collect();
        for i in 0..k {
            let j = i + self.below(n - i);
            all.swap(i, j);
        }
        all.truncate(k);
        all
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
