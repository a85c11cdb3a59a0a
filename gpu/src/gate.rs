//! `kda_gate` and the fused `kda_gate_chunk_cumsum` on the GPU
//! (`conformance/spec/ops-cumsum.md` §4-§5).
//!
//! With `a = g + dt_bias[hv·K + k]` (or `a = g`), in fp32 (fp64 for fp64 `g`):
//! `y = -exp(A_log[hv]) · softplus(a)` (`softplus(a) = a` for `a > 20`, else `log(1 + e^a)`),
//! or with `lower_bound`: `y = lower_bound · sigmoid(exp(A_log[hv]) · a)` (`sigmoid(a)`
//! without `A_log`). The fused op computes `chunk_local_cumsum(y, chunk_size, reverse, scale)`
//! with `y` only ever in registers.

use crate::device::Gpu;
use crate::error::GpuResult;
use crate::kernels::Module;
use crate::params::{
    check_float, dtype_code, scan_output_dtype, tag, widths, GateArgs, GateElemArgs,
};
use crate::seq_scan::check_out;
use crate::strided::{launch_strided, Jobs};
use crate::tensor::DeviceTensor;
use attn_reference::cumsum::validate_seq_scan;
use attn_reference::gate::{validate_kda_gate, KdaGateChunkCumsumParams};
use attn_reference::{Dtype, Error};

/// The gate's side inputs: `A_log` `[HV]` and `dt_bias` `[HV * K]`, each optional.
#[derive(Debug, Clone, Copy, Default)]
pub struct GateInputs<'a> {
    pub a_log: Option<&'a DeviceTensor>,
    pub dt_bias: Option<&'a DeviceTensor>,
}

/// Validates the gate's inputs from shapes and dtypes alone (no GPU needed): `g` float
/// `[B, T, HV, K]`, `A_log` and `dt_bias` float and 1-D, then the reference's rules (`A_log`
/// `[HV]` required unless `lower_bound`, `dt_bias` `[HV * K]`). Returns `(B, T, HV, K)`.
pub fn check_kda_gate(
    g_shape: &[usize],
    g_dtype: Dtype,
    a_log: Option<(&[usize], Dtype)>,
    dt_bias: Option<(&[usize], Dtype)>,
    lower_bound: Option<f64>,
) -> attn_reference::Result<(usize, usize, usize, usize)> {
    check_float("g", g_dtype)?;
    for (arg, t) in [("A_log", a_log), ("dt_bias", dt_bias)] {
        if let Some((shape, dtype)) = t {
            check_float(arg, dtype)?;
            if shape.len() != 1 {
                return Err(Error::shape(arg, "a 1-D tensor", shape));
            }
        }
    }
    validate_kda_gate(
        g_shape,
        a_log.map(|(s, _)| s.iter().product()),
        dt_bias.map(|(s, _)| s.iter().product()),
        lower_bound,
    )
}

fn meta(t: Option<&DeviceTensor>) -> Option<(&[usize], Dtype)> {
    t.map(|t| (t.shape(), t.dtype()))
}

/// Validates `g` and the side inputs; returns `(B, T, HV, K)` and the kernel's gate struct.
fn gate_args(
    gpu: &Gpu,
    g: &DeviceTensor,
    side: &GateInputs<'_>,
    lower_bound: Option<f64>,
) -> GpuResult<((usize, usize, usize, usize), GateArgs)> {
    let dims = check_kda_gate(
        g.shape(),
        g.dtype(),
        meta(side.a_log),
        meta(side.dt_bias),
        lower_bound,
    )?;
    let args = GateArgs {
        a_log: side.a_log.map_or(0, |t| t.ptr(gpu)),
        dt_bias: side.dt_bias.map_or(0, |t| t.ptr(gpu)),
        a_log_dtype: side.a_log.map_or(-1, |t| dtype_code(t.dtype())),
        dt_bias_dtype: side.dt_bias.map_or(-1, |t| dtype_code(t.dtype())),
        has_lower_bound: lower_bound.is_some() as i64,
        lower_bound: lower_bound.unwrap_or(0.0),
        head_dim: dims.3.max(1) as i64,
    };
    Ok((dims, args))
}

