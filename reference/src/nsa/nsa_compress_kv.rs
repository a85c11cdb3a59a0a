//! `nsa_compress_kv` (`conformance/spec/ops-nsa.md` §2): non-overlapping mean pooling of `k` and
//! `v` along time, with an optional per-KV-head projection after pooling.

use super::{check_block_size, CmpLayout, PartialBlock};
use crate::error::{Error, Result};
use crate::scalar::Real;
use ndarray::{s, Array1, Array4, ArrayView3, ArrayView4, Axis, Zip};

/// Outputs of [`nsa_compress_kv`]: `k_cmp` `[B, TC, H, K]` (varlen `[1, sum TC_n, H, K]`) and,
/// when `v` was given, `v_cmp` likewise with `V` features.
#[derive(Debug, Clone)]
pub struct CompressOut<T> {
    pub k_cmp: Array4<T>,
    pub v_cmp: Option<Array4<T>>,
}

/// Checks that a projection weight is `[H, D, D]`.
fn check_weight<T>(w: Option<&ArrayView3<'_, T>>, arg: &str, h: usize, d: usize) -> Result<()> {
    match w {
        Some(w) if w.shape() != [h, d, d] => Err(Error::shape(
            arg,
            format!("[H, D, D] = [{h}, {d}, {d}]"),
            w.shape(),
        )),
        _ => Ok(()),
    }
}

/// Pools `x` `[B, T, H, D]` into the rows of `layout`, then projects by `w` when given.
///
/// For sequence `n`, block `c < TC_n`, head `h`: `n_c = min(BS, L - c*BS)`,
/// `pooled[c, h, :] = (1/n_c) sum_{t = c*BS}^{c*BS + n_c - 1} x[t, h, :]`, and with `w`
/// `out[c, h, e] = sum_d pooled[c, h, d] * w[h, d, e]`.
fn pool<T: Real>(
    x: ArrayView4<'_, T>,
    w: Option<ArrayView3<'_, T>>,
    layout: &CmpLayout,
) -> Array4<T> {
    let (b, _, h, d) = x.dim();
    let out_b = if layout.varlen { 1 } else { b };
    let mut out = Array4::<T>::zeros((out_b, layout.rows, h, d));
    // (sequence, block) of every output row, per batch row
    let mut owner = vec![None; out_b * layout.rows];
    for (n, seq) in layout.seqs.iter().enumerate() {
        for c in 0..layout.tc[n] {
            owner[seq.batch * layout.rows + layout.base[n] + c] = Some((n, c));
        }
    }
    let bs = layout.bs;
    Zip::indexed(out.lanes_mut(Axis(3))).par_for_each(|(bb, r, hh), mut row| {
        let Some((n, c)) = owner[bb * layout.rows + r] else {
            return;
        };
        let seq = &layout.seqs[n];
        let start = seq.bos + c * bs;
        let end = (start + bs).min(seq.eos);
        let block = x.slice(s![seq.batch, start..end, hh, ..]);
        let pooled: Array1<T> =
            block.sum_axis(Axis(0)) / T::from_usize(end - start).unwrap_or(T::one());
        match &w {
            Some(w) => row.assign(&w.index_axis(Axis(0), hh).t().dot(&pooled)),
            None => row.assign(&pooled),
        }
    });
    out
}

/// `(k_cmp, v_cmp) = nsa_compress_kv(k, v, w_k, w_v, cu_seqlens, block_size, partial_block)`.
///
/// `partial_block = MeanOfValid` (FLA `mean_pooling`) emits `ceil(L / BS)` rows per sequence,
/// the partial block divided by its real token count; `Drop` (MSLK `compress_kv`) emits
/// `floor(L / BS)`. With varlen, sequence `n` is written at rows `cmp_offsets[n] ..`. Blocks run
/// in parallel.
///
/// Errors: `v` not `[B, T, H, ·]` of `k`; `block_size` not a power of two; `w_k` not
/// `[H, K, K]`; `w_v` not `[H, V, V]` or given without `v`; bad `cu_seqlens` or `B != 1` with it.
pub fn nsa_compress_kv<T: Real>(
    k: ArrayView4<'_, T>,
    v: Option<ArrayView4<'_, T>>,
    w_k: Option<ArrayView3<'_, T>>,
    w_v: Option<ArrayView3<'_, T>>,
    cu_seqlens: Option<&[i64]>,
    block_size: i64,
    partial_block: PartialBlock,
) -> Result<CompressOut<T>> {
    let (b, t, h, kd) = k.dim();
    if let Some(v) = &v {
        if v.shape()[..3] != k.shape()[..3] {
            return Err(Error::shape(
                "v",
                format!("[B, T, H, V] with [B, T, H] = {:?} of k", &k.shape()[..3]),
                v.shape(),
            ));
        }
    }
    let bs = check_block_size(block_size)?;
    check_weight(w_k.as_ref(), "w_k", h, kd)?;
    if w_v.is_some() && v.is_none() {
        return Err(Error::missing(
            "w_v",
            "w_v only together with v",
            "w_v without v",
        ));
    }
    if let Some(v) = &v {
        check_weight(w_v.as_ref(), "w_v", h, v.shape()[3])?;
    }
    let layout = CmpLayout::new(b, t, cu_seqlens, bs, partial_block)?;
    Ok(CompressOut {
        k_cmp: pool(k, w_k, &layout),
        v_cmp: v.map(|v| pool(v, w_v, &layout)),
    })
}
