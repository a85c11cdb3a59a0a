//! The comparison rule of the spec, branch by branch, on hand-made edge cases and on random
//! perturbations of random tensors.

mod common;

use approx::{assert_abs_diff_eq, assert_relative_eq, relative_eq};
use attn_conformance::compare::{compare, measure, unravel, Rule};
use attn_conformance::Tensor;
use attn_reference::{Dtype, DtypeClass};
use half::bf16;
use ndarray::{ArrayD, IxDyn};
use proptest::prelude::*;

fn t64(v: &[f64]) -> Tensor {
    Tensor::F64(ArrayD::from_shape_vec(IxDyn(&[v.len()]), v.to_vec()).unwrap())
}

fn t32(v: &[f64]) -> Tensor {
    Tensor::from_f64(
        &ArrayD::from_shape_vec(IxDyn(&[v.len()]), v.to_vec()).unwrap(),
        Dtype::F32,
    )
}

fn check(r: &[f64], x: &[f64], t: f64) -> attn_conformance::Comparison {
    compare(
        Some(&t64(r)),
        Some(&t32(x)),
        DtypeClass::Float32,
        Rule::Threshold(t),
    )
}

#[test]
fn ratio_below_threshold_passes_and_above_fails() {
    let r = [1.0, -2.0, 3.0, 4.0];
    let close = [1.0 + 1e-6, -2.0, 3.0, 4.0 - 2e-6];
    let c = check(&r, &close, 1e-5);
    assert!(c.pass, "{c:?}");
    assert!(c.ratio > 0.0 && c.ratio < 1e-6);
    let far = [1.0 + 1e-3, -2.0, 3.0, 4.0];
    let c = check(&r, &far, 1e-5);
    assert!(!c.pass);
    assert!(c.reason.unwrap().contains("ratio"));
    assert_abs_diff_eq!(c.max_abs, 1e-3, epsilon = 1e-7);
}

#[test]
fn ratio_is_rms_of_difference_over_rms_of_reference() {
    let m = measure(&t64(&[3.0, 4.0]).widen_f64(), &t64(&[3.0, 5.0]).widen_f64());
    let want = (0.5f64).sqrt() / ((25.0f64 / 2.0).sqrt() + 1e-8);
    assert_relative_eq!(m.ratio, want, max_relative = 1e-14);
    assert_eq!(m.max_abs, 1.0);
}

#[test]
fn small_absolute_error_passes_whatever_the_ratio() {
    // the reference is tiny: the ratio is huge but max_abs <= 1e-6
    let c = check(&[1e-9, -1e-9], &[5e-7, -5e-7], 1e-5);
    assert!(c.ratio > 1.0);
    assert!(c.pass, "{c:?}");
    let c = check(&[1e-9, -1e-9], &[2e-6, -1e-9], 1e-5);
    assert!(!c.pass, "max_abs above 1e-6 and ratio above threshold");
}

#[test]
fn non_finite_values_must_match_in_kind() {
    let inf = f64::INFINITY;
    let nan = f64::NAN;
    assert!(
        check(&[1.0, nan], &[1.0, nan], 1e-5).pass,
        "NaN where the reference is NaN"
    );
    assert!(
        check(&[1.0, inf, -inf], &[1.0, inf, -inf], 1e-5).pass,
        "matching infinities"
    );
    for (r, x) in [
        ([1.0, 2.0], [1.0, nan]),
        ([1.0, 2.0], [1.0, inf]),
        ([1.0, inf], [1.0, -inf]),
        ([1.0, inf], [1.0, 2.0]),
        ([1.0, nan], [1.0, 2.0]),
        ([1.0, nan], [1.0, inf]),
    ] {
        let c = check(&r, &x, 1.0);
        assert!(!c.pass, "{r:?} vs {x:?}");
        assert!(c.reason.unwrap().contains("non-finite"), "{r:?} vs {x:?}");
    }
}

#[test]
fn shape_class_and_presence_mismatches_fail() {
    let r = t64(&[1.0, 2.0, 3.0]);
    let rule = Rule::Threshold(1e-5);
    let short = t32(&[1.0, 2.0]);
    let c = compare(Some(&r), Some(&short), DtypeClass::Float32, rule);
    assert!(!c.pass && c.reason.unwrap().contains("shape"));
    let reshaped =
        Tensor::F32(ArrayD::from_shape_vec(IxDyn(&[3, 1]), vec![1.0, 2.0, 3.0]).unwrap());
    assert!(!compare(Some(&r), Some(&reshaped), DtypeClass::Float32, rule).pass);
    let same = t32(&[1.0, 2.0, 3.0]);
    let c = compare(Some(&r), Some(&same), DtypeClass::Half, rule);
    assert_eq!(
        c.reason.as_deref(),
        Some("dtype float32, expected bfloat16 or float16 (or float64)")
    );
    assert!(!c.pass);
    assert!(compare(Some(&r), Some(&same), DtypeClass::Float32, rule).pass);
    // a float64 candidate stands for any float class (the oracle's own outputs), not for int
    let wide = t64(&[1.0, 2.0, 3.0]);
    assert!(compare(Some(&r), Some(&wide), DtypeClass::Half, rule).pass);
    assert!(!compare(Some(&r), Some(&wide), DtypeClass::Int, rule).pass);
    let c = compare(Some(&r), Some(&same), DtypeClass::Float64, rule);
    assert!(!c.pass, "float32 does not stand for float64");
    let c = compare(Some(&r), None, DtypeClass::Float32, rule);
    assert!(!c.pass && c.reason.unwrap().contains("missing"));
    let c = compare(None, Some(&same), DtypeClass::Float32, rule);
    assert!(!c.pass && c.reason.unwrap().contains("not produced"));
}

