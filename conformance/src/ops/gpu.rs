//! GPU runners of the scan and gate ops: the case's inputs are uploaded in their own dtypes,
//! the `attn-gpu` kernel runs, and its output comes back in the dtype the op's parameters ask
//! for (`output_dtype`; `null` keeps the input's). Index inputs (`cu_seqlens`) stay on the host.

use super::{input, opt_indices};
use crate::case::Tensors;
use crate::error::Problem;
use crate::params::Params;
use crate::tensor::Tensor;
use attn_gpu::{DeviceTensor, GateInputs, Gpu, GpuError};
use attn_reference::gate::KdaGateChunkCumsumParams;
use attn_reference::{Dtype, Error};
use std::str::FromStr;

impl From<GpuError> for Problem {
    fn from(e: GpuError) -> Problem {
        match e {
            GpuError::Input(e) => Problem::Reference(e),
            GpuError::Unavailable(why) => Problem::NoGpu(why),
            other => Problem::Device(other.to_string()),
        }
    }
}

/// Whether a GPU answers here; `Err` says why not.
pub fn status() -> Result<(), String> {
    Gpu::shared().map(|_| ()).map_err(|e| e.to_string())
}

fn gpu() -> Result<&'static Gpu, Problem> {
    Ok(Gpu::shared()?)
}

fn upload(gpu: &Gpu, t: &Tensor) -> Result<DeviceTensor, Problem> {
    Ok(match t {
        Tensor::F64(a) => DeviceTensor::from_array(gpu, a.view()),
        Tensor::F32(a) => DeviceTensor::from_array(gpu, a.view()),
        Tensor::BF16(a) => DeviceTensor::from_array(gpu, a.view()),
        Tensor::F16(a) => DeviceTensor::from_array(gpu, a.view()),
        Tensor::I32(a) => DeviceTensor::from_array(gpu, a.view()),
        Tensor::I64(a) => DeviceTensor::from_array(gpu, a.view()),
    }?)
}

fn opt_upload(gpu: &Gpu, inputs: &Tensors, name: &str) -> Result<Option<DeviceTensor>, Problem> {
    inputs.get(name).map(|t| upload(gpu, t)).transpose()
}

fn download(gpu: &Gpu, t: &DeviceTensor) -> Result<Tensor, Problem> {
    Ok(match t.dtype() {
        Dtype::F64 => Tensor::F64(t.to_array(gpu)?),
        Dtype::F32 => Tensor::F32(t.to_array(gpu)?),
        Dtype::BF16 => Tensor::BF16(t.to_array(gpu)?),
        Dtype::F16 => Tensor::F16(t.to_array(gpu)?),
        Dtype::I32 => Tensor::I32(t.to_array(gpu)?),
        Dtype::I64 => Tensor::I64(t.to_array(gpu)?),
    })
}

/// The `output_dtype` parameter (`None` for `null`: the input's dtype).
fn output_dtype(p: &Params) -> Result<Option<Dtype>, Problem> {
    p.opt_str("output_dtype")?
        .map(|s| {
            Dtype::from_str(s)
                .map_err(|_| Error::param("output_dtype", "float32 or float64", s).into())
        })
        .transpose()
}

fn one(name: &str, t: Tensor) -> Tensors {
    Tensors::from([(name.to_string(), t)])
}

/// `cumsum` on the GPU.
pub fn cumsum(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    let gpu = gpu()?;
    let x = upload(gpu, input(inputs, "x")?)?;
    let y = attn_gpu::cumsum(gpu, &x, p.int("dim")?, p.bool("reverse")?, output_dtype(p)?)?;
    Ok(one("y", download(gpu, &y)?))
}

/// `chunk_local_cumsum` on the GPU.
pub fn chunk_local_cumsum(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    let gpu = gpu()?;
    let g = upload(gpu, input(inputs, "g")?)?;
    let cu = opt_indices(inputs, "cu_seqlens")?;
    let o = attn_gpu::chunk_local_cumsum(
        gpu,
        &g,
        cu.as_deref(),
        p.int("chunk_size")?,
        p.bool("reverse")?,
        p.opt_f64("scale")?,
        output_dtype(p)?,
    )?;
    Ok(one("o", download(gpu, &o)?))
}

/// `chunk_global_cumsum` on the GPU.
pub fn chunk_global_cumsum(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    let gpu = gpu()?;
    let g = upload(gpu, input(inputs, "g")?)?;
    let cu = opt_indices(inputs, "cu_seqlens")?;
    let o = attn_gpu::chunk_global_cumsum(
        gpu,
        &g,
        cu.as_deref(),
        p.bool("reverse")?,
        p.opt_f64("scale")?,
        output_dtype(p)?,
    )?;
    Ok(one("o", download(gpu, &o)?))
}

/// `kda_gate` on the GPU (float32 output).
pub fn kda_gate(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    let gpu = gpu()?;
    let g = upload(gpu, input(inputs, "g")?)?;
    let a_log = opt_upload(gpu, inputs, "A_log")?;
    let dt_bias = opt_upload(gpu, inputs, "dt_bias")?;
    let side = GateInputs {
        a_log: a_log.as_ref(),
        dt_bias: dt_bias.as_ref(),
    };
    let y = attn_gpu::kda_gate(gpu, &g, &side, p.opt_f64("lower_bound")?)?;
    Ok(one("y", download(gpu, &y)?))
}

/// `kda_gate_chunk_cumsum` on the GPU (the fused kernel).
pub fn kda_gate_chunk_cumsum(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    let gpu = gpu()?;
    let g = upload(gpu, input(inputs, "g")?)?;
    let a_log = opt_upload(gpu, inputs, "A_log")?;
    let dt_bias = opt_upload(gpu, inputs, "dt_bias")?;
    let cu = opt_indices(inputs, "cu_seqlens")?;
    let side = GateInputs {
        a_log: a_log.as_ref(),
        dt_bias: dt_bias.as_ref(),
    };
    let params = KdaGateChunkCumsumParams {
        chunk_size: p.int("chunk_size")?,
        scale: p.opt_f64("scale")?,
        lower_bound: p.opt_f64("lower_bound")?,
        reverse: p.bool("reverse")?,
    };
    let o =
        attn_gpu::kda_gate_chunk_cumsum(gpu, &g, &side, cu.as_deref(), &params, output_dtype(p)?)?;
    Ok(one("o", download(gpu, &o)?))
}
