//! The persistent KDA intra kernel `kda_intra_pipe` (`kda_intra_pipe.cu`; design:
//! `tools/bench-results/s15_6_study_kda_intra.md` §3): the KDA intra stage of the fused path and
//! of the staged path (the exact fallback's twin, `s17_6_study_fallback_pipe.md`) for bf16,
//! `K = V = 128`, chunk 64, an fp32 `g` (the per-step decay, or the input of the in-kernel
//! gate), `lam` where the call passes it (the fused path; the staged path passes none),
//! optionally `G` per token (context parallelism's first half; the staged path's gate tiles),
//! computing what `kda_intra_mma_fast_bf16` computes (the same outputs, layouts and rounding
//! points) on a fixed grid of CTAs that each walk items (chunk, value head) `b, b + grid, …`
//! while the next item's `q, k, g` arrive by `cp.async`.
//!
//! Two entry points, chosen per call by `safe_gate`. With it (`kda_intra_pipe_bf16`) every 16 × 16
//! block of `Aqk` and `L` is a tensor-core product of factors `q̂, k̂ · exp2(G_r − G_m)` and
//! `k̂_j · exp2(G_m − G_j)` (`m` the row block's first row), the latter bounded by `2^109` on the
//! diagonal only because every step is in `[−5, 0]`. Without it (`kda_intra_pipe_fma_bf16`: the
//! trained gate `−exp(A_log) · softplus(x + dt_bias)` in the kernel, or any given `g`) the six
//! blocks below the diagonal keep those products (both factors `≤ 1` for any gate) and the four
//! diagonal blocks are fp32 FMAs, as `kda_intra_mma*`'s path without `safe_gate`:
//! `Aqk_rj = scale Σ_d q̂_rd e_rd`, `L_rj = β_r Σ_d k̂_rd e_rd` with the running product
//! `e_jd = k̂_jd`, `e_rd = e_(r−1)d · exp2(G_rd − G_(r−1)d)` (each step `≤ 1`).

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
const SMEM: u32 = 107_264;
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
/// input of the KDA gate computed in the kernel (`gate_mode` 2: with `safe_gate` its lower-bound
/// form, which `safe_gate` implies; without it either form), and the outputs of the fused or the
/// staged path: gated `kg`, `w, u, qg, qf, Aqk`; `lam` optional (the fused path passes it, the
/// staged path none: the kernel then skips its store); optionally `G` per token through `gout`;
/// no `Akk`, no lean tiles.
pub(crate) fn accepts(dtype: Dtype, a: &IntraArgs) -> bool {
    dtype == Dtype::BF16
        && a.k_dim == 128
        && a.v_dim == 128
        && a.bt == 64
        && (a.gate_mode == 1
            || (a.gate_mode == 2 && (a.safe_gate == 0 || a.gate.has_lower_bound != 0)))
        && a.g_dtype == dtype_code(Dtype::F32)
        && a.scalar_gate == 0
        && a.kg_gated != 0
        && a.akk == 0
        && a.tbh == 0
        && a.tbl == 0
        && [a.w, a.u, a.kg, a.qg, a.qf, a.aqk].iter().all(|&p| p != 0)
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

/// The entry point of the call `a`: every block on tensor cores with `safe_gate`, the diagonal
/// blocks by FMAs without it.
fn kernel_name(a: &IntraArgs) -> &'static str {
    if a.safe_gate != 0 {
        "kda_intra_pipe_bf16"
    } else {
        "kda_intra_pipe_fma_bf16"
    }
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
        kernel_name(args),
        (ctas as u32, 1),
        THREADS,
        SMEM,
        &pa,
    )
}
