//! Moving sharded tensors: host arrays to each rank's shard ([`scatter_tokens`],
//! [`scatter_states`]) and back ([`gather_tokens`], [`gather_final_states`]), and the device
//! copies the context-parallel plans make into their buffers at each run (rows of a tensor,
//! the summary's padded values).
//!
//! Layouts: a token tensor is packed varlen `[1, T, ...]`; rank `r` holds the rows
//! `[c_r, c_{r+1})` of axis 1. A per-chunk tensor (`h` of `fwd_h`, `[1, NT, ...]`) is sharded
//! the same way by chunks (the gather is the same concatenation). A state tensor `[N, ...]`
//! (`initial_state`) is given to rank `r` as the rows of its pieces' sequences
//! ([`super::Partition::piece_sequences`]); its final states come back per piece.

use super::comm::CpGroup;
use super::partition::Partition;
use crate::device::Gpu;
use crate::error::{GpuError, GpuResult};
use crate::tensor::{DeviceTensor, HostElem};
use attn_reference::{Dtype, Error};
use cudarc::driver::{sys, DevicePtr, DevicePtrMut};
use ndarray::{concatenate, ArrayD, ArrayViewD, Axis, Slice};

/// Bytes of one token row of a packed `[1, T, ...]` tensor.
fn token_row_bytes(t: &DeviceTensor) -> usize {
    t.shape()[2..].iter().product::<usize>() * t.dtype().size_bytes()
}

/// Copies the token rows `[start, start + len)` of a packed `[1, T, ...]` tensor `src` into
/// `dst` (`[1, len, ...]`, the same trailing shape and dtype; the caller checked both shapes).
pub(crate) fn copy_token_rows(
    gpu: &Gpu,
    src: &DeviceTensor,
    start: usize,
    dst: &mut DeviceTensor,
) -> GpuResult<()> {
    let row = token_row_bytes(src);
    let bytes = dst.num_bytes();
    if bytes > 0 {
        let src = src.buffer().slice(start * row..start * row + bytes);
        let mut dst = dst.buffer_mut().slice_mut(0..bytes);
        gpu.stream()
            .memcpy_dtod(&src, &mut dst)
            .map_err(GpuError::driver("copy of shard rows"))?;
    }
    Ok(())
}

/// Copies rows `rows` of axis 0 of `src`, in that order, into `dst` (`[rows.len(), ...]`, the
/// same trailing shape and dtype).
pub(crate) fn copy_rows(
    gpu: &Gpu,
    src: &DeviceTensor,
    rows: &[usize],
    dst: &mut DeviceTensor,
) -> GpuResult<()> {
    let row: usize = src.shape()[1..].iter().product::<usize>() * src.dtype().size_bytes();
    for (i, &r) in rows.iter().enumerate() {
        if row > 0 {
            let src = src.buffer().slice(r * row..(r + 1) * row);
            let mut dst = dst.buffer_mut().slice_mut(i * row..(i + 1) * row);
            gpu.stream()
                .memcpy_dtod(&src, &mut dst)
                .map_err(GpuError::driver("copy of summary rows"))?;
        }
    }
    Ok(())
}

/// Copies the token rows `[start, start + len)` of `src` (`[1, T, .., W]`) into the first `W`
/// columns of the last axis of `dst` (`[1, len, .., W + extra]`); `dst`'s other columns are
/// left as they are (the summary's `[v | 0]` is zeroed once when its plan is made).
pub(crate) fn copy_padded_rows(
    gpu: &Gpu,
    src: &DeviceTensor,
    start: usize,
    dst: &mut DeviceTensor,
) -> GpuResult<()> {
    let w = *src.shape().last().unwrap_or(&1);
    let first = start * (token_row_bytes(src) / (w * src.dtype().size_bytes()).max(1));
    copy_columns(gpu, (src, first, 0), (dst, 0), w)
}

/// Copies `width` columns of the last axis: from row `row0 + r`, column `col` of `src` to row
/// `r`, column `dst_col` of `dst`, for every row `r` of `dst` (both viewed as rows of their
/// last axis, the same dtype): one strided 2-D copy per slab of rows. Errors (naming `dst`)
/// where a copy would leave either tensor.
pub(crate) fn copy_columns(
    gpu: &Gpu,
    (src, row0, col): (&DeviceTensor, usize, usize),
    (dst, dst_col): (&mut DeviceTensor, usize),
    width: usize,
) -> GpuResult<()> {
    let sw = *src.shape().last().unwrap_or(&1);
    let dw = *dst.shape().last().unwrap_or(&1);
    let rows = dst.numel() / dw.max(1);
    let src_rows = src.numel() / sw.max(1);
    if src.dtype() != dst.dtype()
        || col + width > sw
        || dst_col + width > dw
        || row0 + rows > src_rows
    {
        return Err(Error::shape(
            "dst",
            format!(
                "{width} columns from row {row0}, column {col} of {:?} ({})",
                src.shape(),
                src.dtype().name()
            ),
            dst.shape(),
        )
        .into());
    }
    let es = src.dtype().size_bytes();
    gpu.bind()?;
    let stream = gpu.stream();
    let src_guard = src.buffer().device_ptr(stream);
    let dst_guard = dst.buffer_mut().device_ptr_mut(stream);
    let (src, dst) = (src_guard.0, dst_guard.0);
    // in slabs, well below any limit on the height of a 2-D copy
    let slab = 1 << 20;
    let mut r0 = 0;
    while r0 < rows && width > 0 {
        let h = slab.min(rows - r0);
        let copy = sys::CUDA_MEMCPY2D {
            srcXInBytes: 0,
            srcY: 0,
            srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            srcHost: std::ptr::null(),
            srcDevice: src + (((row0 + r0) * sw + col) * es) as u64,
            srcArray: std::ptr::null_mut(),
            srcPitch: sw * es,
            dstXInBytes: 0,
            dstY: 0,
            dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            dstHost: std::ptr::null_mut(),
            dstDevice: dst + ((r0 * dw + dst_col) * es) as u64,
            dstArray: std::ptr::null_mut(),
            dstPitch: dw * es,
            WidthInBytes: width * es,
            Height: h,
        };
        // SAFETY: the rows and columns copied lie inside both tensors (checked above); the
        // stream is this GPU's.
        unsafe { sys::cuMemcpy2DAsync_v2(&copy, stream.cu_stream()) }
            .result()
            .map_err(GpuError::driver("2-D copy of columns"))?;
        r0 += h;
    }
    drop((src_guard, dst_guard));
    Ok(())
}

