//! The device plumbing the GPU runners of every family share: whether a GPU answers, uploading a
//! case's tensors in their own dtypes, downloading outputs, and mapping `attn-gpu` errors onto
//! [`Problem`]. Index inputs (`cu_seqlens`) stay on the host unless a runner uploads them.

use crate::case::Tensors;
use crate::error::Problem;
use crate::params::Params;
use crate::tensor::Tensor;
use attn_gpu::{DeviceTensor, Gpu, GpuError};
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

/// The process-wide GPU, or [`Problem::NoGpu`] saying why there is none.
pub fn gpu() -> Result<&'static Gpu, Problem> {
    Ok(Gpu::shared()?)
}

/// Copies a host tensor to the device in its own dtype.
pub fn upload(gpu: &Gpu, t: &Tensor) -> Result<DeviceTensor, Problem> {
    Ok(match t {
        Tensor::F64(a) => DeviceTensor::from_array(gpu, a.view()),
        Tensor::F32(a) => DeviceTensor::from_array(gpu, a.view()),
        Tensor::BF16(a) => DeviceTensor::from_array(gpu, a.view()),
        Tensor::F16(a) => DeviceTensor::from_array(gpu, a.view()),
        Tensor::I32(a) => DeviceTensor::from_array(gpu, a.view()),
        Tensor::I64(a) => DeviceTensor::from_array(gpu, a.view()),
    }?)
}

/// [`upload`]s input `name` when the case has it.
pub fn opt_upload(
    gpu: &Gpu,
    inputs: &Tensors,
    name: &str,
) -> Result<Option<DeviceTensor>, Problem> {
    inputs.get(name).map(|t| upload(gpu, t)).transpose()
}

/// Copies a device tensor back to the host in its own dtype.
pub fn download(gpu: &Gpu, t: &DeviceTensor) -> Result<Tensor, Problem> {
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
pub fn output_dtype(p: &Params) -> Result<Option<Dtype>, Problem> {
    p.opt_str("output_dtype")?
        .map(|s| {
            Dtype::from_str(s)
                .map_err(|_| Error::param("output_dtype", "float32 or float64", s).into())
        })
        .transpose()
}

/// One named output.
pub fn one(name: &str, t: Tensor) -> Tensors {
    Tensors::from([(name.to_string(), t)])
}
