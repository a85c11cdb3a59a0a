//! The comparison rule of the spec (`README.md`, "Comparison").
//!
//! For an expected tensor `ref` and a candidate `x` of the same shape:
//! `max_abs = max |ref - x|` and `ratio = RMS(ref - x) / (RMS(ref) + 1e-8)`, both over the
//! positions where `ref` is finite. The candidate passes when
//! - every non-finite value of `ref` is matched by the same kind in `x` (NaN by NaN, `+inf` by
//!   `+inf`, `-inf` by `-inf`) and `x` is finite wherever `ref` is, and
//! - `max_abs <= 1e-6` or `ratio <= threshold`.
//!
//! A missing tensor on either side, a shape mismatch or a dtype-class mismatch is a failure with
//! its reason, never a skip. A float64 candidate is accepted wherever a float class is expected:
//! it is the float64 oracle's own output (e.g. SDPA in float64 on bfloat16 inputs), held to the
//! float64 threshold. Ops whose spec says "exact" compare bit for bit (same dtype).

use crate::tensor::Tensor;
use attn_reference::{Dtype, DtypeClass};
use ndarray::ArrayD;
use std::fmt;

/// Absolute error below which a candidate passes whatever its ratio.
pub const ABS_FLOOR: f64 = 1e-6;
/// The `+ 1e-8` of the ratio's denominator.
pub const RMS_EPS: f64 = 1e-8;

/// How an output is compared.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rule {
    /// Pass when `max_abs <= 1e-6` or `ratio <= threshold`.
    Threshold(f64),
    /// Same dtype and the same bits everywhere (NaN payloads included).
    Exact,
    /// Selected block indices, row by row (spec `ops-nsa.md` §9; [`crate::index_rule`]).
    Index(IndexRule),
}

/// How the rows of a `block_indices` output are compared (spec `ops-nsa.md` §9).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexMode {
    /// `"fla"`: each row as a set of valid entries (`>= 0`) plus its count of `-1`.
    Set,
    /// `"mslk_tile_mean"`: sorted rows equal element by element, duplicates included.
    Sorted,
}

/// The index rule: the row comparison and the near-tie band `delta` (by candidate precision).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IndexRule {
    pub mode: IndexMode,
    pub delta: f64,
}

impl Rule {
    /// The spec's default threshold for a candidate computed in `class`
    /// (float64 `1e-10`, float32 `1e-5`, half `5e-3`; integers exact).
    pub fn default_for(class: DtypeClass) -> Rule {
        match class {
            DtypeClass::Float64 => Rule::Threshold(1e-10),
            DtypeClass::Float32 => Rule::Threshold(1e-5),
            DtypeClass::Half => Rule::Threshold(5e-3),
            DtypeClass::Int => Rule::Exact,
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rule::Threshold(t) => write!(f, "{t:.0e}"),
            Rule::Exact => f.write_str("exact"),
            Rule::Index(r) => write!(f, "index band {:.0e}", r.delta),
        }
    }
}

/// The outcome of comparing one output.
#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    /// The candidate's shape (the reference's when the candidate is missing).
    pub shape: Vec<usize>,
    /// The candidate's dtype (`None` when it is missing).
    pub dtype: Option<Dtype>,
    pub max_abs: f64,
    pub ratio: f64,
    pub rule: Rule,
    pub pass: bool,
    /// Why it failed (`None` when it passed).
    pub reason: Option<String>,
    /// Index rule only: the rows that differ from the reference but passed by the near-tie band.
    pub near_ties: Option<usize>,
}

/// `max_abs`, `ratio`, and the first non-finite mismatch, of `x` against `r` (same shape).
#[derive(Debug, Clone, PartialEq)]
pub struct Measure {
    pub max_abs: f64,
    pub ratio: f64,
    pub nonfinite: Option<String>,
}

fn kind(v: f64) -> &'static str {
    if v.is_nan() {
        "NaN"
    } else if v == f64::INFINITY {
        "+inf"
    } else if v == f64::NEG_INFINITY {
        "-inf"
    } else {
        "finite"
    }
}

