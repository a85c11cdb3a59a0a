//! Helpers of the NSA tests: seeded inputs, and brute-force per-element oracles written from the
//! spec's formulas (scalar loops, no shared code with the reference).
#![allow(dead_code, clippy::too_many_arguments, clippy::needless_range_loop)]

use ndarray::{Array2, Array3, Array4, ArrayD, Ix4};

#[path = "../common/mod.rs"]
mod common;

#[allow(unused_imports)] // each test binary uses its own subset
pub use common::{check_close, narrow, widen, Rng};

/// A `[..4]` tensor with entries uniform in `[lo, hi)`.
pub fn u4(rng: &mut Rng, shape: [usize; 4], lo: f64, hi: f64) -> Array4<f64> {
    rng.array(&shape, lo, hi)
        .into_dimensionality::<Ix4>()
        .expect("rank 4")
}

/// A standard-normal `[..4]` tensor.
pub fn n4(rng: &mut Rng, shape: [usize; 4]) -> Array4<f64> {
    rng.randn(shape)
}

/// Sequences `(batch, bos, eos)` of a `[B, T]` batch or of `cu_seqlens`.
pub fn seqs(b: usize, t: usize, cu: Option<&[i64]>) -> Vec<(usize, usize, usize)> {
    match cu {
        None => (0..b).map(|n| (n, 0, t)).collect(),
        Some(cu) => cu
            .windows(2)
            .map(|w| (0, w[0] as usize, w[1] as usize))
            .collect(),
    }
}

/// `(batch, bos, eos)` of the sequence holding token `t` of batch row `b`.
pub fn seq_of(s: &[(usize, usize, usize)], b: usize, t: usize) -> (usize, usize, usize) {
    *s.iter()
        .find(|&&(bb, bos, eos)| bb == b && bos <= t && t < eos)
        .expect("token in a sequence")
}

/// Softmax attention of `q` over the keys listed (multiset) in `keys`, each `(k_row, v_row)`:
/// returns `(o, lse)`; no key gives `(0, -inf)`.
pub fn softmax_attend(
    q: &[f64],
    keys: &[(Vec<f64>, Vec<f64>)],
    scale: f64,
    vd: usize,
) -> (Vec<f64>, f64) {
    if keys.is_empty() {
        return (vec![0.0; vd], f64::NEG_INFINITY);
    }
    let z: Vec<f64> = keys
        .iter()
        .map(|(k, _)| scale * q.iter().zip(k).map(|(a, b)| a * b).sum::<f64>())
        .collect();
    let m = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = z.iter().map(|x| (x - m).exp()).sum();
    let lse = m + sum.ln();
    let mut o = vec![0.0; vd];
    for (zj, (_, v)) in z.iter().zip(keys) {
        let p = (zj - lse).exp();
        for (oi, vi) in o.iter_mut().zip(v) {
            *oi += p * vi;
        }
    }
    (o, lse)
}

/// Row `x[b, t, h, :]`.
pub fn row(x: &Array4<f64>, b: usize, t: usize, h: usize) -> Vec<f64> {
    (0..x.shape()[3]).map(|d| x[[b, t, h, d]]).collect()
}

/// Brute-force attention: query `(b, t, hq)` over the token rows `keys(b, t, hq)` of `k`, `v`
/// (head `hq / G`). Returns `o` `[B, T, HQ, V]` and `lse` `[B, T, HQ]`.
pub fn brute_attention(
    q: &Array4<f64>,
    k: &Array4<f64>,
    v: &Array4<f64>,
    scale: f64,
    keys: impl Fn(usize, usize, usize) -> Vec<usize>,
) -> (Array4<f64>, Array3<f64>) {
    let (b, t, hq, _) = q.dim();
    let (h, vd) = (k.shape()[2], v.shape()[3]);
    let g = hq / h;
    let mut o = Array4::zeros((b, t, hq, vd));
    let mut lse = Array3::zeros((b, t, hq));
    for bb in 0..b {
        for tt in 0..t {
            for hh in 0..hq {
                let kv: Vec<_> = keys(bb, tt, hh)
                    .into_iter()
                    .map(|j| (row(k, bb, j, hh / g), row(v, bb, j, hh / g)))
                    .collect();
                let (or, l) = softmax_attend(&row(q, bb, tt, hh), &kv, scale, vd);
                for (d, x) in or.into_iter().enumerate() {
                    o[[bb, tt, hh, d]] = x;
                }
                lse[[bb, tt, hh]] = l;
            }
        }
    }
    (o, lse)
}

