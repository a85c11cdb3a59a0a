//! `nsa_fwd` (`conformance/spec/ops-nsa.md` §7): the whole FLA forward — compressed, selected and
//! sliding-window branches, gated and summed — and the window branch on its own.

use super::attend::group_attention;
use super::nsa_selection_attention::{check_kv, widen_indices};
use super::{check_block_size, check_scale, nsa_compress_kv, nsa_compression_attention};
use super::{nsa_select_blocks, nsa_selection_attention, AttnOut, BlockCounts, CmpLayout};
use super::{EmptyLse, PartialBlock, SelectMode, Visibility};
use crate::error::{Error, Result};
use crate::scalar::Real;
use ndarray::{Array4, ArrayView3, ArrayView4, Axis, Zip};

/// Causal sliding-window attention: query `t` (head `hq`) attends to keys
/// `max(0, p - w + 1) <= j <= p` of its own sequence (`p` its position there), i.e. exactly `w`
/// keys once `p >= w - 1`: `z_j = scale * q[t, hq] · k[j, h]`, `o = softmax(z) · v`.
/// `window_size >= 1`; `w >= L` is full causal attention.
pub fn window_attention<T: Real>(
    q: ArrayView4<'_, T>,
    k: ArrayView4<'_, T>,
    v: ArrayView4<'_, T>,
    cu_seqlens: Option<&[i64]>,
    window_size: i64,
    scale: Option<f64>,
) -> Result<AttnOut<T>> {
    check_kv(q.shape(), k.shape(), v.shape())?;
    if window_size < 1 {
        return Err(Error::param("window_size", "an integer >= 1", window_size));
    }
    let w = window_size as u64;
    let (b, t, _, kd) = q.dim();
    let layout = CmpLayout::new(b, t, cu_seqlens, 1, PartialBlock::MeanOfValid)?;
    let scale = check_scale::<T>(scale, kd)?;
    Ok(group_attention(q, k, v, scale, |bb, tt, _| {
        let bos = layout.seqs[layout.seq_of(bb, tt)].bos;
        let keys = ((tt - bos) as u64 + 1).min(w) as usize;
        std::iter::once(tt + 1 - keys..tt + 1).collect()
    }))
}

/// The optional gates of [`nsa_fwd`], each `[B, T, HQ]`.
#[derive(Debug, Clone, Copy, Default)]
pub struct FwdGates<'a, T> {
    pub g_cmp: Option<ArrayView3<'a, T>>,
    pub g_slc: Option<ArrayView3<'a, T>>,
    pub g_swa: Option<ArrayView3<'a, T>>,
}

/// Outputs of [`nsa_fwd`].
#[derive(Debug, Clone)]
pub struct FwdOut<T> {
    /// `[B, T, HQ, V]`.
    pub o: Array4<T>,
    /// `[B, T, H, S]`, only when the selection was computed.
    pub block_indices: Option<Array4<i32>>,
    /// The selection's block scores ([`super::SelectOut::scores`]), with `block_indices`.
    pub scores: Option<Array4<T>>,
}

