//! Shared helpers of the reference's integration tests: a seeded generator for fresh random
//! inputs, and the spec's comparison rule (`conformance/spec/README.md`, "Comparison").
#![allow(dead_code)] // each test binary uses its own subset

pub use attn_testkit::Rng;
use ndarray::ArrayD;

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

/// The rule of `conformance/spec/README.md`: same shape, no NaN/Inf in `x` where `ref` is finite,
/// and `max_abs <= 1e-6` or `ratio <= threshold`. Non-finite `ref` entries must be matched exactly
/// (NaN by NaN, Inf by the same Inf) and are left out of `max_abs`/`ratio`.
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
