//! The comparison rule of the spec (`conformance/spec/README.md`, "Comparison").
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
use serde::Serialize;
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
    /// Selected block indices, row by row (`conformance/spec/ops-nsa.md` §9;
    /// [`crate::index_rule`]).
    Index(IndexRule),
}

/// How the rows of a `block_indices` output are compared (`conformance/spec/ops-nsa.md` §9).
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
    /// Where and by how much it failed, for a failure of two same-shape tensors (`None` when it
    /// passed, or when a shape, class or presence mismatch left nothing to compare).
    pub diagnostics: Option<Diagnostics>,
    /// Index rule only: the rows that differ from the reference but passed by the near-tie band.
    pub near_ties: Option<usize>,
}

/// The element with the largest `|ref - x|` of a failed comparison.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Worst {
    /// Its multi-dimensional index.
    pub index: Vec<usize>,
    pub reference: f64,
    pub candidate: f64,
}

/// The non-finite mismatches of a failed comparison: positions where the candidate is not the
/// same kind of value as the reference (finite, NaN, `+inf`, `-inf`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NonFinite {
    pub count: usize,
    /// The first one in row-major order, and the kinds of the two values there.
    pub first_index: Vec<usize>,
    pub reference: &'static str,
    pub candidate: &'static str,
}

/// What a failed comparison of two same-shape tensors tells beyond `max_abs` and `ratio`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Diagnostics {
    /// `None` when no position has a finite value on both sides.
    pub worst: Option<Worst>,
    /// How many elements have `|ref - x| > threshold × RMS(ref)`: each of them alone misses by
    /// more than the ratio allows the RMS of all the errors. Under the exact rule: how many
    /// elements differ in their bits.
    pub over_threshold: usize,
    /// What `over_threshold` counts, in words: `|ref - x| > threshold × RMS(ref)`, or
    /// `bits differ` under the exact rule.
    pub counted: &'static str,
    /// The number of elements.
    pub elements: usize,
    pub nonfinite: Option<NonFinite>,
}

impl fmt::Display for Diagnostics {
    /// `worst [0, 3, 1]: reference 1.25, candidate 1.5; 3 of 24 elements: |ref - x| >
    /// threshold × RMS(ref); non-finite mismatches: 2, first at [1, 0, 0] (reference finite,
    /// candidate NaN)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(w) = &self.worst {
            parts.push(format!(
                "worst {:?}: reference {}, candidate {}",
                w.index, w.reference, w.candidate
            ));
        }
        parts.push(format!(
            "{} of {} elements: {}",
            self.over_threshold, self.elements, self.counted
        ));
        if let Some(n) = &self.nonfinite {
            parts.push(format!(
                "non-finite mismatches: {}, first at {:?} (reference {}, candidate {})",
                n.count, n.first_index, n.reference, n.candidate
            ));
        }
        f.write_str(&parts.join("; "))
    }
}

/// `max_abs`, `ratio` and where the errors are, of `x` against `r` (same shape).
#[derive(Debug, Clone, PartialEq)]
pub struct Measure {
    pub max_abs: f64,
    pub ratio: f64,
    /// `RMS(ref)` over the positions where both sides are finite.
    pub rms_ref: f64,
    /// The row-major (flat) index of the largest `|ref - x|` (the first on ties); `None` when
    /// no position has a finite value on both sides.
    pub worst: Option<usize>,
    /// The flat index of the first non-finite mismatch, and how many there are.
    pub nonfinite_first: Option<usize>,
    pub nonfinite_count: usize,
}

/// The kind of a value: `"finite"`, `"NaN"`, `"+inf"` or `"-inf"`.
pub fn kind(v: f64) -> &'static str {
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

/// The multi-dimensional index of the row-major position `flat` in `shape`.
pub fn unravel(flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut index = vec![0; shape.len()];
    let mut rest = flat;
    for (i, &d) in shape.iter().enumerate().rev() {
        if d > 0 {
            index[i] = rest % d;
            rest /= d;
        }
    }
    index
}

