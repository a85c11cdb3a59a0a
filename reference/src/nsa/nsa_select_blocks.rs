//! `nsa_select_blocks` (`conformance/spec/ops-nsa.md` §4): block importance scores and top-k, in
//! FLA's mode (one row per token and KV head) or MSLK's tile-mean mode (one row per query tile and
//! query head).

use super::nsa_compression_attention::check_cmp_shapes;
use super::{check_block_size, check_scale, BlockCounts, CmpLayout, PartialBlock};
use crate::error::{Error, Result};
use crate::scalar::Real;
use ndarray::{s, Array1, Array4, ArrayView2, ArrayView4, Axis};
use rayon::prelude::*;
use std::cmp::Ordering;
use std::str::FromStr;

/// The scoring mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SelectMode {
    /// FLA `parallel_nsa_topk` / `naive_nsa_topk` (§4.1).
    #[default]
    Fla,
    /// MSLK `fused_score_and_select_blocks` (§4.2).
    MslkTileMean,
}

impl SelectMode {
    /// The compressed blocks a mode scores: FLA every block with a valid token
    /// (`ceil(L / block_size)`, a partial last block as the mean of its valid tokens), MSLK only
    /// complete ones (`floor(L / block_size)`); with the rule's wording for shape errors.
    pub fn blocks(self) -> (PartialBlock, &'static str) {
        match self {
            SelectMode::Fla => (PartialBlock::MeanOfValid, "mode fla: ceil(L / block_size)"),
            SelectMode::MslkTileMean => (
                PartialBlock::Drop,
                "mode mslk_tile_mean: floor(L / block_size)",
            ),
        }
    }
}

impl FromStr for SelectMode {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "fla" => Ok(SelectMode::Fla),
            "mslk_tile_mean" => Ok(SelectMode::MslkTileMean),
            _ => Err(Error::param("mode", "\"fla\" or \"mslk_tile_mean\"", s)),
        }
    }
}

/// The default integer `block_counts` (`conformance/spec/ops-nsa.md` §4).
pub const DEFAULT_BLOCK_COUNTS: i64 = 16;
/// The default `q_tile_size` of `"mslk_tile_mean"`.
pub const DEFAULT_Q_TILE_SIZE: i64 = 256;
/// The most slots `S` a `"fla"` row may have: `block_counts` sets the output's last extent, so a
/// huge count is refused (naming `block_counts`) instead of exhausting memory.
pub const MAX_SLOTS: i64 = 1 << 16;

/// Outputs of [`nsa_select_blocks`].
#[derive(Debug, Clone)]
pub struct SelectOut<T> {
    /// `"fla"`: `[B, T, H, S]`, valid entries first (ranked), then `-1`. `"mslk_tile_mean"`:
    /// `[B, NQ, HQ, S_m]` (varlen `[1, sum NQ_n, HQ, S_m]`), each row sorted ascending.
    pub block_indices: Array4<i32>,
    /// The score of every block of each row, `[.., .., .., W]` with `W` the largest `TC_n`:
    /// `"fla"`: the importance (1 for forced blocks), `-inf` for non-candidates;
    /// `"mslk_tile_mean"`: the scaled tile-mean logit, `-inf` where the block is not allowed.
    /// The index comparison rule's near-tie band reads it (`conformance/spec/ops-nsa.md` §9).
    pub scores: Array4<T>,
}

/// Descending by score, ties by block index ascending.
fn rank<T: Real>(a: &(T, usize), b: &(T, usize)) -> Ordering {
    b.0.partial_cmp(&a.0)
        .unwrap_or(Ordering::Equal)
        .then(a.1.cmp(&b.1))
}

