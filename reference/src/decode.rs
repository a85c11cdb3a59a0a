//! Decoding against a static KV cache: `kv_cache_update`, `decode_attention`
//! (`conformance/spec/ops-decode.md`).
//!
//! Caches are `[B_cache, S, H_kv, D]` (`bshd`) or `[B_cache, H_kv, S, D]` (`bhsd`); queries and
//! new tokens are `[B, L, H, D]`. Batch row `b` uses cache row `cache_batch_idx[b]` (default `b`)
//! and its valid length `cache_seqlens[b]`. Query head `h` uses KV head `h / (H / H_kv)`.

use crate::error::{Error, ErrorKind, Result};
use crate::scalar::Real;
use ndarray::{s, Array1, Array3, Array4, ArrayView2, ArrayView4, Axis, Zip};
use rayon::prelude::*;
use std::str::FromStr;

/// Memory layout of the caches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CacheLayout {
    /// `[B_cache, S, H_kv, D]` (flash-attention's, the default).
    #[default]
    Bshd,
    /// `[B_cache, H_kv, S, D]` (gpt-fast's and SDPA's).
    Bhsd,
}

impl FromStr for CacheLayout {
    type Err = crate::Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "bshd" => Ok(CacheLayout::Bshd),
            "bhsd" => Ok(CacheLayout::Bhsd),
            _ => Err(crate::Error::param(
                "cache_layout",
                "\"bshd\" or \"bhsd\"",
                s,
            )),
        }
    }
}

/// Validated geometry of a decode step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodePlan {
    pub b: usize,
    pub b_cache: usize,
    pub s: usize,
    pub h_kv: usize,
    pub d: usize,
    /// `L_new` for the update, `L_q` for attention.
    pub l: usize,
    /// `H` (query heads) for attention; `H_kv` for the update.
    pub h: usize,
    /// Cache row of each batch row (`cache_batch_idx`, or the identity).
    pub rows: Vec<usize>,
}

/// The most features per head a decode kernel supports.
pub const MAX_HEAD_DIM: usize = 256;

/// `(B_cache, S, H_kv, D)` of `k_cache` in `layout`; `v_cache` must have the same shape.
fn cache_geometry(
    k_cache: &[usize],
    v_cache: &[usize],
    layout: CacheLayout,
) -> Result<(usize, usize, usize, usize)> {
    let [b_cache, x1, x2, d] = *k_cache else {
        let expected = match layout {
            CacheLayout::Bshd => "rank 4 [B_cache, S, H_kv, D] (layout bshd)",
            CacheLayout::Bhsd => "rank 4 [B_cache, H_kv, S, D] (layout bhsd)",
        };
        return Err(Error::shape("k_cache", expected, k_cache));
    };
    if v_cache != k_cache {
        return Err(Error::shape(
            "v_cache",
            format!("the shape of k_cache {k_cache:?}"),
            v_cache,
        ));
    }
    Ok(match layout {
        CacheLayout::Bshd => (b_cache, x1, x2, d),
        CacheLayout::Bhsd => (b_cache, x2, x1, d),
    })
}

/// Cache row of every batch row: `cache_batch_idx` (length `B`, in `0 .. B_cache`, distinct),
/// or the identity (then `B <= B_cache`, and `batch_arg` is named when it is not).
fn cache_rows(
    b: usize,
    b_cache: usize,
    cache_batch_idx: Option<&[i64]>,
    batch_arg: &str,
) -> Result<Vec<usize>> {
    let Some(idx) = cache_batch_idx else {
        if b > b_cache {
            return Err(Error::new(
                ErrorKind::Shape,
                batch_arg,
                format!("batch B <= B_cache = {b_cache} without cache_batch_idx"),
                format!("B = {b}"),
            ));
        }
        return Ok((0..b).collect());
    };
    if idx.len() != b {
        return Err(Error::shape(
            "cache_batch_idx",
            format!("[B] = [{b}]"),
            [idx.len()],
        ));
    }
    let mut used = vec![false; b_cache];
    idx.iter()
        .enumerate()
        .map(|(i, &r)| {
            if r < 0 || r as u64 >= b_cache as u64 {
                return Err(Error::index(
                    "cache_batch_idx",
                    format!("values in 0 .. B_cache = {b_cache}"),
                    format!("cache_batch_idx[{i}] = {r}"),
                ));
            }
            let r = r as usize;
            if std::mem::replace(&mut used[r], true) {
                return Err(Error::index(
                    "cache_batch_idx",
                    "distinct values",
                    format!("cache_batch_idx[{i}] = {r} repeated"),
                ));
            }
            Ok(r)
        })
        .collect()
}

