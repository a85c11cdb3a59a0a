//! `nsa_compression_attention` (`conformance/spec/ops-nsa.md` §3): each query attends to the
//! compressed blocks it may see.

use super::attend::group_attention;
use super::PartialBlock;
use super::{check_block_size, check_features, check_groups, check_scale, AttnOut, CmpLayout};
use crate::error::{Error, Result};
use crate::scalar::Real;
use ndarray::ArrayView4;
use std::str::FromStr;

/// Which compressed blocks a query at position `t` sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Visibility {
    /// FLA: blocks that lie entirely in the past, `{c : (c+1)*BS - 1 <= t}`.
    #[default]
    Complete,
    /// MSLK causal: blocks that have started, `{c : c*BS <= t, c < TC_n}`.
    Started,
    /// MSLK non-causal: every block of the sequence.
    All,
}

impl Visibility {
    /// Number of visible blocks (always a prefix `0 .. n`) at position `t` of a sequence with
    /// `tc` compressed rows.
    pub fn visible(self, t: usize, bs: usize, tc: usize) -> usize {
        match self {
            Visibility::Complete => ((t + 1) / bs).min(tc),
            Visibility::Started => (t / bs + 1).min(tc),
            Visibility::All => tc,
        }
    }
}

impl FromStr for Visibility {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "complete" => Ok(Visibility::Complete),
            "started" => Ok(Visibility::Started),
            "all" => Ok(Visibility::All),
            _ => Err(Error::param(
                "visibility",
                "\"complete\", \"started\" or \"all\"",
                s,
            )),
        }
    }
}

/// `lse` of a row without a visible block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EmptyLse {
    /// FLA naive: `-inf`.
    #[default]
    NegInf,
    /// FLA Triton: `0`.
    Zero,
}

impl FromStr for EmptyLse {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "-inf" => Ok(EmptyLse::NegInf),
            "zero" => Ok(EmptyLse::Zero),
            _ => Err(Error::param("empty_lse", "\"-inf\" or \"zero\"", s)),
        }
    }
}

/// Validates the shapes of `q` `[B, T, HQ, K]`, `k_cmp` `[B, TC, H, K]`, `v_cmp`
/// `[B, TC, H, V]` against the compressed `layout` rule; returns `G`.
pub fn check_cmp_shapes(
    q: &[usize],
    k_cmp: &[usize],
    v_cmp: Option<&[usize]>,
    layout: &CmpLayout,
    rule: &str,
) -> Result<usize> {
    check_features("q", q)?;
    if k_cmp[0] != q[0] || k_cmp[3] != q[3] {
        return Err(Error::shape(
            "k_cmp",
            format!("[B, TC, H, K] with B = {}, K = {} of q", q[0], q[3]),
            k_cmp,
        ));
    }
    if let Some(v_cmp) = v_cmp {
        if v_cmp[..3] != k_cmp[..3] {
            return Err(Error::shape(
                "v_cmp",
                format!("[B, TC, H, V] with [B, TC, H] = {:?} of k_cmp", &k_cmp[..3]),
                v_cmp,
            ));
        }
        check_features("v_cmp", v_cmp)?;
    }
    let g = check_groups(q[2], k_cmp[2], "q", "k_cmp")?;
    layout.check_rows("k_cmp", q[0], k_cmp, rule)?;
    Ok(g)
}

/// `(o, lse) = nsa_compression_attention(q, k_cmp, v_cmp, ...)`.
///
/// For a query at position `t` of sequence `n` (head `hq`, KV head `h = hq / G`) and its visible
/// blocks `C(t)` ([`Visibility::visible`]): `z_c = scale * q[t, hq] · k_cmp[c, h]`,
/// `lse = logsumexp_c z_c`, `o = sum_c exp(z_c - lse) v_cmp[c, h]`. No visible block: `o = 0`,
/// `lse = -inf` (or `0` with [`EmptyLse::Zero`]). `TC` must match `partial_block`'s layout of
/// `T` (or `cu_seqlens`). Rows `(b, t, h)` run in parallel.
#[allow(clippy::too_many_arguments)]
pub fn nsa_compression_attention<T: Real>(
    q: ArrayView4<'_, T>,
    k_cmp: ArrayView4<'_, T>,
    v_cmp: ArrayView4<'_, T>,
    cu_seqlens: Option<&[i64]>,
    block_size: i64,
    scale: Option<f64>,
    visibility: Visibility,
    partial_block: PartialBlock,
    empty_lse: EmptyLse,
) -> Result<AttnOut<T>> {
    let bs = check_block_size(block_size)?;
    let (b, t, _, kd) = q.dim();
    let layout = CmpLayout::new(b, t, cu_seqlens, bs, partial_block)?;
    let rule = match partial_block {
        PartialBlock::MeanOfValid => "ceil(L / block_size) rows per sequence",
        PartialBlock::Drop => "floor(L / block_size) rows per sequence",
    };
    check_cmp_shapes(q.shape(), k_cmp.shape(), Some(v_cmp.shape()), &layout, rule)?;
    let scale = check_scale::<T>(scale, kd)?;
    let mut out = group_attention(q, k_cmp, v_cmp, scale, |bb, tt, _| {
        let n = layout.seq_of(bb, tt);
        let seq = &layout.seqs[n];
        let count = visibility.visible(tt - seq.bos, bs, layout.tc[n]);
        std::iter::once(layout.base[n]..layout.base[n] + count).collect()
    });
    if empty_lse == EmptyLse::Zero {
        out.lse
            .mapv_inplace(|l| if l == T::neg_infinity() { T::zero() } else { l });
    }
    Ok(out)
}