/// `o = nsa_fwd(q, k, v, g_cmp, g_slc, g_swa, block_indices, block_counts, ...)`.
///
/// 1. `k_cmp, v_cmp = nsa_compress_kv(k, v, "mean_of_valid")`.
/// 2. With `g_cmp`: `o_cmp` = compressed branch (`"complete"`), and without `block_indices`
///    the selection `nsa_select_blocks(mode "fla", block_counts)` (default 16), returned.
/// 3. `o_slc = nsa_selection_attention(block_indices, block_counts)` (a tensor count that made
///    the selection sets the per-token quotas).
/// 4. With `w = window_size > 0`: `o_swa` = [`window_attention`] with the default scale
///    `K ** -0.5`, whatever `scale` is: FLA 0.6.0 calls `flash_attn_func` without
///    `softmax_scale` (a disagreement with the spec, which writes `scale`; FLA is followed).
/// 5. `o = g_slc*o_slc (or o_slc) + g_cmp*o_cmp + g_swa*o_swa` in `T`.
///
/// Errors: every stage's; neither `g_cmp` nor `block_indices`; `window_size < 0`;
/// `window_size > 0` without `g_swa`; a gate not `[B, T, HQ]`; both forms of `block_counts`.
#[allow(clippy::too_many_arguments)]
pub fn nsa_fwd<T: Real>(
    q: ArrayView4<'_, T>,
    k: ArrayView4<'_, T>,
    v: ArrayView4<'_, T>,
    gates: FwdGates<'_, T>,
    block_indices: Option<ArrayView4<'_, i64>>,
    block_counts: Option<BlockCounts<'_>>,
    cu_seqlens: Option<&[i64]>,
    block_size: i64,
    window_size: i64,
    scale: Option<f64>,
) -> Result<FwdOut<T>> {
    check_kv(q.shape(), k.shape(), v.shape())?;
    let bs = check_block_size(block_size)? as i64;
    let (b, t, hq, kd) = q.dim();
    check_scale::<T>(scale, kd)?;
    if window_size < 0 {
        return Err(Error::param("window_size", "an integer >= 0", window_size));
    }
    for (name, g) in [
        ("g_cmp", gates.g_cmp),
        ("g_slc", gates.g_slc),
        ("g_swa", gates.g_swa),
    ] {
        if let Some(g) = g {
            if g.shape() != [b, t, hq] {
                return Err(Error::shape(
                    name,
                    format!("[B, T, HQ] = {:?}", [b, t, hq]),
                    g.shape(),
                ));
            }
        }
    }
    if gates.g_cmp.is_none() && block_indices.is_none() {
        return Err(Error::missing(
            "block_indices",
            "block_indices when g_cmp is absent (no selection can be computed)",
            "neither g_cmp nor block_indices",
        ));
    }
    if window_size > 0 && gates.g_swa.is_none() {
        return Err(Error::missing(
            "g_swa",
            "g_swa with window_size > 0",
            "absent",
        ));
    }
    let cmp = nsa_compress_kv(
        k,
        Some(v),
        None,
        None,
        cu_seqlens,
        bs,
        PartialBlock::MeanOfValid,
    )?;
    let v_cmp = cmp.v_cmp.expect("v was given");
    let mut o_cmp = None;
    let mut computed = None;
    if let Some(g_cmp) = gates.g_cmp {
        let r = nsa_compression_attention(
            q,
            cmp.k_cmp.view(),
            v_cmp.view(),
            cu_seqlens,
            bs,
            scale,
            Visibility::Complete,
            PartialBlock::MeanOfValid,
            EmptyLse::NegInf,
        )?;
        o_cmp = Some((g_cmp, r.o));
        if block_indices.is_none() {
            let sel = nsa_select_blocks(
                q,
                cmp.k_cmp.view(),
                block_counts,
                cu_seqlens,
                bs,
                scale,
                SelectMode::Fla,
                super::nsa_select_blocks::DEFAULT_Q_TILE_SIZE,
                true,
            )?;
            computed = Some((sel.block_indices, sel.scores));
        }
    }
    let (idx, counts) = match (&computed, block_indices) {
        (Some((c, _)), _) => {
            // the integer count made exactly S slots: use them all
            let counts = match block_counts {
                Some(BlockCounts::Tensor(x)) => Some(BlockCounts::Tensor(x)),
                _ => None,
            };
            (widen_indices(c.view()), counts)
        }
        (None, Some(given)) => (given.to_owned(), block_counts),
        (None, None) => unreachable!("checked above"),
    };
    let o_slc = nsa_selection_attention(q, k, v, idx.view(), counts, cu_seqlens, bs, scale)?.o;
    let o_swa = match gates.g_swa {
        Some(g) if window_size > 0 => Some((
            g,
            window_attention(q, k, v, cu_seqlens, window_size, None)?.o,
        )),
        _ => None,
    };
    let mut o = o_slc;
    if let Some(g) = gates.g_slc {
        scale_rows(&mut o, g);
    }
    for (g, mut x) in [o_cmp, o_swa].into_iter().flatten() {
        scale_rows(&mut x, g);
        o += &x;
    }
    let (block_indices, scores) = computed.unzip();
    Ok(FwdOut {
        o,
        block_indices,
        scores,
    })
}

/// `x[b, t, hq, :] *= g[b, t, hq]`.
fn scale_rows<T: Real>(x: &mut Array4<T>, g: ArrayView3<'_, T>) {
    Zip::from(x.lanes_mut(Axis(3)))
        .and(&g)
        .par_for_each(|mut row, &gv| row.mapv_inplace(|e| e * gv));
}