/// `cache_seqlens` has length `B` and every `cache_seqlens[b] + extra` lies in `0 ..= S`
/// (`extra = L_new` for the update, 0 for attention), with `cache_seqlens[b] >= 0`.
fn check_seqlens(
    cache_seqlens: &[i64],
    b: usize,
    s: usize,
    extra: usize,
    what: &str,
) -> Result<()> {
    if cache_seqlens.len() != b {
        return Err(Error::shape(
            "cache_seqlens",
            format!("[B] = [{b}]"),
            [cache_seqlens.len()],
        ));
    }
    for (i, &n) in cache_seqlens.iter().enumerate() {
        let end = (n as i128) + extra as i128;
        if n < 0 || end > s as i128 {
            return Err(Error::index(
                "cache_seqlens",
                format!("0 <= cache_seqlens[b]{what} <= S = {s}"),
                format!("cache_seqlens[{i}] = {n}"),
            ));
        }
    }
    Ok(())
}

/// Validates `kv_cache_update`: cache shapes agree, `k`/`v` are `[B, L_new, H_kv, D]`,
/// `cache_seqlens` `[B]` non-negative with `cache_seqlens[b] + L_new <= S`, `cache_batch_idx`
/// in range and distinct.
pub fn validate_kv_cache_update(
    k_cache: &[usize],
    v_cache: &[usize],
    k: &[usize],
    v: &[usize],
    cache_seqlens: &[i64],
    cache_batch_idx: Option<&[i64]>,
    layout: CacheLayout,
) -> Result<DecodePlan> {
    let (b_cache, s, h_kv, d) = cache_geometry(k_cache, v_cache, layout)?;
    let (b, l) = match *k {
        [b, l, h, dd] if h == h_kv && dd == d => (b, l),
        _ => {
            return Err(Error::shape(
                "k",
                format!("[B, L_new, H_kv, D] with H_kv = {h_kv}, D = {d}"),
                k,
            ))
        }
    };
    if v != k {
        return Err(Error::shape("v", format!("the shape of k {k:?}"), v));
    }
    check_seqlens(cache_seqlens, b, s, l, " + L_new")?;
    let rows = cache_rows(b, b_cache, cache_batch_idx, "k")?;
    Ok(DecodePlan {
        b,
        b_cache,
        s,
        h_kv,
        d,
        l,
        h: h_kv,
        rows,
    })
}

