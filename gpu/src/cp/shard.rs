//! Moving sharded tensors: host arrays to each rank's shard ([`scatter_tokens`],
//! [`scatter_states`]) and back ([`gather_tokens`], [`gather_final_states`]), and the device
//! copies the context-parallel ops make (rows of a tensor, the summary's padded values).
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

/// Token rows `[start, start + len)` of a packed `[1, T, ...]` tensor, copied into a new
/// `[1, len, ...]` tensor.
pub(crate) fn token_rows(
    gpu: &Gpu,
    t: &DeviceTensor,
    start: usize,
    len: usize,
) -> GpuResult<DeviceTensor> {
    let shape = t.shape();
    let row: usize = shape[2..].iter().product::<usize>() * t.dtype().size_bytes();
    let mut new_shape = shape.to_vec();
    new_shape[1] = len;
    let mut out = DeviceTensor::alloc(gpu, &new_shape, t.dtype())?;
    let bytes = row * len;
    if bytes > 0 {
        let src = t.buffer().slice(start * row..start * row + bytes);
        let mut dst = out.buffer_mut().slice_mut(0..bytes);
        gpu.stream()
            .memcpy_dtod(&src, &mut dst)
            .map_err(GpuError::driver("copy of shard rows"))?;
    }
    Ok(out)
}

/// Rows `rows` of axis 0 of `t`, in that order, copied into a new tensor.
pub(crate) fn select_rows(gpu: &Gpu, t: &DeviceTensor, rows: &[usize]) -> GpuResult<DeviceTensor> {
    let row: usize = t.shape()[1..].iter().product::<usize>() * t.dtype().size_bytes();
    let mut shape = t.shape().to_vec();
    shape[0] = rows.len();
    let mut out = DeviceTensor::alloc(gpu, &shape, t.dtype())?;
    for (i, &r) in rows.iter().enumerate() {
        if row > 0 {
            let src = t.buffer().slice(r * row..(r + 1) * row);
            let mut dst = out.buffer_mut().slice_mut(i * row..(i + 1) * row);
            gpu.stream()
                .memcpy_dtod(&src, &mut dst)
                .map_err(GpuError::driver("copy of summary rows"))?;
        }
    }
    Ok(out)
}

/// `t` (`[.., W]`) with `extra` zero columns appended to its last axis (`[.., W + extra]`): one
/// strided 2-D copy after a memset.
pub(crate) fn pad_last_axis(gpu: &Gpu, t: &DeviceTensor, extra: usize) -> GpuResult<DeviceTensor> {
    let shape = t.shape();
    let w = *shape.last().unwrap_or(&1);
    let mut new_shape = shape.to_vec();
    if let Some(l) = new_shape.last_mut() {
        *l += extra;
    }
    let mut out = DeviceTensor::alloc(gpu, &new_shape, t.dtype())?;
    let es = t.dtype().size_bytes();
    let rows = t.numel() / w.max(1);
    let stream = gpu.stream();
    let src_guard = t.buffer().device_ptr(stream);
    let dst_guard = out.buffer_mut().device_ptr_mut(stream);
    let (src, dst) = (src_guard.0, dst_guard.0);
    // SAFETY: `dst` holds rows · (w + extra) elements, `src` rows · w; the copies stay inside.
    unsafe {
        cudarc::driver::result::memset_d8_async(dst, 0, rows * (w + extra) * es, stream.cu_stream())
    }
    .map_err(GpuError::driver("memset of padded values"))?;
    // in slabs, well below any limit on the height of a 2-D copy
    let slab = 1 << 20;
    let mut r0 = 0;
    while r0 < rows && w > 0 {
        let h = slab.min(rows - r0);
        let copy = sys::CUDA_MEMCPY2D {
            srcXInBytes: 0,
            srcY: 0,
            srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            srcHost: std::ptr::null(),
            srcDevice: src + (r0 * w * es) as u64,
            srcArray: std::ptr::null_mut(),
            srcPitch: w * es,
            dstXInBytes: 0,
            dstY: 0,
            dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            dstHost: std::ptr::null_mut(),
            dstDevice: dst + (r0 * (w + extra) * es) as u64,
            dstArray: std::ptr::null_mut(),
            dstPitch: (w + extra) * es,
            WidthInBytes: w * es,
            Height: h,
        };
        // SAFETY: both regions lie inside their buffers (above); the stream is this GPU's.
        unsafe { sys::cuMemcpy2DAsync_v2(&copy, stream.cu_stream()) }
            .result()
            .map_err(GpuError::driver("2-D copy of padded values"))?;
        r0 += h;
    }
    drop((src_guard, dst_guard));
    Ok(out)
}

/// Sets every byte of `t` to 0.
pub(crate) fn zero(gpu: &Gpu, t: &mut DeviceTensor) -> GpuResult<()> {
    let stream = gpu.stream();
    let n = t.buffer().len();
    let (ptr, _g) = t.buffer_mut().device_ptr_mut(stream);
    // SAFETY: `ptr` points to the `n` bytes of `t`'s buffer.
    unsafe { cudarc::driver::result::memset_d8_async(ptr, 0, n, stream.cu_stream()) }
        .map_err(GpuError::driver("memset"))
}

/// The summary run's initial state `[1, HV, K, V + K] = [0 | I]` per head, in `dtype`.
pub(crate) fn zero_identity(
    gpu: &Gpu,
    hv: usize,
    k: usize,
    v: usize,
    dtype: Dtype,
) -> GpuResult<DeviceTensor> {
    let mut a = ArrayD::<f64>::zeros(vec![1, hv, k, v + k]);
    for h in 0..hv {
        for i in 0..k {
            a[[0, h, i, v + i]] = 1.0;
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
