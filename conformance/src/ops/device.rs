//! The device plumbing the GPU runners of every family share: whether a GPU answers, uploading a
//! case's tensors in their own dtypes, downloading outputs, and mapping `attn-gpu` errors onto
//! [`Problem`]. Index inputs (`cu_seqlens`) stay on the host unless a runner uploads them.
//!
//! For the context-parallel runners (`verify --gpus N`): the group of `N` GPUs ([`cp_group`],
//! opened once per thread) and a case's tensors as the host tensors of `attn_gpu::cp::host`
//! ([`host`], [`from_host`]).

use crate::case::Tensors;
use crate::error::Problem;
use crate::params::Params;
use crate::tensor::Tensor;
use attn_gpu::cp::{CpGroup, HostTensor};
use attn_gpu::{DeviceTensor, Gpu, GpuError};
use attn_reference::{Dtype, Error};
use std::cell::RefCell;
use std::rc::Rc;
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

/// The smallest piece of a sequence the context-parallel runners leave on one rank, in chunks:
/// 1, so that a case's sequences are cut across ranks even when short (the exactness of the
/// boundary merge is what `--gpus` checks); the ops' own default
/// (`attn_gpu::cp::DEFAULT_MIN_PIECE_CHUNKS`) keeps sequences under 32 chunks whole.
pub const CP_MIN_PIECE_CHUNKS: usize = 1;

thread_local! {
    /// This thread's context-parallel group (NCCL communicators take seconds to set up).
    static GROUP: RefCell<Option<Rc<CpGroup>>> = const { RefCell::new(None) };
}

/// The group of GPUs `0 .. gpus` of this host (one NCCL communicator each), opened on this
/// thread's first call and kept while `gpus` stays the same. Errors name `gpus` (0, or more than
/// the host's GPUs), or say why no GPU or no NCCL library is usable ([`Problem::NoGpu`]).
pub fn cp_group(gpus: usize) -> Result<Rc<CpGroup>, Problem> {
    GROUP.with(|cell| {
        let mut held = cell.borrow_mut();
        if let Some(group) = held.as_ref().filter(|g| g.world() == gpus) {
            return Ok(group.clone());
        }
        // the communicators of another size go first
        *held = None;
        let group = Rc::new(CpGroup::open(gpus)?);
        *held = Some(group.clone());
        Ok(group)
    })
}

/// Float input `name` of a case, borrowed as a host tensor of the context-parallel calls.
pub fn host<'a>(inputs: &'a Tensors, name: &str) -> Result<HostTensor<'a>, Problem> {
    let t = inputs
        .get(name)
        .ok_or_else(|| Problem::MissingInput(name.into()))?;
    Ok(match t {
        Tensor::F64(a) => HostTensor::F64(a.view().into()),
        Tensor::F32(a) => HostTensor::F32(a.view().into()),
        Tensor::BF16(a) => HostTensor::BF16(a.view().into()),
        Tensor::F16(a) => HostTensor::F16(a.view().into()),
        Tensor::I32(_) | Tensor::I64(_) => {
            return Err(Error::dtype(name, "a float dtype", t.dtype().name()).into())
        }
    })
}

/// [`host`] of input `name` when the case has it.
pub fn opt_host<'a>(inputs: &'a Tensors, name: &str) -> Result<Option<HostTensor<'a>>, Problem> {
    inputs.get(name).map(|_| host(inputs, name)).transpose()
}

/// A gathered output as a case tensor, in its own dtype.
pub fn from_host(t: HostTensor<'_>) -> Tensor {
    match t {
        HostTensor::F64(a) => Tensor::F64(a.into_owned()),
        HostTensor::F32(a) => Tensor::F32(a.into_owned()),
        HostTensor::BF16(a) => Tensor::BF16(a.into_owned()),
        HostTensor::F16(a) => Tensor::F16(a.into_owned()),
    }
}

/// The named outputs that are present, as case tensors.
pub fn from_hosts(outputs: Vec<(&str, Option<HostTensor<'_>>)>) -> Tensors {
    outputs
        .into_iter()
        .filter_map(|(n, t)| t.map(|t| (n.to_string(), from_host(t))))
        .collect()
}
