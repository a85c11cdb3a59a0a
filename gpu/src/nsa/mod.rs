//! Native sparse attention on the GPU (`conformance/spec/ops-nsa.md`): [`nsa_compress_kv`] (one
//! pass over `k` and `v`, varlen inside the kernel), [`nsa_gate_combine`], [`nsa_select_blocks`],
//! the two attention branches [`nsa_compression_attention`] and [`nsa_selection_attention`] (one
//! flash-style kernel family, `attend`), and the whole forward [`nsa_fwd`].
//!
//! Sequences are always handed to the kernels as packed rows with device offset arrays: fixed
//! length `[B, T, ...]` is the packing of `B` sequences of `T` tokens, so one launch serves any
//! batch. The host keeps `cu_seqlens` (it sizes the outputs) and uploads the offsets per call.
//! Validation follows the reference's rules and names the argument, before any launch.

mod attend;
mod nsa_compress_kv;
mod nsa_compression_attention;
mod nsa_fwd;
mod nsa_gate_combine;
mod nsa_select_blocks;
mod nsa_selection_attention;

pub use attend::MAX_DIM;
pub use nsa_compress_kv::{nsa_compress_kv, nsa_compress_kv_into, CompressInputs};
pub use nsa_compression_attention::{
    nsa_compression_attention, nsa_compression_attention_into, CmpAttnInputs, CmpAttnParams,
};
pub use nsa_fwd::{nsa_fwd, FwdInputs, FwdOut};
pub use nsa_gate_combine::{nsa_gate_combine, nsa_gate_combine_into, CombineInputs, GateForm};
pub use nsa_select_blocks::{nsa_select_blocks, nsa_select_blocks_into, SelectInputs};
pub use nsa_selection_attention::{
    nsa_selection_attention, nsa_selection_attention_into, SelAttnInputs,
};

use crate::device::Gpu;
use crate::error::GpuResult;
use crate::kernels::Module;
use crate::params::{check_float, dtype_code};
use crate::tensor::DeviceTensor;
use attn_reference::varlen::Seq;
use attn_reference::{Dtype, Error};
use cudarc::driver::DeviceRepr;

/// The accumulator dtype of a kernel on `d`: float64 for float64 data, float32 otherwise.
fn acc_dtype(d: Dtype) -> Dtype {
    if d == Dtype::F64 {
        Dtype::F64
    } else {
        Dtype::F32
    }
}

/// Checks that `t` is a float tensor of rank `rank` (`what` spells the expected shape).
fn check_rank(arg: &str, t: &DeviceTensor, rank: usize, what: &str) -> attn_reference::Result<()> {
    check_float(arg, t.dtype())?;
    if t.shape().len() != rank {
        return Err(Error::shape(arg, what, t.shape()));
    }
    Ok(())
}

/// Checks that `t` has `like`'s dtype (the sequence inputs of a call share one).
fn check_same_dtype(
    arg: &str,
    t: &DeviceTensor,
    like: &str,
    d: Dtype,
) -> attn_reference::Result<()> {
    if t.dtype() != d {
        return Err(Error::dtype(
            arg,
            format!("{like}'s dtype {}", d.name()),
            t.dtype().name(),
        ));
    }
    Ok(())
}

/// Token offsets of the sequences (`N + 1` entries) on the device.
fn token_offsets(gpu: &Gpu, seqs: &[Seq], t: usize) -> GpuResult<DeviceTensor> {
    let offs: Vec<i64> = std::iter::once(0)
        .chain(seqs.iter().map(|s| (s.batch * t + s.eos) as i64))
        .collect();
    DeviceTensor::from_slice(gpu, &offs)
}

/// Prefix sums of `counts` (`N + 1` entries) on the device.
fn prefix_offsets(gpu: &Gpu, counts: impl Iterator<Item = usize>) -> GpuResult<DeviceTensor> {
    let offs: Vec<i64> = std::iter::once(0)
        .chain(counts.scan(0i64, |acc, n| {
            *acc += n as i64;
            Some(*acc)
        }))
        .collect();
    DeviceTensor::from_slice(gpu, &offs)
}

/// Mirror of `WidenArgs` (nsa.cuh).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct WidenArgs {
    x: u64,
    y: u64,
    n: i64,
    dtype: i64,
}
// SAFETY: plain `#[repr(C)]` data matching the kernel's struct.
unsafe impl DeviceRepr for WidenArgs {}

/// A weight of any float dtype widened to `acc` (float32 or float64), in `module`.
fn widen_weight(
    gpu: &Gpu,
    module: Module,
    w: &DeviceTensor,
    acc: Dtype,
) -> GpuResult<DeviceTensor> {
    let mut y = DeviceTensor::alloc(gpu, w.shape(), acc)?;
    let n = w.numel();
    if n > 0 {
        let args = WidenArgs {
            x: w.ptr(gpu),
            y: y.ptr_mut(gpu),
            n: n as i64,
            dtype: dtype_code(w.dtype()),
        };
        let name = if acc == Dtype::F64 {
            "nsa_widen_f64"
        } else {
            "nsa_widen_f32"
        };
        gpu.launch(module, name, (n.div_ceil(256) as u32, 1), 256, &args)?;
    }
    Ok(y)
}
