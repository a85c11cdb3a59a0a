//! `chunk_local_cumsum` and `chunk_global_cumsum` on the GPU (spec ops-cumsum.md sections 2-3).
//!
//! `g` `[B, T, H]` or `[B, T, H, S]` is a strided scan over the token axis with `H * S` lanes.
//! A job is one chunk of `chunk_size` tokens (local) or one whole sequence (global), restarting
//! at every sequence start; with `cu_seqlens` the jobs come from a small table uploaded per call.
//! `o[t] = scale · Σ g` over the job's tokens up to `t` (from `t` to the job's end when
//! `reverse`), accumulated in fp32 (fp64 when fp64 is involved).

use crate::device::Gpu;
use crate::error::GpuResult;
use crate::kernels::Module;
use crate::params::{
    check_float, grid_for, scan_output_dtype, strided_width, tag, GateArgs, StridedArgs,
};
use crate::tensor::DeviceTensor;
use attn_reference::cumsum::{validate_seq_scan, SeqScanPlan};
use attn_reference::{Dtype, Error};

/// The job table of a varlen call, kept alive until the launch is queued.
pub(crate) struct Jobs {
    pub njobs: usize,
    pub rows_per_batch: usize,
    pub seg: usize,
    pub jobs_per_batch: usize,
    pub table: Option<(DeviceTensor, DeviceTensor)>,
}

/// Jobs of `seg` tokens (`None`: whole sequences) over the sequences of `plan`.
pub(crate) fn jobs(
    gpu: &Gpu,
    plan: &SeqScanPlan,
    varlen: bool,
    seg: Option<usize>,
) -> GpuResult<Jobs> {
    if !varlen {
        let seg = seg.unwrap_or(plan.t).max(1);
        let jpb = plan.t.div_ceil(seg);
        return Ok(Jobs {
            njobs: plan.b * jpb,
            rows_per_batch: plan.t,
            seg,
            jobs_per_batch: jpb.max(1),
            table: None,
        });
    }
    let mut row0 = Vec::new();
    let mut len = Vec::new();
    for s in &plan.seqs {
        for (a, e) in s.chunks(seg.unwrap_or(s.len()).max(1)) {
            row0.push((s.batch * plan.t + a) as i64);
            len.push((e - a) as i64);
        }
    }
    let njobs = row0.len();
    let table = if njobs > 0 {
        Some((
            DeviceTensor::from_slice(gpu, &row0)?,
            DeviceTensor::from_slice(gpu, &len)?,
        ))
    } else {
        None
    };
    Ok(Jobs {
        njobs,
        rows_per_batch: plan.t,
        seg: 1,
        jobs_per_batch: 1,
        table,
    })
}

/// Launches the strided scan of `module` over `jobs` (`gate` set for the fused KDA gate).
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_strided(
    gpu: &Gpu,
    module: Module,
    g: &DeviceTensor,
    o: &mut DeviceTensor,
    cols: usize,
    jobs: &Jobs,
    reverse: bool,
    scale: Option<f64>,
    gate: GateArgs,
) -> GpuResult<()> {
    if jobs.njobs == 0 || cols == 0 {
        return Ok(());
    }
    let vec = strided_width(gpu.sm_count(), g.dtype(), o.dtype(), cols, jobs.njobs);
    let ncv = cols / vec;
    let (job_row0, job_len) = match &jobs.table {
        Some((r, l)) => (r.ptr(gpu), l.ptr(gpu)),
        None => (0, 0),
    };
    let args = StridedArgs {
        x: g.ptr(gpu),
        y: o.ptr_mut(gpu),
        cols: cols as i64,
        ncv: ncv as i64,
        njobs: jobs.njobs as i64,
        rows_per_batch: jobs.rows_per_batch as i64,
        seg: jobs.seg as i64,
        jobs_per_batch: jobs.jobs_per_batch as i64,
        job_row0,
        job_len,
        reverse: reverse as i64,
        scale: scale.unwrap_or(1.0),
        gate,
    };
    let name = format!(
        "{}_v{vec}_{}_{}",
        module.name(),
        tag(g.dtype()),
        tag(o.dtype())
    );
    gpu.launch(module, &name, (grid_for(jobs.njobs * ncv), 1), 256, &args)
}

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
    let jobs = jobs(gpu, &plan, cu_seqlens.is_some(), seg)?;
    launch_strided(
        gpu,
        module,
        g,
        o,
        plan.h * plan.s,
        &jobs,
        reverse,
        scale,
        GateArgs {
            a_log_dtype: -1,
            dt_bias_dtype: -1,
            head_dim: 1,
            ..Default::default()
        },
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
