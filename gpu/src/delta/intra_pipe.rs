//! The persistent KDA intra kernel `kda_intra_pipe` (`kda_intra_pipe.cu`; design:
//! `tools/bench-results/s15_6_study_kda_intra.md` §3): the fused KDA path's intra stage for
//! bf16, `K = V = 128`, chunk 64, an fp32 `g` (the per-step decay, or the input of the in-kernel
//! gate) with `safe_gate`, optionally `G` per token (context parallelism's first half), computing what
//! `kda_intra_mma_fast_bf16` computes (the same outputs, layouts and rounding points) on a fixed
//! grid of CTAs that each walk items (chunk, value head) `b, b + grid, …` while the next item's
//! `q, k, g` arrive by `cp.async`.

use super::intra::IntraArgs;
use crate::device::Gpu;
use crate::error::GpuResult;
use crate::kernels::Module;
use crate::params::dtype_code;
use attn_reference::{Dtype, Error};
use cudarc::driver::DeviceRepr;

/// Threads per CTA (`PIPE_THREADS`).
const THREADS: u32 = 256;
/// Dynamic shared memory per CTA (`PIPE_SMEM`): two CTAs fit a Hopper multiprocessor.
const SMEM: u32 = 105_728;
/// CTAs per multiprocessor of the default grid.
pub(crate) const CTAS_PER_SM: usize = 2;

/// Mirror of `PipeArgs` (kda_intra_pipe.cu): the call and its number of items.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct PipeArgs {
    a: IntraArgs,
    items: i64,
}
// SAFETY: plain `#[repr(C)]` data (every field 8 bytes) matching the kernel's struct.
unsafe impl DeviceRepr for PipeArgs {}

/// Whether the pipe kernel serves the intra call `a` of `dtype` data: bf16, `K = V = 128`,
/// chunk 64, an fp32 `g` that is either the per-step natural-log decay (`gate_mode` 1) or the
/// input of the KDA gate computed in the kernel (`gate_mode` 2, its lower-bound form, which
/// `safe_gate` implies), `safe_gate`, and the fused path's outputs (gated `kg`, optionally `G`
/// per token through `gout`; no `Akk`, no lean tiles).
pub(crate) fn accepts(dtype: Dtype, a: &IntraArgs) -> bool {
    dtype == Dtype::BF16
        && a.k_dim == 128
        && a.v_dim == 128
        && a.bt == 64
        && (a.gate_mode == 1 || (a.gate_mode == 2 && a.gate.has_lower_bound != 0))
        && a.g_dtype == dtype_code(Dtype::F32)
        && a.safe_gate != 0
        && a.scalar_gate == 0
        && a.kg_gated != 0
        && a.akk == 0
        && a.tbh == 0
        && a.tbl == 0
        && [a.w, a.u, a.kg, a.qg, a.qf, a.aqk, a.lam]
            .iter()
            .all(|&p| p != 0)
}

/// The default grid on `gpu`: up to [`CTAS_PER_SM`] CTAs per multiprocessor, as many as its
/// shared memory holds; `None` where one CTA's [`SMEM`] exceeds what a block may opt in to (the
/// plan then keeps today's kernel).
pub(crate) fn default_grid(gpu: &Gpu) -> Option<usize> {
    use cudarc::driver::sys::CUdevice_attribute as A;
    let attr = |a| gpu.context().attribute(a).ok().map(|v| v.max(0) as usize);
    let per_block = attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?;
    let per_sm = attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)?;
    // each resident block also holds 1 KiB the driver reserves
    let ctas = per_sm / (SMEM as usize + 1024);
    (per_block >= SMEM as usize && ctas > 0).then(|| ctas.min(CTAS_PER_SM) * gpu.sm_count().max(1))
}

/// One launch over `chunks` chunks and `hv` value heads on `grid` CTAs (any grid is correct:
/// the items are strided over it; more CTAs than items launch only the items).
pub(crate) fn launch(
    gpu: &Gpu,
    chunks: usize,
    hv: usize,
    grid: usize,
    args: &IntraArgs,
) -> GpuResult<()> {
    let items = chunks * hv;
    if items == 0 {
        return Ok(());
    }
    let ctas = grid.clamp(1, items);
    // the kernel counts items in 32-bit integers, up to items + grid
    if items + ctas > i32::MAX as usize {
        return Err(Error::shape(
            "q",
            "(chunk, value head) items + CTAs below 2^31",
            vec![chunks, hv],
        )
        .into());
    }
    let pa = PipeArgs {
        a: *args,
        items: items as i64,
    };
    gpu.launch_with_smem(
        Module::KdaIntraPipe,
        "kda_intra_pipe_bf16",
        (ctas as u32, 1),
        THREADS,
        SMEM,
        &pa,
    )
}