/// Writes `k`, `v` into copies of the caches at `cache_seqlens[b] .. + L_new` of row
/// `cache_batch_idx[b]`; every other element is copied bit for bit (any `Copy` element type, so
/// half-precision caches stay exact).
///
/// `cache[r, n_b + l, h, :] = k[b, l, h, :]` for `r = cache_batch_idx[b]`, `n_b =
/// cache_seqlens[b]`, `0 <= l < L_new` (`cache[r, h, n_b + l, :]` in `bhsd`).
pub fn kv_cache_update<E: Copy + Send + Sync>(
    k_cache: ArrayView4<'_, E>,
    v_cache: ArrayView4<'_, E>,
    k: ArrayView4<'_, E>,
    v: ArrayView4<'_, E>,
    cache_seqlens: &[i64],
    cache_batch_idx: Option<&[i64]>,
    layout: CacheLayout,
) -> Result<(Array4<E>, Array4<E>)> {
    let plan = validate_kv_cache_update(
        k_cache.shape(),
        v_cache.shape(),
        k.shape(),
        v.shape(),
        cache_seqlens,
        cache_batch_idx,
        layout,
    )?;
    // Batch row writing into each cache row (rows are distinct, so at most one).
    let mut writer = vec![None; plan.b_cache];
    for (b, &r) in plan.rows.iter().enumerate() {
        writer[r] = Some(b);
    }
    let write = |cache: ArrayView4<'_, E>, new: ArrayView4<'_, E>| {
        let mut out = cache.to_owned();
        out.axis_iter_mut(Axis(0))
            .into_par_iter()
            .zip(writer.par_iter())
            .for_each(|(mut row, w)| {
                let Some(b) = *w else { return };
                let start = cache_seqlens[b] as usize;
                let range = start..start + plan.l;
                let src = new.index_axis(Axis(0), b); // [L_new, H_kv, D]
                match layout {
                    CacheLayout::Bshd => row.slice_mut(s![range, .., ..]).assign(&src),
                    CacheLayout::Bhsd => row
                        .slice_mut(s![.., range, ..])
                        .assign(&src.permuted_axes([1, 0, 2])),
                }
            });
        out
    };
    Ok((write(k_cache, k), write(v_cache, v)))
}

/// Validates `decode_attention`: `q` `[B, L_q, H, D]`, caches in `layout`, `H % H_kv == 0`,
/// `D <= 256`, `0 <= cache_seqlens[b] <= S`, `cache_batch_idx` in range and distinct.
///
/// Also refuses `H_kv == 0` (named `k_cache`) and `D == 0` (named `q`).
pub fn validate_decode_attention(
    q: &[usize],
    k_cache: &[usize],
    v_cache: &[usize],
    cache_seqlens: &[i64],
    cache_batch_idx: Option<&[i64]>,
    layout: CacheLayout,
) -> Result<DecodePlan> {
    let (b_cache, s, h_kv, d) = cache_geometry(k_cache, v_cache, layout)?;
    let [b, l, h, dq] = *q else {
        return Err(Error::shape("q", "rank 4 [B, L_q, H, D]", q));
    };
    if dq != d {
        return Err(Error::shape(
            "q",
            format!("[B, L_q, H, D] with the caches' D = {d}"),
            q,
        ));
    }
    if d == 0 || d > MAX_HEAD_DIM {
        return Err(Error::shape(
            "q",
            format!("head dim D in 1 ..= {MAX_HEAD_DIM}"),
            q,
        ));
    }
    if h_kv == 0 {
        return Err(Error::shape("k_cache", "H_kv >= 1", k_cache));
    }
    if h % h_kv != 0 {
        return Err(Error::shape(
            "q",
            format!("a number of heads H that is a multiple of H_kv = {h_kv}"),
            q,
        ));
    }
    check_seqlens(cache_seqlens, b, s, 0, "")?;
    let rows = cache_rows(b, b_cache, cache_batch_idx, "q")?;
    Ok(DecodePlan {
        b,
        b_cache,
        s,
        h_kv,
        d,
        l,
        h,
        rows,
    })
}

/// Outputs of [`decode_attention`].
#[derive(Debug, Clone)]
pub struct DecodeOut<T> {
    /// `[B, L_q, H, D]`.
    pub o: Array4<T>,
    /// `[B, H, L_q]`, natural-log sum of exp of the scaled scores (`-inf` for no visible key).
    pub lse: Array3<T>,
}

/// Number of keys visible to query `i` of `l_q` against `n` valid keys: `j < n`, and when
/// `causal` also `j <= n - L_q + i` (bottom-right alignment), i.e. `clamp(n - L_q + i + 1, 0, n)`.
pub fn visible_keys(n: usize, l_q: usize, i: usize, causal: bool) -> usize {
    if causal {
        // in u128 so that no `usize` argument can overflow the sum; the result is <= n
        let m = (n as u128 + i as u128 + 1).saturating_sub(l_q as u128);
        m.min(n as u128) as usize
    } else {
        n
    }
}

