//! Scans: `cumsum`, `chunk_local_cumsum`, `chunk_global_cumsum` (spec `ops-cumsum.md` 1-3).
//! API FIXED BY THE LEAD: bodies to be written (replace every `todo!`).

use crate::error::Result;
use crate::scalar::Real;
use ndarray::{ArrayD, ArrayViewD};

/// Validated geometry of a `cumsum` call: the scan axis and the lane decomposition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CumsumPlan {
    /// The scan axis, `dim` normalised to `0 .. rank`.
    pub axis: usize,
    /// Product of the extents before `axis`.
    pub outer: usize,
    /// Extent of `axis` (the lane length).
    pub len: usize,
    /// Product of the extents after `axis` (the stride of the scan, in elements).
    pub inner: usize,
}

/// Validates `x`'s shape and `dim` (negative counts from the end; out of range is an error).
pub fn validate_cumsum(shape: &[usize], dim: i64) -> Result<CumsumPlan> {
    let _ = (shape, dim);
    todo!()
}

/// `y[.., i, ..] = Σ_{j ≤ i} x[.., j, ..]` along `dim` (`j ≥ i` when `reverse`), sequential
/// summation in `T`.
pub fn cumsum<T: Real>(x: ArrayViewD<'_, T>, dim: i64, reverse: bool) -> Result<ArrayD<T>> {
    let _ = (x, dim, reverse);
    todo!()
}

/// Validated geometry of the chunked/global scans over `g` `[B, T, H]` or `[B, T, H, S]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeqScanPlan {
    pub b: usize,
    pub t: usize,
    pub h: usize,
    /// 1 for the scalar form `[B, T, H]`.
    pub s: usize,
    /// The sequences (batch rows, or `cu_seqlens` ranges).
    pub seqs: Vec<crate::varlen::Seq>,
}

/// Validates `g`'s rank (3 or 4), `cu_seqlens`, and `chunk_size` (a power of two) when given.
pub fn validate_seq_scan(
    g_shape: &[usize],
    cu_seqlens: Option<&[i64]>,
    chunk_size: Option<i64>,
) -> Result<SeqScanPlan> {
    let _ = (g_shape, cu_seqlens, chunk_size);
    todo!()
}

/// Within each chunk of `chunk_size` tokens of each sequence: `o[t] = scale · Σ g` over the
/// chunk's tokens up to `t` (from `t` to the chunk's last valid token when `reverse`).
pub fn chunk_local_cumsum<T: Real>(
    g: ArrayViewD<'_, T>,
    cu_seqlens: Option<&[i64]>,
    chunk_size: i64,
    reverse: bool,
    scale: Option<f64>,
) -> Result<ArrayD<T>> {
    let _ = (g, cu_seqlens, chunk_size, reverse, scale);
    todo!()
}

/// As [`chunk_local_cumsum`] with one chunk per whole sequence.
pub fn chunk_global_cumsum<T: Real>(
    g: ArrayViewD<'_, T>,
    cu_seqlens: Option<&[i64]>,
    reverse: bool,
    scale: Option<f64>,
) -> Result<ArrayD<T>> {
    let _ = (g, cu_seqlens, reverse, scale);
    todo!()
}
