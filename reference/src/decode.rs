//! Decoding against a static KV cache: `kv_cache_update`, `decode_attention` (spec `ops-decode.md`).
//! API FIXED BY THE LEAD: bodies to be written (replace every `todo!`).

use crate::error::Result;
use crate::scalar::Real;
use ndarray::{Array3, Array4, ArrayView4};
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
    let _ = (
        k_cache,
        v_cache,
        k,
        v,
        cache_seqlens,
        cache_batch_idx,
        layout,
    );
    todo!()
}

/// Writes `k`, `v` into copies of the caches at `cache_seqlens[b] .. + L_new` of row
/// `cache_batch_idx[b]`; every other element is copied bit for bit (any `Copy` element type, so
/// half-precision caches stay exact).
pub fn kv_cache_update<E: Copy + Send + Sync>(
    k_cache: ArrayView4<'_, E>,
    v_cache: ArrayView4<'_, E>,
    k: ArrayView4<'_, E>,
    v: ArrayView4<'_, E>,
    cache_seqlens: &[i64],
    cache_batch_idx: Option<&[i64]>,
    layout: CacheLayout,
) -> Result<(Array4<E>, Array4<E>)> {
    let _ = (
        k_cache,
        v_cache,
        k,
        v,
        cache_seqlens,
        cache_batch_idx,
        layout,
    );
    todo!()
}

/// Validates `decode_attention`: `q` `[B, L_q, H, D]`, caches in `layout`, `H % H_kv == 0`,
/// `D <= 256`, `0 <= cache_seqlens[b] <= S`, `cache_batch_idx` in range and distinct.
pub fn validate_decode_attention(
    q: &[usize],
    k_cache: &[usize],
    v_cache: &[usize],
    cache_seqlens: &[i64],
    cache_batch_idx: Option<&[i64]>,
    layout: CacheLayout,
) -> Result<DecodePlan> {
    let _ = (q, k_cache, v_cache, cache_seqlens, cache_batch_idx, layout);
    todo!()
}

/// Outputs of [`decode_attention`].
#[derive(Debug, Clone)]
pub struct DecodeOut<T> {
    /// `[B, L_q, H, D]`.
    pub o: Array4<T>,
    /// `[B, H, L_q]`, natural-log sum of exp of the scaled scores (`-inf` for no visible key).
    pub lse: Array3<T>,
}

/// Attention of each query over the visible keys `j < n` (and `j <= n - L_q + i` when causal)
/// of its cache row; positions `j >= n` are never read. No visible key: `o = 0`, `lse = -inf`.
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
    let _ = (
        q,
        k_cache,
        v_cache,
        cache_seqlens,
        cache_batch_idx,
        softmax_scale,
        causal,
        layout,
    );
    todo!()
}
