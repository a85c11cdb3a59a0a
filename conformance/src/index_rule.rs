//! The index rule of `conformance/spec/ops-nsa.md` §9 for `block_indices` outputs: rows are
//! compared one by one, never by the ratio rule.
//!
//! A row is every index of the leading axes (`(b, t, h)` in mode `"fla"`, `(b, i, hq)` in
//! `"mslk_tile_mean"`); its slots are the last axis.
//! 1. Shapes must be equal; integer widths may differ.
//! 2. [`IndexMode::Set`]: the valid entries (`>= 0`), sorted, must be equal, and so must the
//!    number of `-1` entries. [`IndexMode::Sorted`]: the rows must be equal element by element.
//! 3. Near-ties: with `s_cut` the lowest reference score among the reference's entries, a row
//!    that differs still passes when every block of the (multiset) symmetric difference has a
//!    finite reference score `s` with `|s - s_cut| <= delta * s_cut` (`Set`) or
//!    `<= delta * max(1, |s_cut|)` (`Sorted`). The count of such rows is reported.
//!
//! The reference scores (`-inf` for blocks that are not candidates) come with the reference's
//! outputs as `<output>.scores`, `[.., W]` over the same leading axes.

use crate::compare::{Comparison, IndexMode, IndexRule, Rule};
use crate::tensor::Tensor;

/// Why one row failed, or whether it passed exactly or by the band.
enum RowOutcome {
    Equal,
    Band,
    Fail(String),
}

/// Multiset difference `a - b` of two sorted lists.
fn minus(a: &[i64], b: &[i64]) -> Vec<i64> {
    let (mut out, mut j) = (Vec::new(), 0);
    for &x in a {
        while j < b.len() && b[j] < x {
            j += 1;
        }
        if j < b.len() && b[j] == x {
            j += 1;
        } else {
            out.push(x);
        }
    }
    out
}

fn compare_row(r: &[i64], x: &[i64], scores: &[f64], rule: IndexRule) -> RowOutcome {
    let (rv, xv) = match rule.mode {
        IndexMode::Set => {
            let valid = |row: &[i64]| {
                let mut v: Vec<i64> = row.iter().copied().filter(|&c| c >= 0).collect();
                v.sort_unstable();
                v
            };
            let pads = |row: &[i64]| row.iter().filter(|&&c| c == -1).count();
            let (rv, xv) = (valid(r), valid(x));
            if xv.len() + pads(x) != x.len() {
                return RowOutcome::Fail(format!("{x:?} holds entries below -1"));
            }
            if xv.windows(2).any(|w| w[0] == w[1]) {
                return RowOutcome::Fail(format!("{x:?} repeats a block"));
            }
            if pads(x) != pads(r) {
                return RowOutcome::Fail(format!("{x:?} vs reference {r:?}: -1 counts differ"));
            }
            (rv, xv)
        }
        IndexMode::Sorted => {
            if x.windows(2).any(|w| w[0] > w[1]) {
                return RowOutcome::Fail(format!("{x:?} is not sorted"));
            }
            (r.to_vec(), x.to_vec())
        }
    };
    if rv == xv {
        return RowOutcome::Equal;
    }
    let score = |c: i64| usize::try_from(c).ok().and_then(|c| scores.get(c)).copied();
    let cut = rv
        .iter()
        .filter_map(|&c| score(c))
        .fold(f64::INFINITY, f64::min);
    let band = match rule.mode {
        IndexMode::Set => rule.delta * cut,
        IndexMode::Sorted => rule.delta * cut.abs().max(1.0),
    };
    let (mut rs, mut xs) = (rv.clone(), xv.clone());
    rs.sort_unstable();
    xs.sort_unstable();
    let diff: Vec<i64> = minus(&rs, &xs).into_iter().chain(minus(&xs, &rs)).collect();
    let outside = diff.iter().find(|&&c| {
        !score(c).is_some_and(|s| s.is_finite() && cut.is_finite() && (s - cut).abs() <= band)
    });
    match outside {
        None => RowOutcome::Band,
        Some(c) => RowOutcome::Fail(format!(
            "{x:?} vs reference {r:?}: block {c} (score {}) is not within {:.0e} of the cut {cut:.6e}",
            score(*c).map_or("none".to_string(), |s| format!("{s:.6e}")),
            rule.delta
        )),
    }
}