/// Brute-force mean pooling (`conformance/spec/ops-nsa.md` §2) with `drop` or `mean_of_valid`,
/// optional projection.
pub fn brute_pool(
    x: &Array4<f64>,
    bs: usize,
    drop: bool,
    cu: Option<&[i64]>,
    w: Option<&Array3<f64>>,
) -> Array4<f64> {
    let (b, t, h, d) = x.dim();
    let rows_of = |l: usize| if drop { l / bs } else { l.div_ceil(bs) };
    let s = seqs(b, t, cu);
    let (ob, rows) = match cu {
        None => (b, rows_of(t)),
        Some(_) => (1, s.iter().map(|&(_, a, e)| rows_of(e - a)).sum()),
    };
    let e = w.map_or(d, |w| w.shape()[2]);
    let mut out = Array4::zeros((ob, rows, h, e));
    let mut base = 0;
    for &(bb, bos, eos) in &s {
        for c in 0..rows_of(eos - bos) {
            let start = bos + c * bs;
            let end = (start + bs).min(eos);
            for hh in 0..h {
                let mut pooled = vec![0.0; d];
                for tt in start..end {
                    for (dd, p) in pooled.iter_mut().enumerate() {
                        *p += x[[bb, tt, hh, dd]];
                    }
                }
                pooled.iter_mut().for_each(|p| *p /= (end - start) as f64);
                for ee in 0..e {
                    out[[bb, base + c, hh, ee]] = match w {
                        Some(w) => (0..d).map(|dd| pooled[dd] * w[[hh, dd, ee]]).sum(),
                        None => pooled[ee],
                    };
                }
            }
        }
        if cu.is_some() {
            base += rows_of(eos - bos);
        }
    }
    out
}

/// Brute-force FLA selection scores of one row (`conformance/spec/ops-nsa.md` §4.1 steps 1-4):
/// `score[c]` for the candidates `c <= IC`.
pub fn brute_fla_scores(
    q: &Array4<f64>,
    k_cmp: &Array4<f64>,
    b: usize,
    t: usize,
    p: usize,
    h: usize,
    base: usize,
    bs: usize,
    scale: f64,
) -> Vec<f64> {
    let g = q.shape()[2] / k_cmp.shape()[2];
    let (ic, nc) = (p / bs, (p + 1) / bs);
    let mut score = vec![0.0; ic + 1];
    for gg in 0..g {
        let qr = row(q, b, t, h * g + gg);
        let z: Vec<f64> = (0..nc)
            .map(|c| {
                scale
                    * qr.iter()
                        .zip(row(k_cmp, b, base + c, h))
                        .map(|(a, b)| a * b)
                        .sum::<f64>()
            })
            .collect();
        let m = z.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = z.iter().map(|x| (x - m).exp()).sum();
        for c in 0..nc {
            score[c] += (z[c] - m).exp() / sum / g as f64;
        }
    }
    for c in [0, ic.wrapping_sub(1), ic] {
        if c <= ic {
            score[c] = 1.0;
        }
    }
    score
}

/// The valid entries of a row, sorted (the row as a set).
pub fn as_set(row: &[i32]) -> Vec<i32> {
    let mut v: Vec<i32> = row.iter().copied().filter(|&x| x >= 0).collect();
    v.sort_unstable();
    v
}

/// Plain `[T, D]` rows of `x[b, .., h, ..]`.
pub fn head(x: &Array4<f64>, b: usize, h: usize) -> Array2<f64> {
    x.slice(ndarray::s![b, .., h, ..]).to_owned()
}

/// `ArrayD` view of a 4-D array for [`check_close`].
pub fn dynf(x: &Array4<f64>) -> ArrayD<f64> {
    x.clone().into_dyn()
}
