//! The launch shared by the NSA attention branches (`nsa_attend.cuh`): the compressed blocks
//! (`nsa_compression_attention`), the selected blocks (`nsa_selection_attention`) and the
//! sliding window (`nsa_fwd`). For a token `t` and KV head `h` the keys are a multiset of row
//! ranges of `k` / `v`; each query head `hq = h*G + g` gets `lse = logsumexp_j z_j` and
//! `o = sum_j exp(z_j - lse) v[j]` with `z_j = scale * q[t, hq] · k[j, h]` (no key: `o = 0`,
//! `lse = empty_lse`).
//!
//! bf16/f16 with `(K, V)` in {(32, 32), (32, 64), (64, 32), (64, 64), (128, 128)} run on tensor cores (`mma.sync` m16n8k16,
//! fp32 accumulation): a warp per (token, KV head), the `G` query heads as the M dimension, so
//! each K/V tile is loaded once per group when `G <= 16` (once per 16 heads above). Every other
//! The compressed branch and the window with `G <= 16` share their staged rows among the 4
//! consecutive tokens of a block (their key ranges nearly coincide). Every other
//! shape and fp32/fp64 run on CUDA cores: a warp per (token, query head), fp32 (fp64) FMAs.
//!
//! Kernel limits (typed errors, checked by [`check_dims`]): `K <= 256` and `V <= 256`.

use super::acc_dtype;
use crate::device::Gpu;
use crate::error::GpuResult;
use crate::kernels::Module;
use crate::params::tag;
use crate::tensor::DeviceTensor;
use attn_reference::{Dtype, Error};
use cudarc::driver::DeviceRepr;

/// Largest `K` and `V` the attention kernels take.
pub const MAX_DIM: usize = 256;
/// Warps per block of the tensor-core kernel (`ATT_MMA_WARPS`).
const MMA_WARPS: usize = 4;
/// Warps per block of the CUDA-core kernel (`ATT_FMA_WARPS`).
const FMA_WARPS: usize = 8;
/// The `(K, V)` pairs built for tensor cores (`ATT_MMA_SHAPES`).
const MMA_SHAPES: [(usize, usize); 5] = [(32, 32), (32, 64), (64, 32), (64, 64), (128, 128)];

/// `K` (named by `k_arg`) and `V` (named by `v_arg`) within the kernels' limit.
pub(super) fn check_dims(
    k_arg: &str,
    k_shape: &[usize],
    v_arg: &str,
    v_shape: &[usize],
) -> attn_reference::Result<()> {
    for (arg, shape) in [(k_arg, k_shape), (v_arg, v_shape)] {
        if shape[3] > MAX_DIM {
            return Err(Error::shape(
                arg,
                format!("a feature dim <= {MAX_DIM} (the GPU attention kernels' limit)"),
                shape,
            ));
        }
    }
    Ok(())
}

/// Mirror of `AttendArgs` (nsa_attend.cuh).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct AttendArgs {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub cu: u64,
    pub cmp: u64,
    pub idx: u64,
    pub counts: u64,
    pub o: u64,
    pub lse: u64,
    pub nseq: i64,
    pub rows: i64,
    pub hq: i64,
    pub h: i64,
    pub kd: i64,
    pub vd: i64,
    pub bs: i64,
    pub s: i64,
    pub idx64: i64,
    pub mode: i64,
    pub empty_lse: f32,
    pub pad: f32,
    pub scale: f64,
}
// SAFETY: plain `#[repr(C)]` data matching the kernel's struct.
unsafe impl DeviceRepr for AttendArgs {}

/// The tensors of one launch: `q` `[.., HQ, K]` (rows = tokens), `k` `[.., H, K]`, `v`
/// `[.., H, V]`, outputs `o` `[.., HQ, V]` (`q`'s dtype) and optionally `lse` (float32).
pub(super) struct Launch<'a> {
    pub module: Module,
    /// Kernel name prefix (`ATT_KERNELS`' NAME).
    pub name: &'static str,
    pub q: &'a DeviceTensor,
    pub k: &'a DeviceTensor,
    pub v: &'a DeviceTensor,
    /// A one-range branch (compressed blocks, the window), whose consecutive tokens share
    /// their rows: with `G <= 16` on tensor cores a block stages the union of its 4 tokens'
    /// rows once (`_mma_shared_`).
    pub shared_rows: bool,
}

impl Launch<'_> {
    /// Fills the tensor pointers and dims of `args` and launches (nothing for zero tokens).
    pub fn run(
        &self,
        gpu: &Gpu,
        mut args: AttendArgs,
        o: &mut DeviceTensor,
        lse: Option<&mut DeviceTensor>,
    ) -> GpuResult<()> {
        let qs = self.q.shape();
        let (hq, kd) = (qs[2], qs[3]);
        let rows = qs[0] * qs[1];
        let (h, vd) = (self.k.shape()[2], self.v.shape()[3]);
        if rows == 0 || hq == 0 {
            return Ok(());
        }
        args.q = self.q.ptr(gpu);
        args.k = self.k.ptr(gpu);
        args.v = self.v.ptr(gpu);
        args.o = o.ptr_mut(gpu);
        args.lse = lse.map_or(0, |l| l.ptr_mut(gpu));
        args.rows = rows as i64;
        args.hq = hq as i64;
        args.h = h as i64;
        args.kd = kd as i64;
        args.vd = vd as i64;
        let dtype = self.q.dtype();
        let half = matches!(dtype, Dtype::BF16 | Dtype::F16);
        if half && MMA_SHAPES.contains(&(kd, vd)) {
            // two stages of 16 padded K and V rows, per warp or (shared rows) per block
            let stage = 2 * 16 * (kd + 8 + vd + 8) * dtype.size_bytes();
            let shared = self.shared_rows && hq / h <= 16;
            let (smem, kind) = if shared {
                (stage, "mma_shared")
            } else {
                (MMA_WARPS * stage, "mma")
            };
            let name = format!("{}_{kind}_k{kd}_v{vd}_{}", self.name, tag(dtype));
            let grid = (rows.div_ceil(MMA_WARPS) as u32, h as u32);
            return gpu.launch_with_smem(
                self.module,
                &name,
                grid,
                (MMA_WARPS * 32) as u32,
                smem as u32,
                &args,
            );
        }
        let smem = FMA_WARPS * kd * acc_dtype(dtype).size_bytes();
        let name = format!("{}_{}", self.name, tag(dtype));
        let grid = ((rows * hq).div_ceil(FMA_WARPS) as u32, 1);
        gpu.launch_with_smem(
            self.module,
            &name,
            grid,
            (FMA_WARPS * 32) as u32,
            smem as u32,
            &args,
        )
    }
}

/// Checks an output tensor's shape and dtype.
pub(super) fn check_out(
    arg: &str,
    t: &DeviceTensor,
    shape: &[usize],
    dtype: Dtype,
) -> attn_reference::Result<()> {
    if t.shape() != shape {
        return Err(Error::shape(arg, format!("{shape:?}"), t.shape()));
    }
    if t.dtype() != dtype {
        return Err(Error::dtype(arg, dtype.name(), t.dtype().name()));
    }
    Ok(())
}