/// Compares a candidate `block_indices` with the reference's under `rule`, the reference's
/// block scores `scores` giving the near-tie band.
pub fn compare_indices(
    reference: Option<&Tensor>,
    candidate: Option<&Tensor>,
    scores: Option<&Tensor>,
    rule: IndexRule,
) -> Comparison {
    let fail = |shape: &[usize], dtype, reason: String| Comparison {
        shape: shape.to_vec(),
        dtype,
        max_abs: f64::NAN,
        ratio: f64::NAN,
        rule: Rule::Index(rule),
        pass: false,
        reason: Some(reason),
        near_ties: None,
        diagnostics: None,
    };
    let (r, x) = match (reference, candidate) {
        (Some(r), Some(x)) => (r, x),
        (Some(r), None) => return fail(r.shape(), None, "missing from the candidate".into()),
        (None, Some(x)) => {
            let why = "not produced by the reference for this call".into();
            return fail(x.shape(), Some(x.dtype()), why);
        }
        (None, None) => return fail(&[], None, "missing on both sides".into()),
    };
    let dtype = Some(x.dtype());
    if r.shape() != x.shape() {
        let why = format!("shape {:?}, reference {:?}", x.shape(), r.shape());
        return fail(x.shape(), dtype, why);
    }
    let (Ok(rv), Ok(xv)) = (r.to_indices("reference"), x.to_indices("block_indices")) else {
        let why = format!("dtype {} is not an index dtype", x.dtype());
        return fail(x.shape(), dtype, why);
    };
    let lead = &r.shape()[..r.shape().len().saturating_sub(1)];
    let s = r.shape().last().copied().unwrap_or(0);
    let scores = match scores {
        Some(t) if t.shape().len() == r.shape().len() && &t.shape()[..lead.len()] == lead => {
            t.widen_f64()
        }
        _ => {
            return fail(
                x.shape(),
                dtype,
                "the reference gave no block scores".into(),
            )
        }
    };
    let w = scores.shape().last().copied().unwrap_or(0);
    let flat = scores.as_standard_layout();
    let sc = flat.as_slice().unwrap_or(&[]);
    let rows = lead.iter().product::<usize>();
    let (mut differ, mut band, mut first_fail, mut failed) = (0usize, 0usize, None, 0usize);
    for i in 0..rows {
        let (rr, xr) = (&rv[i * s..(i + 1) * s], &xv[i * s..(i + 1) * s]);
        match compare_row(rr, xr, &sc[i * w..(i + 1) * w], rule) {
            RowOutcome::Equal => {}
            RowOutcome::Band => {
                differ += 1;
                band += 1;
            }
            RowOutcome::Fail(why) => {
                differ += 1;
                failed += 1;
                first_fail.get_or_insert_with(|| format!("row {i} of {rows}: {why}"));
            }
        }
    }
    let reason = first_fail.map(|why| format!("{failed} rows differ beyond the band; {why}"));
    Comparison {
        shape: x.shape().to_vec(),
        dtype,
        max_abs: differ as f64,
        ratio: if rows == 0 {
            0.0
        } else {
            differ as f64 / rows as f64
        },
        rule: Rule::Index(rule),
        pass: reason.is_none(),
        reason,
        near_ties: Some(band),
        // the reason names the first failing row and counts them
        diagnostics: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{ArrayD, IxDyn};

    fn t(rows: &[&[i64]]) -> Tensor {
        let s = rows[0].len();
        let flat: Vec<i32> = rows
            .iter()
            .flat_map(|r| r.iter().map(|&x| x as i32))
            .collect();
        Tensor::I32(ArrayD::from_shape_vec(IxDyn(&[1, rows.len(), s]), flat).unwrap())
    }

    fn sc(rows: &[&[f64]]) -> Tensor {
        let w = rows[0].len();
        let flat: Vec<f64> = rows.iter().flat_map(|r| r.iter().copied()).collect();
        Tensor::F64(ArrayD::from_shape_vec(IxDyn(&[1, rows.len(), w]), flat).unwrap())
    }

    const SET: IndexRule = IndexRule {
        mode: IndexMode::Set,
        delta: 1e-4,
    };
    const SORTED: IndexRule = IndexRule {
        mode: IndexMode::Sorted,
        delta: 1e-4,
    };

    #[test]
    fn set_mode_ignores_order_and_counts_near_ties() {
        let scores = sc(&[
            &[1.0, 0.5, 0.30001, 0.3],
            &[1.0, 0.2, 0.1, f64::NEG_INFINITY],
        ]);
        let r = t(&[&[0, 1, 2], &[0, 1, -1]]);
        // same sets in another order
        let c = compare_indices(
            Some(&r),
            Some(&t(&[&[2, 0, 1], &[1, 0, -1]])),
            Some(&scores),
            SET,
        );
        assert!(
            c.pass && c.near_ties == Some(0) && c.max_abs == 0.0,
            "{c:?}"
        );
        // 2 <-> 3 lie within 1e-4 of the cut 0.30001: passes by the band
        let c = compare_indices(
            Some(&r),
            Some(&t(&[&[3, 0, 1], &[0, 1, -1]])),
            Some(&scores),
            SET,
        );
        assert!(c.pass && c.near_ties == Some(1), "{c:?}");
        // 1 <-> 2 does not
        let c = compare_indices(
            Some(&r),
            Some(&t(&[&[0, 1, 2], &[0, 2, -1]])),
            Some(&scores),
            SET,
        );
        assert!(!c.pass && c.near_ties == Some(0), "{c:?}");
        // a non-candidate never qualifies; a different -1 count fails
        let c = compare_indices(
            Some(&r),
            Some(&t(&[&[0, 1, 2], &[0, 3, -1]])),
            Some(&scores),
            SET,
        );
        assert!(!c.pass);
        let c = compare_indices(
            Some(&r),
            Some(&t(&[&[0, 1, 2], &[0, -1, -1]])),
            Some(&scores),
            SET,
        );
        assert!(!c.pass);
        // repeated or garbage entries fail
        let c = compare_indices(
            Some(&r),
            Some(&t(&[&[0, 0, 1], &[0, 1, -1]])),
            Some(&scores),
            SET,
        );
        assert!(!c.pass);
        let c = compare_indices(
            Some(&r),
            Some(&t(&[&[0, 1, 2], &[0, 1, -7]])),
            Some(&scores),
            SET,
        );
        assert!(!c.pass);
    }

    #[test]
    fn sorted_mode_compares_elements_and_widths_may_differ() {
        let scores = sc(&[&[2.0, -3.0, 5.0, 2.00005]]);
        let r = t(&[&[0, 0, 2]]);
        let same = Tensor::I64(ArrayD::from_shape_vec(IxDyn(&[1, 1, 3]), vec![0, 0, 2]).unwrap());
        assert!(compare_indices(Some(&r), Some(&same), Some(&scores), SORTED).pass);
        // order matters
        assert!(!compare_indices(Some(&r), Some(&t(&[&[0, 2, 0]])), Some(&scores), SORTED).pass);
        // 0 <-> 3 within 1e-4 * max(1, |2|)
        let c = compare_indices(Some(&r), Some(&t(&[&[0, 2, 3]])), Some(&scores), SORTED);
        assert!(c.pass && c.near_ties == Some(1), "{c:?}");
        assert!(!compare_indices(Some(&r), Some(&t(&[&[0, 1, 2]])), Some(&scores), SORTED).pass);
    }

    #[test]
    fn shape_dtype_and_missing_scores_fail() {
        let scores = sc(&[&[1.0, 0.5]]);
        let r = t(&[&[0, 1]]);
        assert!(!compare_indices(Some(&r), Some(&t(&[&[0, 1, -1]])), Some(&scores), SET).pass);
        let f = Tensor::F32(ArrayD::from_shape_vec(IxDyn(&[1, 1, 2]), vec![0.0, 1.0]).unwrap());
        assert!(!compare_indices(Some(&r), Some(&f), Some(&scores), SET).pass);
        assert!(!compare_indices(Some(&r), Some(&r), None, SET).pass);
        assert!(!compare_indices(Some(&r), None, Some(&scores), SET).pass);
    }
}
