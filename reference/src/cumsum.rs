//! Scans: `cumsum`, `chunk_local_cumsum`, `chunk_global_cumsum`
//! (`conformance/spec/ops-cumsum.md` §1-§3).
//!
//! Every scan is a sequential left-to-right (or right-to-left when `reverse`) running sum in
//! `T`, one element at a time, so that rounding, NaN and Inf behave exactly as a sequential
//! summation would. Independent lanes run in parallel (rayon).

use crate::error::{Error, Result};
use crate::scalar::Real;
use crate::varlen::{check_chunk_size, sequences};
use ndarray::Zip;
use ndarray::{Array, ArrayD, ArrayView, ArrayView1, ArrayViewD, ArrayViewMut1, Axis, RemoveAxis};
use rayon::prelude::*;

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

/// Product of extents, refusing a total that does not fit in `usize`.
fn checked_numel(arg: &str, shape: &[usize], dims: &[usize]) -> Result<usize> {
    dims.iter().try_fold(1usize, |acc, &d| {
        acc.checked_mul(d)
            .ok_or_else(|| Error::shape(arg, "a number of elements that fits in usize", shape))
    })
}

/// Validates `x`'s shape and `dim` (negative counts from the end; out of range is an error).
///
/// `x` must have rank `>= 1` and a number of elements that fits in `usize`; `dim` must lie in
/// `-rank .. rank`, and `dim < 0` means `rank + dim`.
pub fn validate_cumsum(shape: &[usize], dim: i64) -> Result<CumsumPlan> {
    let rank = shape.len();
    if rank == 0 {
        return Err(Error::shape("x", "rank >= 1", shape));
    }
    let r = rank as i64;
    if dim < -r || dim >= r {
        return Err(Error::param(
            "dim",
            format!("an integer in {} ..= {}", -r, r - 1),
            dim,
        ));
    }
    let axis = if dim < 0 { dim + r } else { dim } as usize;
    checked_numel("x", shape, shape)?;
    Ok(CumsumPlan {
        axis,
        outer: checked_numel("x", shape, &shape[..axis])?,
        len: shape[axis],
        inner: checked_numel("x", shape, &shape[axis + 1..])?,
    })
}

/// Running sum of one lane in `T`, sequentially: `out[i] = f(Σ_{j ≤ i} x[j])`
/// (`Σ_{j ≥ i}` when `reverse`), where `f` multiplies by `scale` when given.
fn scan_lane<T: Real>(
    x: ArrayView1<'_, T>,
    mut out: ArrayViewMut1<'_, T>,
    reverse: bool,
    scale: Option<T>,
) {
    let mut acc = T::zero();
    let mut step = |xi: &T, oi: &mut T| {
        acc += *xi;
        *oi = match scale {
            Some(s) => acc * s,
            None => acc,
        };
    };
    if reverse {
        x.iter()
            .rev()
            .zip(out.iter_mut().rev())
            .for_each(|(xi, oi)| step(xi, oi));
    } else {
        x.iter()
            .zip(out.iter_mut())
            .for_each(|(xi, oi)| step(xi, oi));
    }
}