/// The `[S, D]` keys (or values) of cache row `r`, KV head `hk`.
fn head<T>(
    cache: ArrayView4<'_, T>,
    r: usize,
    hk: usize,
    layout: CacheLayout,
) -> ArrayView2<'_, T> {
    match layout {
        CacheLayout::Bshd => cache.slice_move(s![r, .., hk, ..]),
        CacheLayout::Bhsd => cache.slice_move(s![r, hk, .., ..]),
    }
}

/// Softmax attention of one query `q` `[D]` over the keys `k` `[m, D]` and values `v` `[m, D]`:
/// `s = scale · k q`, `o = Σ_j softmax(s)_j v_j`, `lse = log Σ_j exp(s_j)`, computed as
/// `M + log Σ_j exp(s_j - M)` with `M = max_j s_j`. `m == 0` gives `o = 0`, `lse = -inf`.
fn attend<T: Real>(
    q: ndarray::ArrayView1<'_, T>,
    k: ArrayView2<'_, T>,
    v: ArrayView2<'_, T>,
    scale: T,
) -> (Array1<T>, T) {
    if k.nrows() == 0 {
        return (Array1::zeros(q.len()), T::neg_infinity());
    }
    let scores = k.dot(&q) * scale;
    let max = scores.iter().copied().fold(T::neg_infinity(), T::max);
    let p = scores.mapv(|s| (s - max).exp());
    let sum = p.sum();
    let o = v.t().dot(&p) / sum;
    (o, max + sum.ln())
}

/// Attention of each query over the visible keys `j < n` (and `j <= n - L_q + i` when causal)
/// of its cache row; positions `j >= n` are never read. No visible key: `o = 0`, `lse = -inf`.
///
/// For batch row `b` (cache row `r`, `n = cache_seqlens[b]`), query `i`, head `h` (KV head
/// `h' = h / (H / H_kv)`): `s_j = softmax_scale · q[b,i,h,:] · k[r,j,h',:]` over the visible
/// `j`, `o[b,i,h,:] = Σ_j softmax(s)_j v[r,j,h',:]`, `lse[b,h,i] = log Σ_j exp(s_j)`.
/// `softmax_scale` defaults to `1/sqrt(D)` and must be finite. Numerically stable
/// (max-subtracted) softmax in `T`; (batch, query, head) triples run in parallel.
#[allow(clippy::too_many_arguments)]
pub fn decode_attention<T: Real>(
    q: ArrayView4<'_, T>,
    k_cache: ArrayView4<'_, T>,
    v_cache: ArrayView4<'_, T>,
    cache_seqlens: &[i64],
    cache_batch_idx: Option<&[i64]>,
    softmax_scale: Option<f64>,
    causal: bool,
    layout: CacheLayout,
) -> Result<DecodeOut<T>> {
    let plan = validate_decode_attention(
        q.shape(),
        k_cache.shape(),
        v_cache.shape(),
        cache_seqlens,
        cache_batch_idx,
        layout,
    )?;
    let scale = softmax_scale.unwrap_or(1.0 / (plan.d as f64).sqrt());
    if !scale.is_finite() {
        return Err(Error::param("softmax_scale", "a finite value", scale));
    }
    let scale = T::c(scale);
    let group = plan.h / plan.h_kv;
    let mut o = Array4::<T>::zeros(q.raw_dim());
    let mut lse = Array3::<T>::zeros((plan.b, plan.h, plan.l));
    Zip::indexed(o.lanes_mut(Axis(3)))
        .and(lse.view_mut().permuted_axes([0, 2, 1]))
        .par_for_each(|(b, i, h), mut o_row, lse_v| {
            let (r, hk) = (plan.rows[b], h / group);
            let m = visible_keys(cache_seqlens[b] as usize, plan.l, i, causal);
            let k = head(k_cache.view(), r, hk, layout).slice_move(s![..m, ..]);
            let v = head(v_cache.view(), r, hk, layout).slice_move(s![..m, ..]);
            let (out, l) = attend(q.slice(s![b, i, h, ..]), k, v, scale);
            o_row.assign(&out);
            *lse_v = l;
        });
    Ok(DecodeOut { o, lse })
}
