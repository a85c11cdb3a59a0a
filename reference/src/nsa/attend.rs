//! Softmax attention of one query group over a multiset of key ranges, shared by the compressed,
//! selected and window branches.

use super::AttnOut;
use crate::scalar::Real;
use ndarray::linalg::general_mat_mul;
use ndarray::{s, Array2, Array3, Array4, ArrayView2, ArrayView4, ArrayViewMut2};
use rayon::prelude::*;
use std::ops::Range;

/// For each of the `G` query rows `qg` `[G, K]`, attention over the key rows `j` of every range
/// in `ranges` (a multiset: a row in two ranges counts twice), of `k` `[rows, K]` and `v`
/// `[rows, V]`:
///
/// `z_j = scale * qg[g] · k[j]`, `lse[g] = m + ln sum_j exp(z_j - m)` with `m = max_j z_j`,
/// `o[g] = sum_j exp(z_j - lse[g]) * v[j]`.
///
/// Writes `o` `[G, V]` and `lse` `[G]`; with no key at all `o = 0` and `lse = -inf`.
pub(crate) fn attend<T: Real>(
    qg: ArrayView2<'_, T>,
    k: ArrayView2<'_, T>,
    v: ArrayView2<'_, T>,
    ranges: &[Range<usize>],
    scale: T,
    mut o: ArrayViewMut2<'_, T>,
    lse: &mut [T],
) {
    let n: usize = ranges.iter().map(|r| r.len()).sum();
    o.fill(T::zero());
    if n == 0 {
        lse.fill(T::neg_infinity());
        return;
    }
    let mut z = Array2::<T>::zeros((qg.nrows(), n));
    let mut off = 0;
    for r in ranges {
        let kr = k.slice(s![r.clone(), ..]);
        let mut zr = z.slice_mut(s![.., off..off + r.len()]);
        general_mat_mul(scale, &qg, &kr.t(), T::zero(), &mut zr);
        off += r.len();
    }
    for (mut row, l) in z.rows_mut().into_iter().zip(lse.iter_mut()) {
        let m = row.iter().copied().fold(T::neg_infinity(), T::max);
        row.mapv_inplace(|x| (x - m).exp());
        let sum = row.sum();
        row.mapv_inplace(|x| x / sum);
        *l = m + sum.ln();
    }
    let mut off = 0;
    for r in ranges {
        let p = z.slice(s![.., off..off + r.len()]);
        general_mat_mul(T::one(), &p, &v.slice(s![r.clone(), ..]), T::one(), &mut o);
        off += r.len();
    }
}

/// Runs [`attend`] for every row `(b, t, h)` in parallel: the query group `q[b, t, h*G ..
/// (h+1)*G, :]` over the key rows `ranges(b, t, h)` of `k[b, :, h, :]` and `v[b, :, h, :]`
/// (`q` `[B, T, HQ, K]`, `k` `[B, R, H, K]`, `v` `[B, R, H, V]`, `G = HQ / H`).
pub(crate) fn group_attention<T, F>(
    q: ArrayView4<'_, T>,
    k: ArrayView4<'_, T>,
    v: ArrayView4<'_, T>,
    scale: T,
    ranges: F,
) -> AttnOut<T>
where
    T: Real,
    F: Fn(usize, usize, usize) -> Vec<Range<usize>> + Sync,
{
    let (b, t, hq, _) = q.dim();
    let (h, vd) = (k.shape()[2], v.shape()[3]);
    let g = hq / h;
    let mut o = Array4::<T>::zeros((b, t, hq, vd));
    let mut lse = Array3::<T>::zeros((b, t, hq));
    let (Some(o_flat), Some(lse_flat)) = (o.as_slice_mut(), lse.as_slice_mut()) else {
        unreachable!("freshly allocated arrays are contiguous");
    };
    o_flat
        .par_chunks_mut((g * vd).max(1))
        .zip(lse_flat.par_chunks_mut(g.max(1)))
        .enumerate()
        .for_each(|(r, (o_g, lse_g))| {
            let (bb, tt, hh) = (r / (t * h), (r / h) % t, r % h);
            let qg = q.slice(s![bb, tt, hh * g..(hh + 1) * g, ..]);
            let kh = k.slice(s![bb, .., hh, ..]);
            let vh = v.slice(s![bb, .., hh, ..]);
            let o_view = ArrayViewMut2::from_shape((g, vd), o_g).expect("chunk of G*V");
            attend(qg, kh, vh, &ranges(bb, tt, hh), scale, o_view, lse_g);
        });
    AttnOut { o, lse }
}