/// Sets every byte of `t` to 0.
pub(crate) fn zero(gpu: &Gpu, t: &mut DeviceTensor) -> GpuResult<()> {
    gpu.stream()
        .memset_zeros(t.buffer_mut())
        .map_err(GpuError::driver("memset"))
}

/// A summary run's initial state `[n, HV, K, V + K] = [0 | I]` per sequence and head, in
/// `dtype`.
pub(crate) fn zero_identity(
    gpu: &Gpu,
    n: usize,
    (hv, k, v): (usize, usize, usize),
    dtype: Dtype,
) -> GpuResult<DeviceTensor> {
    let mut a = ArrayD::<f64>::zeros(vec![n, hv, k, v + k]);
    for s in 0..n {
        for h in 0..hv {
            for i in 0..k {
                a[[s, h, i, v + i]] = 1.0;
            }
        }
    }
    match dtype {
        Dtype::F64 => DeviceTensor::from_array(gpu, a.view()),
        _ => DeviceTensor::from_array(gpu, a.mapv(|x| x as f32).view()),
    }
}

/// Checks that `arrays` holds one per local rank.
fn per_rank<T>(group: &CpGroup, arg: &str, got: &[T]) -> GpuResult<()> {
    let n = group.local_ranks().len();
    if got.len() != n {
        return Err(
            Error::shape(arg, format!("one tensor per local rank ({n})"), [got.len()]).into(),
        );
    }
    Ok(())
}

/// Rank-by-rank shards of a packed token tensor `a` (`[1, T, ...]`) on the group's local ranks.
pub fn scatter_tokens<T: HostElem>(
    group: &CpGroup,
    part: &Partition,
    arg: &str,
    a: ArrayViewD<'_, T>,
) -> GpuResult<Vec<DeviceTensor>> {
    if a.ndim() < 2 || a.shape()[0] != 1 || a.shape()[1] != part.tokens() {
        return Err(Error::shape(
            arg,
            format!("[1, {}, ...] (the partition's tokens)", part.tokens()),
            a.shape(),
        )
        .into());
    }
    group
        .ranks()
        .map(|(r, gpu)| {
            let s = part.shard(r);
            let rows = a.slice_axis(Axis(1), Slice::from(s.start..s.end));
            DeviceTensor::from_array(gpu, rows)
        })
        .collect()
}

/// Rank-by-rank initial states: for each local rank, the rows of `a` (`[N, ...]`) of its
/// pieces' sequences.
pub fn scatter_states<T: HostElem>(
    group: &CpGroup,
    part: &Partition,
    arg: &str,
    a: ArrayViewD<'_, T>,
) -> GpuResult<Vec<DeviceTensor>> {
    if a.ndim() < 1 || a.shape()[0] != part.sequences() {
        return Err(Error::shape(
            arg,
            format!("[{}, ...] (one row per sequence)", part.sequences()),
            a.shape(),
        )
        .into());
    }
    group
        .ranks()
        .map(|(r, gpu)| {
            let rows = a.select(Axis(0), &part.piece_sequences(r));
            DeviceTensor::from_array(gpu, rows.view())
        })
        .collect()
}

/// The concatenation along axis 1 of the local ranks' shards (every rank must be local: the
/// single-process group). Works for token tensors (`o`, `v_new`) and chunk tensors (`h`).
pub fn gather_tokens<T: HostElem>(
    group: &CpGroup,
    arg: &str,
    shards: &[&DeviceTensor],
) -> GpuResult<ArrayD<T>> {
    per_rank(group, arg, shards)?;
    let parts = group
        .ranks()
        .zip(shards)
        .map(|((_, gpu), t)| t.to_array::<T>(gpu))
        .collect::<GpuResult<Vec<_>>>()?;
    let views: Vec<_> = parts.iter().map(|p| p.view()).collect();
    concatenate(Axis(1), &views)
        .map_err(|e| Error::shape(arg, "shards of one shape but axis 1", e.to_string()).into())
}

/// The final states `[N, ...]` of the sequences, from the local ranks' per-piece final states
/// (single-process group: every rank local).
pub fn gather_final_states<T: HostElem>(
    group: &CpGroup,
    part: &Partition,
    shards: &[&DeviceTensor],
) -> GpuResult<ArrayD<T>> {
    per_rank(group, "final_state", shards)?;
    let parts = group
        .ranks()
        .zip(shards)
        .map(|((_, gpu), t)| t.to_array::<T>(gpu))
        .collect::<GpuResult<Vec<_>>>()?;
    let rows: Vec<_> = part
        .final_pieces()
        .into_iter()
        .map(|(r, i)| parts[r].index_axis(Axis(0), i).insert_axis(Axis(0)))
        .collect();
    if rows.is_empty() {
        return Err(Error::shape("final_state", "at least one sequence", [0]).into());
    }
    concatenate(Axis(0), &rows).map_err(|e| {
        Error::shape(
            "final_state",
            "per-piece states of one shape",
            e.to_string(),
        )
        .into()
    })
}