/// Measures `x` against `r`; both must have the same shape (the caller checks it).
pub fn measure(r: &ArrayD<f64>, x: &ArrayD<f64>) -> Measure {
    let (mut max_abs, mut sq_diff, mut sq_ref, mut n) = (0.0f64, 0.0f64, 0.0f64, 0usize);
    let mut nonfinite = None;
    for (flat, (&a, &b)) in r.iter().zip(x.iter()).enumerate() {
        let same_kind = if a.is_finite() {
            b.is_finite()
        } else {
            kind(a) == kind(b)
        };
        if !same_kind {
            nonfinite.get_or_insert_with(|| {
                format!(
                    "element {flat}: reference {}, candidate {}",
                    kind(a),
                    kind(b)
                )
            });
            continue;
        }
        if a.is_finite() {
            let d = (a - b).abs();
            max_abs = max_abs.max(d);
            sq_diff += d * d;
            sq_ref += a * a;
            n += 1;
        }
    }
    let rms = |s: f64| if n == 0 { 0.0 } else { (s / n as f64).sqrt() };
    Measure {
        max_abs,
        ratio: rms(sq_diff) / (rms(sq_ref) + RMS_EPS),
        nonfinite,
    }
}

/// Whether a candidate of class `got` may stand for an output of class `expected`: the same
/// class, or float64 for any float class.
pub fn class_ok(expected: DtypeClass, got: DtypeClass) -> bool {
    got == expected || (got == DtypeClass::Float64 && expected != DtypeClass::Int)
}

/// Compares a `candidate` output with the `reference` one under `rule`; `expected` is the dtype
/// class the op's spec gives this output.
pub fn compare(
    reference: Option<&Tensor>,
    candidate: Option<&Tensor>,
    expected: DtypeClass,
    rule: Rule,
) -> Comparison {
    let fail = |shape: &[usize], dtype, reason: String| Comparison {
        shape: shape.to_vec(),
        dtype,
        max_abs: f64::NAN,
        ratio: f64::NAN,
        rule,
        pass: false,
        reason: Some(reason),
        near_ties: None,
    };
    let (r, x) = match (reference, candidate) {
        (Some(r), Some(x)) => (r, x),
        (Some(r), None) => return fail(r.shape(), None, "missing from the candidate".into()),
        (None, Some(x)) => {
            return fail(
                x.shape(),
                Some(x.dtype()),
                "not produced by the reference for this call".into(),
            )
        }
        (None, None) => return fail(&[], None, "missing on both sides".into()),
    };
    let dtype = Some(x.dtype());
    if r.shape() != x.shape() {
        return fail(
            x.shape(),
            dtype,
            format!("shape {:?}, reference {:?}", x.shape(), r.shape()),
        );
    }
    if !class_ok(expected, x.dtype().class()) {
        return fail(
            x.shape(),
            dtype,
            format!(
                "dtype {} is not of the expected class {expected:?}",
                x.dtype()
            ),
        );
    }
    let m = measure(&r.widen_f64(), &x.widen_f64());
    let reason = match rule {
        Rule::Exact if r.dtype() != x.dtype() => Some(format!(
            "dtype {}, exact comparison needs {}",
            x.dtype(),
            r.dtype()
        )),
        Rule::Exact if !r.bit_identical(x) => Some("not bit-identical to the reference".into()),
        Rule::Exact => None,
        Rule::Threshold(t) => match &m.nonfinite {
            Some(nf) => Some(format!("non-finite mismatch at {nf}")),
            None if m.max_abs <= ABS_FLOOR || m.ratio <= t => None,
            None => Some(format!("ratio {:.3e} > threshold {t:.0e}", m.ratio)),
        },
        Rule::Index(_) => Some("the index rule needs the reference scores".into()),
    };
    Comparison {
        shape: x.shape().to_vec(),
        dtype,
        max_abs: m.max_abs,
        ratio: m.ratio,
        rule,
        pass: reason.is_none(),
        reason,
        near_ties: None,
    }
}
