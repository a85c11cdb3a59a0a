//! `chunk_local_cumsum` and `chunk_global_cumsum` on the GPU
//! (`conformance/spec/ops-cumsum.md` §2-§3).
//!
//! `g` `[B, T, H]` or `[B, T, H, S]` is a strided scan over the token axis with `H * S` lanes.
//! A job is one chunk of `chunk_size` tokens (local) or one whole sequence (global), restarting
//! at every sequence start; with `cu_seqlens` the jobs come from a small table uploaded per call.
//! `o[t] = scale · Σ g` over the job's tokens up to `t` (from `t` to the job's end when
//! `reverse`), accumulated in fp32 (fp64 when fp64 is involved).

use crate::device::Gpu;
use crate::error::GpuResult;
use crate::kernels::Module;
use crate::params::{check_float, scan_output_dtype, GateArgs};
use crate::strided::{launch_strided, Jobs};
use crate::tensor::DeviceTensor;
use attn_reference::cumsum::{validate_seq_scan, SeqScanPlan};
use attn_reference::{Dtype, Error};

/// `o` must have `g`'s shape and dtype float32, float64 or `g`'s own.
pub(crate) fn check_out(
    g_shape: &[usize],
    g_dtype: Dtype,
    o_shape: &[usize],
    o_dtype: Dtype,
) -> attn_reference::Result<()> {
    scan_output_dtype(g_dtype, Some(o_dtype))?;
    if o_shape != g_shape {
        return Err(Error::shape(
            "o",
            format!("the shape of g {g_shape:?}"),
            o_shape,
        ));
    }
    Ok(())
}

/// Validates a `chunk_local_cumsum` (`chunk_size` given) or `chunk_global_cumsum` call from
/// shapes and dtypes alone (no GPU needed): `g` float of rank 3 or 4, `cu_seqlens` and
/// `chunk_size` by the reference's rules, `o` of `g`'s shape.
pub fn check_seq_scan(
    g_shape: &[usize],
    g_dtype: Dtype,
    cu_seqlens: Option<&[i64]>,
    chunk_size: Option<i64>,
    o_shape: &[usize],
    o_dtype: Dtype,
) -> attn_reference::Result<SeqScanPlan> {
    check_float("g", g_dtype)?;
    let plan = validate_seq_scan(g_shape, cu_seqlens, chunk_size)?;
    check_out(g_shape, g_dtype, o_shape, o_dtype)?;
    Ok(plan)
}

#[allow(clippy::too_many_arguments)]
fn seq_scan_into(
    gpu: &Gpu,
    module: Module,
    g: &DeviceTensor,
    cu_seqlens: Option<&[i64]>,
    chunk_size: Option<i64>,
    reverse: bool,
    scale: Option<f64>,
    o: &mut DeviceTensor,
) -> GpuResult<()> {
    let plan = check_seq_scan(
        g.shape(),
        g.dtype(),
        cu_seqlens,
        chunk_size,
        o.shape(),
        o.dtype(),
    )?;
    let seg = chunk_size.map(|c| c as usize);
    let jobs = Jobs::for_plan(&plan, cu_seqlens.is_some(), seg);
    launch_strided(
        gpu,
        module,
        g,
        o,
        plan.h * plan.s,
        &jobs,
        reverse,
        scale,
        GateArgs::none(),
    )
}

/// `chunk_local_cumsum` into a new tensor of `output_dtype` (`None`: `g`'s dtype; the spec's
/// default is float32).
pub fn chunk_local_cumsum(
    gpu: &Gpu,
    g: &DeviceTensor,
    cu_seqlens: Option<&[i64]>,
    chunk_size: i64,
    reverse: bool,
    scale: Option<f64>,
    output_dtype: Option<Dtype>,
) -> GpuResult<DeviceTensor> {
    check_float("g", g.dtype())?;
    validate_seq_scan(g.shape(), cu_seqlens, Some(chunk_size))?;
    let mut o = DeviceTensor::alloc(gpu, g.shape(), scan_output_dtype(g.dtype(), output_dtype)?)?;
    chunk_local_cumsum_into(gpu, g, cu_seqlens, chunk_size, reverse, scale, &mut o)?;
    Ok(o)
}

/// `chunk_local_cumsum` written into `o`.
pub fn chunk_local_cumsum_into(
    gpu: &Gpu,
    g: &DeviceTensor,
    cu_seqlens: Option<&[i64]>,
    chunk_size: i64,
    reverse: bool,
    scale: Option<f64>,
    o: &mut DeviceTensor,
) -> GpuResult<()> {
    seq_scan_into(
        gpu,
        Module::ChunkLocalCumsum,
        g,
        cu_seqlens,
        Some(chunk_size),
        reverse,
        scale,
        o,
    )
}

/// `chunk_global_cumsum` into a new tensor of `output_dtype` (`None`: `g`'s dtype).
pub fn chunk_global_cumsum(
    gpu: &Gpu,
    g: &DeviceTensor,
    cu_seqlens: Option<&[i64]>,
    reverse: bool,
    scale: Option<f64>,
    output_dtype: Option<Dtype>,
) -> GpuResult<DeviceTensor> {
    check_float("g", g.dtype())?;
    validate_seq_scan(g.shape(), cu_seqlens, None)?;
    let mut o = DeviceTensor::alloc(gpu, g.shape(), scan_output_dtype(g.dtype(), output_dtype)?)?;
    chunk_global_cumsum_into(gpu, g, cu_seqlens, reverse, scale, &mut o)?;
    Ok(o)
}

/// `chunk_global_cumsum` written into `o`.
pub fn chunk_global_cumsum_into(
    gpu: &Gpu,
    g: &DeviceTensor,
    cu_seqlens: Option<&[i64]>,
    reverse: bool,
    scale: Option<f64>,
    o: &mut DeviceTensor,
) -> GpuResult<()> {
    seq_scan_into(
        gpu,
        Module::ChunkGlobalCumsum,
        g,
        cu_seqlens,
        None,
        reverse,
        scale,
        o,
    )
}
