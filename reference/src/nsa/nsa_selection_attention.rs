//! `nsa_selection_attention` (`conformance/spec/ops-nsa.md` §5): each query attends to the tokens
//! of its selected blocks, with token-level causal masking.

use super::attend::group_attention;
use super::{check_block_size, check_features, check_groups, check_scale, AttnOut, BlockCounts};
use super::{CmpLayout, PartialBlock};
use crate::error::{Error, Result};
use crate::scalar::Real;
use ndarray::ArrayView4;
use std::ops::Range;

/// Validates `k` `[B, T, H, K]` and `v` `[B, T, H, V]` against `q` `[B, T, HQ, K]`; returns `G`.
pub fn check_kv(q: &[usize], k: &[usize], v: &[usize]) -> Result<usize> {
    check_features("q", q)?;
    if k[0] != q[0] || k[1] != q[1] || k[3] != q[3] {
        return Err(Error::shape(
            "k",
            format!(
                "[B, T, H, K] with B, T = {:?} and K = {} of q",
                &q[..2],
                q[3]
            ),
            k,
        ));
    }
    if v[..3] != k[..3] {
        return Err(Error::shape(
            "v",
            format!("[B, T, H, V] with [B, T, H] = {:?} of k", &k[..3]),
            v,
        ));
    }
    check_features("v", v)?;
    check_groups(q[2], k[2], "q", "k")
}

/// Key ranges of one row at position `p` of a sequence starting at `bos`: every valid slot among
/// the first `n_sel` of `slots` (`0 <= idx <= p / BS`, tested without computing `idx * BS`)
/// contributes tokens `idx*BS .. min(idx*BS + BS, p + 1)`, duplicates counted twice.
pub(crate) fn slot_ranges(
    slots: impl Iterator<Item = i64>,
    n_sel: usize,
    p: usize,
    bs: usize,
    bos: usize,
) -> Vec<Range<usize>> {
    let last = (p / bs) as u64;
    slots
        .take(n_sel)
        .filter(|&idx| idx >= 0 && (idx as u64) <= last)
        .map(|idx| {
            let start = idx as usize * bs;
            bos + start..bos + (start + bs).min(p + 1)
        })
        .collect()
}

/// `(o, lse) = nsa_selection_attention(q, k, v, block_indices, block_counts, ...)`.
///
/// For a row `(b, t, h)` with `n_sel` = `block_counts[b, t, h]` (tensor) or all `S` slots
/// (absent, or an integer `>= S`), the key multiset `J(t)` holds, for every valid slot
/// (`0 <= idx <= t / BS`), the tokens `idx*BS .. min(idx*BS + BS, t + 1)`; for each query head
/// `hq` of the group, `z_j = scale * q[t, hq] · k[j, h]`, `lse = logsumexp z`, `o = sum_j exp(z_j - lse) v[j, h]`.
/// Empty `J(t)`: `o = 0`, `lse = -inf`. Block indices are relative to their sequence. Rows run
/// in parallel.
///
/// Errors: shape mismatches of `k`, `v`, `block_indices` `[B, T, H, S]`, `block_counts`
/// `[B, T, H]` with entries in `0 ..= S`; an integer `block_counts < S`; bad `scale`,
/// `block_size`, `cu_seqlens`.
#[allow(clippy::too_many_arguments)]
pub fn nsa_selection_attention<T: Real>(
    q: ArrayView4<'_, T>,
    k: ArrayView4<'_, T>,
    v: ArrayView4<'_, T>,
    block_indices: ArrayView4<'_, i64>,
    block_counts: Option<BlockCounts<'_>>,
    cu_seqlens: Option<&[i64]>,
    block_size: i64,
    scale: Option<f64>,
) -> Result<AttnOut<T>> {
    let bs = check_block_size(block_size)?;
    check_kv(q.shape(), k.shape(), v.shape())?;
    let (b, t, _, kd) = q.dim();
    let h = k.shape()[2];
    let bi = block_indices.shape();
    if bi[..3] != [b, t, h] {
        return Err(Error::shape(
            "block_indices",
            format!("[B, T, H, S] with [B, T, H] = {:?}", [b, t, h]),
            bi,
        ));
    }
    let s = bi[3];
    match block_counts {
        Some(BlockCounts::Int(n)) if n < s as i64 => {
            return Err(Error::param(
                "block_counts",
                format!(
                    "an integer >= S = {s} (all slots; for fewer, give a [B, T, H] tensor \
                     or slice block_indices)"
                ),
                n,
            ))
        }
        Some(c) => c.check_tensor([b, t, h], Some(s as i64))?,
        None => {}
    }
    let layout = CmpLayout::new(b, t, cu_seqlens, bs, PartialBlock::MeanOfValid)?;
    let scale = check_scale::<T>(scale, kd)?;
    Ok(group_attention(q, k, v, scale, |bb, tt, hh| {
        let seq = &layout.seqs[layout.seq_of(bb, tt)];
        let n_sel = match block_counts {
            Some(BlockCounts::Tensor(c)) => c[[bb, tt, hh]] as usize,
            _ => s,
        };
        let slots = block_indices.slice(ndarray::s![bb, tt, hh, ..]);
        slot_ranges(slots.iter().copied(), n_sel, tt - seq.bos, bs, seq.bos)
    }))
}

/// Widens `int32` indices (the computed selection) for [`nsa_selection_attention`].
pub fn widen_indices(idx: ArrayView4<'_, i32>) -> ndarray::Array4<i64> {
    idx.mapv(i64::from)
}
