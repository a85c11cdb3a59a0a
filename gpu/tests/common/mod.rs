//! Shared helpers of the GPU tests: the harness that reports a test without a GPU as not run,
//! seeded inputs rounded to a device dtype, poisoned outputs, and the spec's comparison rule.
//!
//! # Writing a GPU test file
//! Every `gpu/tests/*.rs` runs under the harness of [`harness`] (`libtest-mimic`), so that a
//! test that could not run shows as `ignored (no GPU available: ...)` instead of `ok`. A new file:
//!
//! ```ignore
//! mod common;
//! use common::*; // Gpu, upload, assert_close, ...
//!
//! fn matches_the_reference(gpu: &Gpu) { /* gets the shared GPU; not run without one */ }
//! fn refuses_bad_shapes() { /* needs no GPU: runs everywhere */ }
//!
//! gpu_tests!(matches_the_reference, refuses_bad_shapes);
//! ```
//!
//! and in gpu/Cargo.toml
//!
//! ```toml
//! [[test]]
//! name = "my_file"
//! harness = false
//! ```
//!
//! No `#[test]` attributes: the fns listed in `gpu_tests!` are the tests, named as written
//! (`module::name` for one in a module). A test that finds out itself that it cannot run (no
//! NVRTC) returns `harness::not_run(why)` (a `Result<Completion, Failed>`). With
//! `ATTN_REQUIRE_GPU=1` a test that could not run fails. The usual arguments work:
//! `cargo test -p attn-gpu --test my_file -- NAME`, `--exact`, `--skip`, `--list`,
//! `--test-threads N`.
#![allow(dead_code)] // each test binary uses its own subset

pub mod delta;
pub mod forward;
pub mod harness;
pub mod nsa;

use attn_gpu::DeviceTensor;
pub use attn_gpu::Gpu;
use attn_reference::Dtype;
use half::{bf16, f16};
use ndarray::ArrayD;

/// A proptest config of `n` cases, or `$ATTN_TEST_CASES` cases when set (fewer under
/// compute-sanitizer, which slows kernels down a lot).
pub fn cases(n: u32) -> proptest::test_runner::Config {
    let n = reduced_cases().map_or(n, |c| c.min(u32::MAX as usize) as u32);
    proptest::test_runner::Config::with_cases(n)
}