/// One FLA-mode row (position `p` of its sequence): returns the `S` slots and the `W` scores.
///
/// `score[c] = (1/G) sum_g softmax_{c < NC}(scale * q_g · k_cmp[c])` for the complete blocks
/// `c < NC = floor((p+1)/BS)`; the forced blocks `{0, IC-1, IC}` (`IC = floor(p/BS)`) score 1;
/// the candidates `0 ..= IC` are ranked by score and the first `min(n_sel, IC+1)` kept.
#[allow(clippy::too_many_arguments)]
fn fla_row<T: Real>(
    qg: ArrayView2<'_, T>,
    kc: ArrayView2<'_, T>,
    p: usize,
    bs: usize,
    scale: T,
    n_sel: usize,
    s_out: usize,
    w: usize,
) -> (Vec<i32>, Vec<T>) {
    let (ic, nc) = (p / bs, (p + 1) / bs);
    let mut score = vec![T::neg_infinity(); w];
    if nc > 0 {
        let mut z = qg.dot(&kc.slice(s![..nc, ..]).t()) * scale;
        for mut row in z.rows_mut() {
            let m = row.iter().copied().fold(T::neg_infinity(), T::max);
            row.mapv_inplace(|x| (x - m).exp());
            let sum = row.sum();
            row.mapv_inplace(|x| x / sum);
        }
        let mean: Array1<T> = z.mean_axis(Axis(0)).expect("G >= 1");
        score[..nc].copy_from_slice(mean.as_slice().expect("contiguous"));
    }
    for c in [Some(0), ic.checked_sub(1), Some(ic)].into_iter().flatten() {
        score[c] = T::one();
    }
    let mut cand: Vec<(T, usize)> = (0..=ic).map(|c| (score[c], c)).collect();
    cand.sort_by(rank);
    let m = n_sel.min(ic + 1).min(s_out);
    let mut row: Vec<i32> = cand[..m].iter().map(|&(_, c)| c as i32).collect();
    row.resize(s_out, -1);
    (row, score)
}

/// One tile-mean row: tile `i` of a sequence with `tc` blocks, `s_m` slots, `W` scores.
///
/// `s_j = scale * qbar · k_cmp[j]` with `qbar` the tile mean of `q`; blocks with
/// `j*BS >= (i+1)*qt` are `-inf` when causal; phantom `-inf` entries pad up to `s_m`; the top `s_m`
/// (ties by index) are taken, `-inf` entries become block 0, and the row is sorted.
#[allow(clippy::too_many_arguments)]
fn tile_row<T: Real>(
    qbar: Array1<T>,
    kc: ArrayView2<'_, T>,
    i: usize,
    qt: usize,
    bs: usize,
    causal: bool,
    scale: T,
    s_m: usize,
    w: usize,
) -> (Vec<i32>, Vec<T>) {
    let tc = kc.nrows();
    let logits = kc.dot(&qbar) * scale;
    let mut score = vec![T::neg_infinity(); w];
    for (j, &z) in logits.iter().enumerate() {
        // `j*BS < (i+1)*qt`, in u128 so that nothing overflows
        if !causal || (j as u128) * (bs as u128) < (i as u128 + 1) * (qt as u128) {
            score[j] = z;
        }
    }
    let mut entries: Vec<(T, usize)> = (0..tc.max(s_m))
        .map(|j| (if j < tc { score[j] } else { T::neg_infinity() }, j))
        .collect();
    entries.sort_by(rank);
    let mut row: Vec<i32> = entries[..s_m]
        .iter()
        .map(|&(z, j)| if z == T::neg_infinity() { 0 } else { j as i32 })
        .collect();
    row.sort_unstable();
    (row, score)
}

/// Packs per-row results into `[b, rows, heads, S]` indices and `[b, rows, heads, W]` scores.
fn pack<T: Real>(
    dims: (usize, usize, usize),
    s: usize,
    w: usize,
    results: Vec<(Vec<i32>, Vec<T>)>,
) -> SelectOut<T> {
    let (b, r, h) = dims;
    let mut idx = Vec::with_capacity(b * r * h * s);
    let mut sc = Vec::with_capacity(b * r * h * w);
    for (i, z) in results {
        idx.extend(i);
        sc.extend(z);
    }
    SelectOut {
        block_indices: Array4::from_shape_vec((b, r, h, s), idx).expect("rows of S"),
        scores: Array4::from_shape_vec((b, r, h, w), sc).expect("rows of W"),
    }
}