#[test]
fn exact_rule_compares_bits_and_dtype() {
    let v = [0.5, -1.25, 3.0];
    let a =
        Tensor::BF16(ArrayD::from_shape_vec(IxDyn(&[3]), v.map(bf16::from_f64).to_vec()).unwrap());
    assert!(compare(Some(&a), Some(&a.clone()), DtypeClass::Half, Rule::Exact).pass);
    let mut w = v.map(bf16::from_f64);
    w[1] = bf16::from_bits(w[1].to_bits() + 1); // one ulp
    let b = Tensor::BF16(ArrayD::from_shape_vec(IxDyn(&[3]), w.to_vec()).unwrap());
    let c = compare(Some(&a), Some(&b), DtypeClass::Half, Rule::Exact);
    assert!(!c.pass && c.reason.unwrap().contains("bit"));
    let f16 = Tensor::from_f64(&a.widen_f64(), Dtype::F16);
    let c = compare(Some(&a), Some(&f16), DtypeClass::Half, Rule::Exact);
    assert!(
        !c.pass && c.reason.unwrap().contains("exact"),
        "same values, other dtype"
    );
    // NaN payloads are bits too
    let n1 = Tensor::F32(ArrayD::from_elem(IxDyn(&[1]), f32::from_bits(0x7fc0_0001)));
    let n2 = Tensor::F32(ArrayD::from_elem(IxDyn(&[1]), f32::from_bits(0x7fc0_0002)));
    assert!(
        compare(
            Some(&n1),
            Some(&n1.clone()),
            DtypeClass::Float32,
            Rule::Exact
        )
        .pass
    );
    assert!(!compare(Some(&n1), Some(&n2), DtypeClass::Float32, Rule::Exact).pass);
}

#[test]
fn empty_tensors_pass() {
    let e = Tensor::F64(ArrayD::zeros(IxDyn(&[0, 4])));
    let c = compare(
        Some(&e),
        Some(&e.clone()),
        DtypeClass::Float64,
        Rule::Threshold(1e-10),
    );
    assert!(c.pass && c.max_abs == 0.0 && c.ratio == 0.0);
}

#[test]
fn default_thresholds_follow_the_spec_table() {
    assert_eq!(
        Rule::default_for(DtypeClass::Float64),
        Rule::Threshold(1e-10)
    );
    assert_eq!(
        Rule::default_for(DtypeClass::Float32),
        Rule::Threshold(1e-5)
    );
    assert_eq!(Rule::default_for(DtypeClass::Half), Rule::Threshold(5e-3));
    assert_eq!(Rule::default_for(DtypeClass::Int), Rule::Exact);
}

/// A planted error at a known position of a random 3-D tensor is reported at that position's
/// multi-dimensional index, with the reference and candidate values there; the count of
/// elements beyond `threshold × RMS(ref)` counts exactly the planted ones.
#[test]
fn diagnostics_locate_a_planted_error() {
    let mut rng = common::Rng::new(17);
    for trial in 0..8 {
        let shape = [
            1 + rng.below(4) as usize,
            1 + rng.below(6) as usize,
            2 + rng.below(5) as usize,
        ];
        let r = rng.array(&shape, 1.0).mapv(|v| v + 2.0);
        let n = r.len();
        let at = rng.below(n as u64) as usize;
        let index = unravel(at, &shape);
        let mut x = r.clone();
        x[index.as_slice()] += 0.5;
        // a second, smaller planted error (when there is room for one)
        let second = (at + 1 + rng.below(n as u64) as usize) % n;
        if second != at {
            x[unravel(second, &shape).as_slice()] -= 0.25;
        }
        let (rt, xt) = (Tensor::F64(r.clone()), Tensor::F64(x.clone()));
        let c = compare(
            Some(&rt),
            Some(&xt),
            DtypeClass::Float64,
            Rule::Threshold(1e-10),
        );
        assert!(!c.pass, "trial {trial}");
        let d = c.diagnostics.expect("a failed comparison has diagnostics");
        let w = d.worst.as_ref().expect("finite values compared");
        assert_eq!(w.index, index, "trial {trial}: shape {shape:?} flat {at}");
        assert_eq!(w.reference, r[index.as_slice()]);
        assert_eq!(w.candidate, x[index.as_slice()]);
        let planted = if second != at { 2 } else { 1 };
        assert_eq!(d.over_threshold, planted, "trial {trial}");
        assert_eq!(d.elements, n);
        assert!(d.nonfinite.is_none());
        let text = d.to_string();
        assert!(text.contains(&format!("{index:?}")), "{text}");
        assert!(
            text.contains(&format!(
                "{planted} of {n} elements: |ref - x| > threshold × RMS(ref)"
            )),
            "{text}"
        );
    }
}