/// `$ATTN_TEST_CASES`, when set: the reduced case count (under compute-sanitizer).
fn reduced_cases() -> Option<usize> {
    std::env::var("ATTN_TEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
}

/// Whether table row `i` of `total` runs: every row, or with `$ATTN_TEST_CASES = n` set (under
/// compute-sanitizer) an evenly spread `n` of them (a stride prime to 3, so that rows cycling
/// through three chunk sizes keep all three).
pub fn table_row_runs(i: usize, total: usize) -> bool {
    match reduced_cases() {
        Some(n) if n > 0 && n < total => {
            let mut stride = total.div_ceil(n);
            if stride % 3 == 0 {
                stride += 1;
            }
            i % stride == 0
        }
        _ => true,
    }
}

pub use attn_testkit::Rng;

pub const FLOATS: [Dtype; 4] = [Dtype::F32, Dtype::F64, Dtype::BF16, Dtype::F16];

/// Rounds `a` to `dtype`, uploads it in that dtype, and returns the device tensor with the
/// exact (widened) values the device holds.
pub fn upload(gpu: &Gpu, a: &ArrayD<f64>, dtype: Dtype) -> (DeviceTensor, ArrayD<f64>) {
    match dtype {
        Dtype::F64 => (DeviceTensor::from_array(gpu, a.view()).unwrap(), a.clone()),
        Dtype::F32 => {
            let h = a.mapv(|v| v as f32);
            (
                DeviceTensor::from_array(gpu, h.view()).unwrap(),
                h.mapv(f64::from),
            )
        }
        Dtype::BF16 => {
            let h = a.mapv(bf16::from_f64);
            (
                DeviceTensor::from_array(gpu, h.view()).unwrap(),
                h.mapv(f64::from),
            )
        }
        Dtype::F16 => {
            let h = a.mapv(f16::from_f64);
            (
                DeviceTensor::from_array(gpu, h.view()).unwrap(),
                h.mapv(f64::from),
            )
        }
        _ => unreachable!("float dtypes only"),
    }
}

/// Downloads any float tensor widened to f64.
pub fn download(gpu: &Gpu, t: &DeviceTensor) -> ArrayD<f64> {
    match t.dtype() {
        Dtype::F64 => t.to_array::<f64>(gpu).unwrap(),
        Dtype::F32 => t.to_array::<f32>(gpu).unwrap().mapv(f64::from),
        Dtype::BF16 => t.to_array::<bf16>(gpu).unwrap().mapv(f64::from),
        Dtype::F16 => t.to_array::<f16>(gpu).unwrap().mapv(f64::from),
        d => panic!("not a float tensor: {d}"),
    }
}

/// A fresh output tensor with every element NaN.
pub fn poisoned(gpu: &Gpu, shape: &[usize], dtype: Dtype) -> DeviceTensor {
    let mut t = DeviceTensor::alloc(gpu, shape, dtype).unwrap();
    t.poison(gpu).unwrap();
    t
}

/// The spec's threshold for a candidate by the precision it was computed and stored in: a
/// half-precision output 5e-3, a float64 output (accumulated in fp64) 1e-10, a float32 output
/// `fp32` (the op's own fp32 threshold).
pub fn threshold(output: Dtype, fp32: f64) -> f64 {
    match output {
        Dtype::BF16 | Dtype::F16 => 5e-3,
        Dtype::F64 => 1e-10,
        _ => fp32,
    }
}

/// The spec's comparison: no NaN/Inf where `want` is finite (so every poisoned element must
/// have been written), the same NaN/±Inf where `want` is not finite, and
/// `(max_abs, RMS(want - got) / (RMS(want) + 1e-8))` over the finite elements of `want`
/// (`None` when it has none); non-finite ones must match exactly (NaN for NaN).
pub fn close_ratio(what: &str, got: &ArrayD<f64>, want: &ArrayD<f64>) -> Option<(f64, f64)> {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    let (mut d2, mut r2, mut max_abs, mut n) = (0.0f64, 0.0f64, 0.0f64, 0usize);
    for (i, (&g, &w)) in got.iter().zip(want.iter()).enumerate() {
        if w.is_finite() {
            assert!(g.is_finite(), "{what}: element {i} is {g}, expected {w}");
            d2 += (g - w) * (g - w);
            r2 += w * w;
            max_abs = max_abs.max((g - w).abs());
            n += 1;
        } else if w.is_nan() {
            assert!(g.is_nan(), "{what}: element {i} is {g}, expected NaN");
        } else {
            assert_eq!(g, w, "{what}: element {i}");
        }
    }
    (n > 0).then(|| {
        let ratio = (d2 / n as f64).sqrt() / ((r2 / n as f64).sqrt() + 1e-8);
        (max_abs, ratio)
    })
}

/// `max_abs <= 1e-6` or `RMS(want - got) / (RMS(want) + 1e-8) <= thr` over the finite elements.
pub fn assert_close(what: &str, got: &ArrayD<f64>, want: &ArrayD<f64>, thr: f64) {
    if let Some((max_abs, ratio)) = close_ratio(what, got, want) {
        assert!(
            max_abs <= 1e-6 || ratio <= thr,
            "{what}: max_abs {max_abs:e}, ratio {ratio:e} > {thr:e}"
        );
    }
}

/// Bitwise equality of two downloads (NaN payloads included).
pub fn assert_bit_identical(what: &str, a: &ArrayD<f64>, b: &ArrayD<f64>) {
    for (i, (x, y)) in a.iter().zip(b.iter()).enumerate() {
        assert_eq!(
            x.to_bits(),
            y.to_bits(),
            "{what}: element {i} differs: {x} vs {y}"
        );
    }
}

/// Random `cu_seqlens` over `t` tokens with `n` sequences, zero lengths allowed.
pub fn random_cu_seqlens(rng: &mut Rng, t: usize, n: usize) -> Vec<i64> {
    let mut cuts: Vec<i64> = (0..n.saturating_sub(1))
        .map(|_| rng.below(t + 1) as i64)
        .collect();
    cuts.sort_unstable();
    let mut cu = vec![0];
    cu.extend(cuts);
    cu.push(t as i64);
    cu
}