/// `block_indices = nsa_select_blocks(q, k_cmp, block_counts, ...)` with the block scores.
///
/// `"fla"` (§4.1): `k_cmp` has `ceil(L_n/BS)` rows per sequence; `block_counts` is an integer
/// (default 16, `>= 1`) or a `[B, T, H]` tensor of non-negative quotas (`S` = its largest
/// entry). `"mslk_tile_mean"` (§4.2): `k_cmp` has `floor(L_n/BS)` rows, every sequence length
/// is a multiple of `q_tile_size`, `block_counts` is an integer and `S_m = min(block_counts,
/// max TC_n)`. `causal = false` only with `"mslk_tile_mean"`. Rows run in parallel.
#[allow(clippy::too_many_arguments)]
pub fn nsa_select_blocks<T: Real>(
    q: ArrayView4<'_, T>,
    k_cmp: ArrayView4<'_, T>,
    block_counts: Option<BlockCounts<'_>>,
    cu_seqlens: Option<&[i64]>,
    block_size: i64,
    scale: Option<f64>,
    mode: SelectMode,
    q_tile_size: i64,
    causal: bool,
) -> Result<SelectOut<T>> {
    let bs = check_block_size(block_size)?;
    let (b, t, hq, kd) = q.dim();
    let (partial, rule) = mode.blocks();
    let layout = CmpLayout::new(b, t, cu_seqlens, bs, partial)?;
    let g = check_cmp_shapes(q.shape(), k_cmp.shape(), None, &layout, rule)?;
    let h = k_cmp.shape()[2];
    let scale = check_scale::<T>(scale, kd)?;
    if let Some(BlockCounts::Int(n)) = block_counts {
        if n < 1 {
            return Err(Error::param("block_counts", "an integer >= 1", n));
        }
    }
    let w = layout.tc.iter().copied().max().unwrap_or(0);
    let counts = block_counts.unwrap_or(BlockCounts::Int(DEFAULT_BLOCK_COUNTS));
    match mode {
        SelectMode::Fla => {
            if !causal {
                return Err(Error::param(
                    "causal",
                    "true (mode \"fla\" is always causal)",
                    false,
                ));
            }
            counts.check_tensor([b, t, h], None)?;
            let s_out = match counts {
                BlockCounts::Int(n) => n,
                BlockCounts::Tensor(c) => c.iter().copied().max().unwrap_or(0).max(0),
            };
            if s_out > MAX_SLOTS {
                return Err(Error::param(
                    "block_counts",
                    format!("at most {MAX_SLOTS} selected blocks per row"),
                    s_out,
                ));
            }
            let s_out = s_out as usize;
            let results = (0..b * t * h)
                .into_par_iter()
                .map(|r| {
                    let (bb, tt, hh) = (r / (t * h), (r / h) % t, r % h);
                    let n = layout.seq_of(bb, tt);
                    let (seq, base) = (&layout.seqs[n], layout.base[n]);
                    let n_sel = match counts {
                        BlockCounts::Int(n) => n as usize,
                        BlockCounts::Tensor(c) => c[[bb, tt, hh]] as usize,
                    };
                    let qg = q.slice(s![bb, tt, hh * g..(hh + 1) * g, ..]);
                    let kc = k_cmp.slice(s![bb, base..base + layout.tc[n], hh, ..]);
                    fla_row(qg, kc, tt - seq.bos, bs, scale, n_sel, s_out, w)
                })
                .collect();
            Ok(pack((b, t, h), s_out, w, results))
        }
        SelectMode::MslkTileMean => {
            let BlockCounts::Int(count) = counts else {
                return Err(Error::missing(
                    "block_counts",
                    "an integer block_counts in mode \"mslk_tile_mean\"",
                    "a tensor",
                ));
            };
            if q_tile_size < 1 {
                return Err(Error::param("q_tile_size", "an integer >= 1", q_tile_size));
            }
            let qt = q_tile_size as usize;
            if let Some(seq) = layout.seqs.iter().find(|s| s.len() % qt != 0) {
                return Err(Error::param(
                    "q_tile_size",
                    "a divisor of every sequence length (mode \"mslk_tile_mean\")",
                    format!("{qt}; sequence {} has length {}", seq.n, seq.len()),
                ));
            }
            let s_m = (count as usize).min(w);
            // (sequence, tile) of every output row, in packed order per batch row
            let tiles: Vec<(usize, usize)> = layout
                .seqs
                .iter()
                .flat_map(|s| (0..s.len() / qt).map(move |i| (s.n, i)))
                .collect();
            let (out_b, nq) = if layout.varlen {
                (1, tiles.len())
            } else {
                (b, t / qt)
            };
            let results = (0..out_b * nq * hq)
                .into_par_iter()
                .map(|r| {
                    let (row, hh) = (r / hq, r % hq);
                    let (n, i) = tiles[row];
                    let (seq, base) = (&layout.seqs[n], layout.base[n]);
                    let start = seq.bos + i * qt;
                    let qbar = q
                        .slice(s![seq.batch, start..start + qt, hh, ..])
                        .mean_axis(Axis(0))
                        .expect("qt >= 1");
                    let kc = k_cmp.slice(s![seq.batch, base..base + layout.tc[n], hh / g, ..]);
                    tile_row(qbar, kc, i, qt, bs, causal, scale, s_m, w)
                })
                .collect();
            Ok(pack((out_b, nq, hq), s_m, w, results))
        }
    }
}