/// Non-finite mismatches name the first one's multi-dimensional index and count them all.
#[test]
fn diagnostics_count_non_finite_mismatches_from_the_first() {
    let mut rng = common::Rng::new(23);
    let shape = [3, 4, 5];
    let r = rng.array(&shape, 1.0);
    let mut x = r.clone();
    x[[1, 2, 3]] = f64::NAN;
    x[[2, 0, 1]] = f64::INFINITY;
    x[[0, 3, 4]] = f64::NEG_INFINITY;
    let c = compare(
        Some(&Tensor::F64(r)),
        Some(&Tensor::F64(x)),
        DtypeClass::Float64,
        Rule::Threshold(1e-10),
    );
    assert!(!c.pass);
    let reason = c.reason.unwrap();
    assert!(
        reason.contains("[0, 3, 4]") && reason.contains("-inf"),
        "{reason}"
    );
    let n = c
        .diagnostics
        .unwrap()
        .nonfinite
        .expect("non-finite mismatches");
    assert_eq!(n.count, 3);
    assert_eq!(n.first_index, [0, 3, 4]);
    assert_eq!((n.reference, n.candidate), ("finite", "-inf"));
}

/// Under the exact rule the count is of elements whose bits differ, and the worst element is a
/// differing one even when the values are equal (a NaN payload).
#[test]
fn exact_diagnostics_count_differing_bits() {
    let v: Vec<f32> = (0..12).map(|i| i as f32 * 0.5 - 2.0).collect();
    let a = ArrayD::from_shape_vec(IxDyn(&[3, 4]), v).unwrap();
    let mut b = a.clone();
    b[[2, 1]] = f32::from_bits(b[[2, 1]].to_bits() + 1);
    b[[0, 3]] += 1.0;
    let c = compare(
        Some(&Tensor::F32(a.clone())),
        Some(&Tensor::F32(b.clone())),
        DtypeClass::Float32,
        Rule::Exact,
    );
    let d = c.diagnostics.unwrap();
    assert_eq!(d.over_threshold, 2);
    assert!(
        d.to_string().contains("2 of 12 elements: bits differ"),
        "{d}"
    );
    let w = d.worst.unwrap();
    assert_eq!(w.index, [0, 3]);
    assert_eq!((w.reference, w.candidate), (-0.5, 0.5));
    let n1 = Tensor::F32(ArrayD::from_elem(
        IxDyn(&[2, 2]),
        f32::from_bits(0x7fc0_0001),
    ));
    let mut p = ArrayD::from_elem(IxDyn(&[2, 2]), f32::from_bits(0x7fc0_0001));
    p[[1, 0]] = f32::from_bits(0x7fc0_0002);
    let c = compare(
        Some(&n1),
        Some(&Tensor::F32(p)),
        DtypeClass::Float32,
        Rule::Exact,
    );
    let d = c.diagnostics.unwrap();
    assert_eq!((d.over_threshold, d.worst.unwrap().index), (1, vec![1, 0]));
}

#[test]
fn a_passing_comparison_has_no_diagnostics() {
    let c = check(&[1.0, 2.0], &[1.0, 2.0], 1e-5);
    assert!(c.pass && c.diagnostics.is_none());
}

#[test]
fn unravel_is_row_major() {
    assert_eq!(unravel(0, &[2, 3, 4]), [0, 0, 0]);
    assert_eq!(unravel(23, &[2, 3, 4]), [1, 2, 3]);
    assert_eq!(unravel(13, &[2, 3, 4]), [1, 0, 1]);
    assert_eq!(unravel(0, &[]), Vec::<usize>::new());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// A relative perturbation `eps` of every element gives `ratio ≈ eps`, and the verdict
    /// follows the threshold on either side of it.
    #[test]
    fn ratio_tracks_a_relative_perturbation(seed in any::<u64>(), n in 1usize..200, exp in -7i32..-1) {
        let mut rng = common::Rng::new(seed);
        let r = rng.array(&[n], 10.0).mapv(|v| v + 20.0); // away from zero
        let eps = 10f64.powi(exp);
        let x = r.mapv(|v| v * (1.0 + eps));
        let m = measure(&r, &x);
        prop_assert!(relative_eq!(m.ratio, eps, max_relative = 1e-6), "ratio {} eps {}", m.ratio, eps);
        let rt = Tensor::F64(r);
        let xt = Tensor::F64(x);
        prop_assert!(compare(Some(&rt), Some(&xt), DtypeClass::Float64, Rule::Threshold(eps * 2.0)).pass);
        prop_assert!(!compare(Some(&rt), Some(&xt), DtypeClass::Float64, Rule::Threshold(eps / 2.0)).pass);
    }
}