/// `kda_gate(g, A_log, dt_bias, lower_bound)` into a new float32 tensor.
pub fn kda_gate(
    gpu: &Gpu,
    g: &DeviceTensor,
    side: &GateInputs<'_>,
    lower_bound: Option<f64>,
) -> GpuResult<DeviceTensor> {
    gate_args(gpu, g, side, lower_bound)?;
    let mut y = DeviceTensor::alloc(gpu, g.shape(), Dtype::F32)?;
    kda_gate_into(gpu, g, side, lower_bound, &mut y)?;
    Ok(y)
}

/// `kda_gate` written into `y` (float32, shape of `g`).
pub fn kda_gate_into(
    gpu: &Gpu,
    g: &DeviceTensor,
    side: &GateInputs<'_>,
    lower_bound: Option<f64>,
    y: &mut DeviceTensor,
) -> GpuResult<()> {
    let ((_, _, hv, k), gate) = gate_args(gpu, g, side, lower_bound)?;
    if y.dtype() != Dtype::F32 {
        return Err(Error::dtype("y", "float32", y.dtype().name()).into());
    }
    if y.shape() != g.shape() {
        return Err(Error::shape("y", format!("the shape of g {:?}", g.shape()), y.shape()).into());
    }
    let cols = hv * k;
    let rows = g.numel() / cols.max(1);
    if g.numel() == 0 {
        return Ok(());
    }
    // a vector's columns share one head (one A_log factor): widths dividing K
    let vec = widths(g.dtype(), Dtype::F32, k)[0];
    let name = format!("kda_gate_v{vec}_{}", tag(g.dtype()));
    let args = GateElemArgs {
        x: g.ptr(gpu),
        y: y.ptr_mut(gpu),
        rows: rows as i64,
        cols: cols as i64,
        gate,
    };
    // x: the column blocks; y: a block per GATE_ROWS (4) rows, up to the grid's limit
    let gx = (cols / vec).div_ceil(256);
    let gy = rows.div_ceil(4).clamp(1, 65535);
    gpu.launch(Module::KdaGate, &name, (gx as u32, gy as u32), 256, &args)
}

/// `kda_gate_chunk_cumsum` into a new tensor of `output_dtype` (`None`: `g`'s dtype; the
/// spec's default is float32).
pub fn kda_gate_chunk_cumsum(
    gpu: &Gpu,
    g: &DeviceTensor,
    side: &GateInputs<'_>,
    cu_seqlens: Option<&[i64]>,
    params: &KdaGateChunkCumsumParams,
    output_dtype: Option<Dtype>,
) -> GpuResult<DeviceTensor> {
    gate_args(gpu, g, side, params.lower_bound)?;
    validate_seq_scan(g.shape(), cu_seqlens, Some(params.chunk_size))?;
    let mut o = DeviceTensor::alloc(gpu, g.shape(), scan_output_dtype(g.dtype(), output_dtype)?)?;
    kda_gate_chunk_cumsum_into(gpu, g, side, cu_seqlens, params, &mut o)?;
    Ok(o)
}

/// `kda_gate_chunk_cumsum` written into `o` (shape of `g`; float32, float64 or `g`'s dtype).
pub fn kda_gate_chunk_cumsum_into(
    gpu: &Gpu,
    g: &DeviceTensor,
    side: &GateInputs<'_>,
    cu_seqlens: Option<&[i64]>,
    params: &KdaGateChunkCumsumParams,
    o: &mut DeviceTensor,
) -> GpuResult<()> {
    let ((_, _, hv, k), gate) = gate_args(gpu, g, side, params.lower_bound)?;
    let plan = validate_seq_scan(g.shape(), cu_seqlens, Some(params.chunk_size))?;
    check_out(g.shape(), g.dtype(), o.shape(), o.dtype())?;
    let jobs = Jobs::for_plan(
        &plan,
        cu_seqlens.is_some(),
        Some(params.chunk_size as usize),
    );
    launch_strided(
        gpu,
        Module::KdaGateChunkCumsum,
        g,
        o,
        hv * k,
        &jobs,
        params.reverse,
        params.scale,
        gate,
    )
}