/// `y[.., i, ..] = Σ_{j ≤ i} x[.., j, ..]` along `dim` (`j ≥ i` when `reverse`), sequential
/// summation in `T`.
///
/// Any rank `>= 1`, any layout of `x`, length-0 extents allowed (the result is then empty or
/// all lanes empty). Each lane (every index of the other axes) is scanned independently.
pub fn cumsum<T: Real>(x: ArrayViewD<'_, T>, dim: i64, reverse: bool) -> Result<ArrayD<T>> {
    let plan = validate_cumsum(x.shape(), dim)?;
    let mut y = ArrayD::<T>::zeros(x.raw_dim());
    Zip::from(y.lanes_mut(Axis(plan.axis)))
        .and(x.lanes(Axis(plan.axis)))
        .par_for_each(|yl, xl| scan_lane(xl, yl, reverse, None));
    Ok(y)
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
///
/// With `cu_seqlens`, `B == 1`, `cu_seqlens[0] == 0`, non-decreasing, `cu_seqlens[N] == T`.
pub fn validate_seq_scan(
    g_shape: &[usize],
    cu_seqlens: Option<&[i64]>,
    chunk_size: Option<i64>,
) -> Result<SeqScanPlan> {
    let (b, t, h, s) = match *g_shape {
        [b, t, h] => (b, t, h, 1),
        [b, t, h, s] => (b, t, h, s),
        _ => {
            return Err(Error::shape(
                "g",
                "rank 3 [B, T, H] or rank 4 [B, T, H, S]",
                g_shape,
            ))
        }
    };
    if let Some(cs) = chunk_size {
        check_chunk_size(cs, None)?;
    }
    let seqs = sequences(b, t, cu_seqlens)?;
    Ok(SeqScanPlan { b, t, h, s, seqs })
}

/// Token ranges `[start, end)` scanned independently, per batch row: the chunks of
/// `chunk_size` tokens of every sequence, or (with `None`) every whole sequence.
pub(crate) fn segments(plan: &SeqScanPlan, chunk_size: Option<usize>) -> Vec<Vec<(usize, usize)>> {
    let mut rows = vec![Vec::new(); plan.b];
    for seq in &plan.seqs {
        let row: &mut Vec<(usize, usize)> = &mut rows[seq.batch];
        match chunk_size {
            Some(bt) => row.extend(seq.chunks(bt)),
            None => row.push((seq.bos, seq.eos)),
        }
    }
    rows
}

/// Scans `g` (`[B, T, ...]`, time on axis 1) independently over each `segs[b]` range of batch
/// row `b` and every trailing index: `o[b, t, ..] = scale · Σ g[b, u, ..]` over the segment's
/// `u ≤ t` (`u ≥ t` when `reverse`), the scale applied after the sum. Tokens outside every
/// segment (none, for a validated plan) stay 0.
pub(crate) fn scan_segments<T: Real, D: RemoveAxis>(
    g: ArrayView<'_, T, D>,
    segs: &[Vec<(usize, usize)>],
    reverse: bool,
    scale: Option<f64>,
) -> Array<T, D> {
    let scale = scale.map(T::c);
    let mut o = Array::<T, D>::zeros(g.raw_dim());
    o.axis_iter_mut(Axis(0))
        .into_par_iter()
        .zip(g.axis_iter(Axis(0)).into_par_iter())
        .zip(segs.par_iter())
        .for_each(|((mut o_row, g_row), row_segs)| {
            // Each row is `[T, ...]`: lanes along its axis 0 are the per-feature time series.
            Zip::from(o_row.lanes_mut(Axis(0)))
                .and(g_row.lanes(Axis(0)))
                .par_for_each(|mut ol, gl| {
                    for &(start, end) in row_segs {
                        scan_lane(
                            gl.slice(ndarray::s![start..end]),
                            ol.slice_mut(ndarray::s![start..end]),
                            reverse,
                            scale,
                        );
                    }
                });
        });
    o
}

/// Within each chunk of `chunk_size` tokens of each sequence: `o[t] = scale · Σ g` over the
/// chunk's tokens up to `t` (from `t` to the chunk's last valid token when `reverse`).
///
/// Chunks start at every sequence's first token (batch row, or `cu_seqlens` range); the last
/// chunk of a sequence may be partial; nothing flows across a sequence boundary. `scale`
/// (default none, i.e. 1) multiplies the sum **after** summation.
pub fn chunk_local_cumsum<T: Real>(
    g: ArrayViewD<'_, T>,
    cu_seqlens: Option<&[i64]>,
    chunk_size: i64,
    reverse: bool,
    scale: Option<f64>,
) -> Result<ArrayD<T>> {
    let plan = validate_seq_scan(g.shape(), cu_seqlens, Some(chunk_size))?;
    let bt = check_chunk_size(chunk_size, None)?;
    Ok(scan_segments(g, &segments(&plan, Some(bt)), reverse, scale))
}

/// As [`chunk_local_cumsum`] with one chunk per whole sequence:
/// `o[t] = scale · Σ_{bos ≤ u ≤ t} g[u]` (`t ≤ u < eos` when `reverse`).
pub fn chunk_global_cumsum<T: Real>(
    g: ArrayViewD<'_, T>,
    cu_seqlens: Option<&[i64]>,
    reverse: bool,
    scale: Option<f64>,
) -> Result<ArrayD<T>> {
    let plan = validate_seq_scan(g.shape(), cu_seqlens, None)?;
    Ok(scan_segments(g, &segments(&plan, None), reverse, scale))
}