/// Measures `x` against `r`; both must have the same shape (the caller checks it).
pub fn measure(r: &ArrayD<f64>, x: &ArrayD<f64>) -> Measure {
    let (mut max_abs, mut sq_diff, mut sq_ref, mut n) = (0.0f64, 0.0f64, 0.0f64, 0usize);
    let (mut worst, mut nonfinite_first, mut nonfinite_count) = (None, None, 0);
    for (flat, (&a, &b)) in r.iter().zip(x.iter()).enumerate() {
        if kind(a) != kind(b) {
            nonfinite_first.get_or_insert(flat);
            nonfinite_count += 1;
            continue;
        }
        if a.is_finite() {
            let d = (a - b).abs();
            if worst.is_none() || d > max_abs {
                worst = Some(flat);
            }
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
        rms_ref: rms(sq_ref),
        worst,
        nonfinite_first,
        nonfinite_count,
    }
}

/// The diagnostics of a failed comparison of `r` and `x` (same shape) under `rule`, from their
/// [`measure`] `m`.
pub fn diagnose(r: &Tensor, x: &Tensor, m: &Measure, rule: Rule) -> Diagnostics {
    let (rw, xw) = (r.widen_f64(), x.widen_f64());
    let shape = r.shape();
    let differs: Vec<bool> = match rule {
        Rule::Threshold(t) => {
            let limit = t * m.rms_ref;
            (rw.iter().zip(xw.iter()))
                .map(|(&a, &b)| a.is_finite() && b.is_finite() && (a - b).abs() > limit)
                .collect()
        }
        Rule::Exact | Rule::Index(_) => {
            let size = r.dtype().size_bytes();
            if r.dtype() == x.dtype() && size > 0 {
                let (rb, xb) = (r.to_le_bytes(), x.to_le_bytes());
                rb.chunks(size)
                    .zip(xb.chunks(size))
                    .map(|(a, b)| a != b)
                    .collect()
            } else {
                (rw.iter().zip(xw.iter()))
                    .map(|(&a, &b)| a != b && !(a.is_nan() && b.is_nan()))
                    .collect()
            }
        }
    };
    // under the exact rule equal values may still differ in bits (-0 and 0, NaN payloads)
    let worst_flat = if rule == Rule::Exact && m.max_abs == 0.0 {
        differs.iter().position(|&d| d).or(m.worst)
    } else {
        m.worst
    };
    let flat: Vec<(f64, f64)> = rw.iter().copied().zip(xw.iter().copied()).collect();
    Diagnostics {
        worst: worst_flat.map(|i| Worst {
            index: unravel(i, shape),
            reference: flat[i].0,
            candidate: flat[i].1,
        }),
        over_threshold: differs.iter().filter(|&&d| d).count(),
        counted: match rule {
            Rule::Threshold(_) => "|ref - x| > threshold × RMS(ref)",
            Rule::Exact | Rule::Index(_) => "bits differ",
        },
        elements: flat.len(),
        nonfinite: m.nonfinite_first.map(|i| NonFinite {
            count: m.nonfinite_count,
            first_index: unravel(i, shape),
            reference: kind(flat[i].0),
            candidate: kind(flat[i].1),
        }),
    }
}

/// Whether a candidate of class `got` may stand for an output of class `expected`: the same
/// class, or float64 for any float class.
pub fn class_ok(expected: DtypeClass, got: DtypeClass) -> bool {
    got == expected || (got == DtypeClass::Float64 && expected != DtypeClass::Int)
}

/// The dtypes of a class, as a message names them (`float32`, `bfloat16 or float16`).
pub fn class_words(c: DtypeClass) -> &'static str {
    match c {
        DtypeClass::Float64 => "float64",
        DtypeClass::Float32 => "float32 (or float64)",
        DtypeClass::Half => "bfloat16 or float16 (or float64)",
        DtypeClass::Int => "int32 or int64",
    }
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
        diagnostics: None,
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
            format!("dtype {}, expected {}", x.dtype(), class_words(expected)),
        );
    }
    let m = measure(&r.widen_f64(), &x.widen_f64());
    let pass = match rule {
        Rule::Exact => r.bit_identical(x),
        Rule::Threshold(t) => m.nonfinite_count == 0 && (m.max_abs <= ABS_FLOOR || m.ratio <= t),
        // `compare_indices` is the index rule's comparison; here it cannot pass
        Rule::Index(_) => false,
    };
    if pass {
        return Comparison {
            shape: x.shape().to_vec(),
            dtype,
            max_abs: m.max_abs,
            ratio: m.ratio,
            rule,
            pass,
            reason: None,
            near_ties: None,
            diagnostics: None,
        };
    }
    let d = diagnose(r, x, &m, rule);
    let reason = match (rule, &d.nonfinite) {
        (Rule::Exact, _) if r.dtype() != x.dtype() => {
            format!("dtype {}, exact comparison needs {}", x.dtype(), r.dtype())
        }
        (Rule::Exact, _) => "not bit-identical to the reference".into(),
        (Rule::Threshold(_), Some(n)) => format!(
            "non-finite mismatch at {:?}: reference {}, candidate {}",
            n.first_index, n.reference, n.candidate
        ),
        (Rule::Threshold(t), None) => format!("ratio {:.3e} > threshold {t:.0e}", m.ratio),
        (Rule::Index(_), _) => "the index rule needs the reference scores".into(),
    };
    Comparison {
        shape: x.shape().to_vec(),
        dtype,
        max_abs: m.max_abs,
        ratio: m.ratio,
        rule,
        pass,
        reason: Some(reason),
        diagnostics: Some(d),
        near_ties: None,
    }
}
