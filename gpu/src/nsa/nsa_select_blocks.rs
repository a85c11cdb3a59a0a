//! `nsa_select_blocks` on the GPU (`conformance/spec/ops-nsa.md` §4), both modes, scores in fp32
//! (fp64 for fp64) from exact products of the inputs:
//! - `"fla"`: per token and KV head, `score[c] = (1/G) sum_g softmax_c(scale q[t, hG+g] · k_cmp[c, h])`
//!   over the complete blocks `c < NC`, 1 for the forced blocks `{0, IC-1, IC}`, the top
//!   `min(n_sel, IC + 1)` candidates `0..=IC` by (score desc, index asc), then `-1` up to `S`;
//! - `"mslk_tile_mean"`: per query tile and query head, `s[j] = scale qbar · k_cmp[j, hq/G]`
//!   (`-inf` where not allowed), the top `S_m`, `-inf` entries and phantoms as block 0, sorted.
//!
//! `"fla"` on bf16/f16 with `G` and `K` multiples of 16 (`G * K <= 4096`) runs the logits on
//! tensor cores (`mma.sync`, fp32 accumulation of exact products); other shapes and fp32/fp64 on
//! CUDA cores.
//!
//! Kernel limits (typed errors): `S` (resp. `S_m`) `<= 32`, naming `block_counts`; the `G`
//! query rows of one token in 48 KiB of shared memory (`G * K * sizeof <= 48 KiB`), naming `q`.
//! The reference has none.

use super::{acc_dtype, check_rank, check_same_dtype, prefix_offsets, token_offsets};
use crate::device::Gpu;
use crate::error::GpuResult;
use crate::kernels::Module;
use crate::params::tag;
use crate::tensor::DeviceTensor;
use attn_reference::nsa::nsa_compression_attention::check_cmp_shapes;
use attn_reference::nsa::{check_block_size, check_scale, BlockCounts, CmpLayout, SelectMode};
use attn_reference::{Dtype, Error};
use cudarc::driver::DeviceRepr;

/// Largest slot count of a selection row on the GPU.
pub const MAX_SLOTS: usize = 32;
/// Shared memory a block may use without opting in.
const SMEM: usize = 48 * 1024;

/// `q` `[B, T, HQ, K]` and `k_cmp` (the mode's layout), one float dtype.
#[derive(Debug, Clone, Copy)]
pub struct SelectInputs<'a> {
    pub q: &'a DeviceTensor,
    pub k_cmp: &'a DeviceTensor,
}

/// Mirror of `SelectArgs` (nsa_select_blocks.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct SelectArgs {
    q: u64,
    k_cmp: u64,
    cu: u64,
    cmp: u64,
    tiles: u64,
    counts: u64,
    out: u64,
    nseq: i64,
    rows: i64,
    hq: i64,
    h: i64,
    k: i64,
    bs: i64,
    s: i64,
    n_sel: i64,
    qt: i64,
    causal: i64,
    scale: f64,
}
// SAFETY: plain `#[repr(C)]` data matching the kernel's struct.
unsafe impl DeviceRepr for SelectArgs {}

/// The tensor-core kernel of mode `"fla"` for `K` features and `G` query heads per KV head:
/// `(K / 16, G / 16)` when instantiated (`nsa_select_blocks.cu`: the query fragments of one
/// token stay in at most 64 registers), else `None` (the CUDA-core kernel serves).
fn mma_tiles(k: usize, g: usize) -> Option<(usize, usize)> {
    let (ks, mg) = (k / 16, g / 16);
    let built = [(4, 1), (8, 1), (16, 1), (4, 2), (8, 2), (4, 4)];
    (k % 16 == 0 && g % 16 == 0 && built.contains(&(ks, mg))).then_some((ks, mg))
}

/// A validated call.
pub(super) struct Plan {
    layout: CmpLayout,
    g: usize,
    scale: f64,
    /// Slots per row (`S` or `S_m`).
    s: usize,
    pub out_shape: Vec<usize>,
    /// Query tiles per sequence (`"mslk_tile_mean"`).
    tiles: Vec<usize>,
}

#[allow(clippy::too_many_arguments)]
pub(super) fn plan(
    x: &SelectInputs<'_>,
    block_counts: Option<BlockCounts<'_>>,
    cu_seqlens: Option<&[i64]>,
    block_size: i64,
    scale: Option<f64>,
    mode: SelectMode,
    q_tile_size: i64,
    causal: bool,
) -> GpuResult<Plan> {
    check_rank("q", x.q, 4, "[B, T, HQ, K]")?;
    check_rank("k_cmp", x.k_cmp, 4, "[B, TC, H, K]")?;
    check_same_dtype("k_cmp", x.k_cmp, "q", x.q.dtype())?;
    let bs = check_block_size(block_size)?;
    let qs = x.q.shape();
    let (b, t, hq, kd) = (qs[0], qs[1], qs[2], qs[3]);
    let (partial, rule) = mode.blocks();
    let layout = CmpLayout::new(b, t, cu_seqlens, bs, partial)?;
    let g = check_cmp_shapes(qs, x.k_cmp.shape(), None, &layout, rule)?;
    let h = x.k_cmp.shape()[2];
    let scale = check_scale::<f64>(scale, kd)?;
    if let Some(BlockCounts::Int(n)) = block_counts {
        if n < 1 {
            return Err(Error::param("block_counts", "an integer >= 1", n).into());
        }
    }
    let counts = block_counts.unwrap_or(BlockCounts::Int(16));
    let w = layout.tc.iter().copied().max().unwrap_or(0);
    let (s, out_shape, tiles) = match mode {
        SelectMode::Fla => {
            if !causal {
                return Err(
                    Error::param("causal", "true (mode \"fla\" is always causal)", false).into(),
                );
            }
            counts.check_tensor([b, t, h], None)?;
            let s = match counts {
                BlockCounts::Int(n) => n as usize,
                BlockCounts::Tensor(c) => c.iter().copied().max().unwrap_or(0).max(0) as usize,
            };
            let row =
                g * kd * x.q.dtype().size_bytes() + g * acc_dtype(x.q.dtype()).size_bytes() + 16;
            if row > SMEM {
                return Err(Error::shape(
                    "q",
                    format!(
                        "G * K * {} bytes <= 48 KiB (the GPU kernel's limit), G = {g}",
                        x.q.dtype().size_bytes()
                    ),
                    qs,
                )
                .into());
            }
            (s, vec![b, t, h, s], Vec::new())
        }
        SelectMode::MslkTileMean => {
            let BlockCounts::Int(count) = counts else {
                return Err(Error::missing(
                    "block_counts",
                    "an integer block_counts in mode \"mslk_tile_mean\"",
                    "a tensor",
                )
                .into());
            };
            if q_tile_size < 1 {
                return Err(Error::param("q_tile_size", "an integer >= 1", q_tile_size).into());
            }
            let qt = q_tile_size as usize;
            if let Some(seq) = layout.seqs.iter().find(|s| s.len() % qt != 0) {
                return Err(Error::param(
                    "q_tile_size",
                    "a divisor of every sequence length (mode \"mslk_tile_mean\")",
                    format!("{qt}; sequence {} has length {}", seq.n, seq.len()),
                )
                .into());
            }
            let s = (count as usize).min(w);
            let tiles: Vec<usize> = layout.seqs.iter().map(|s| s.len() / qt).collect();
            let out_shape = if layout.varlen {
                vec![1, tiles.iter().sum(), hq, s]
            } else {
                vec![b, t / qt, hq, s]
            };
            (s, out_shape, tiles)
        }
    };
    if s > MAX_SLOTS {
        return Err(Error::param(
            "block_counts",
            format!("at most {MAX_SLOTS} slots per row (the GPU kernel's limit)"),
            s,
        )
        .into());
    }
    Ok(Plan {
        layout,
        g,
        scale,
        s,
        out_shape,
        tiles,
    })
}

/// `block_indices = nsa_select_blocks(q, k_cmp, block_counts, ...)` into a new int32 tensor
/// (`block_counts` as the integer or the host `[B, T, H]` tensor, default 16).
#[allow(clippy::too_many_arguments)]
pub fn nsa_select_blocks(
    gpu: &Gpu,
    x: &SelectInputs<'_>,
    block_counts: Option<BlockCounts<'_>>,
    cu_seqlens: Option<&[i64]>,
    block_size: i64,
    scale: Option<f64>,
    mode: SelectMode,
    q_tile_size: i64,
    causal: bool,
) -> GpuResult<DeviceTensor> {
    let p = plan(
        x,
        block_counts,
        cu_seqlens,
        block_size,
        scale,
        mode,
        q_tile_size,
        causal,
    )?;
    let mut out = DeviceTensor::alloc(gpu, &p.out_shape, Dtype::I32)?;
    launch(
        gpu,
        x,
        &p,
        block_counts,
        mode,
        q_tile_size,
        causal,
        &mut out,
    )?;
    Ok(out)
}

/// [`nsa_select_blocks`] written into `block_indices` (int32, the shape it allocates).
#[allow(clippy::too_many_arguments)]
pub fn nsa_select_blocks_into(
    gpu: &Gpu,
    x: &SelectInputs<'_>,
    block_counts: Option<BlockCounts<'_>>,
    cu_seqlens: Option<&[i64]>,
    block_size: i64,
    scale: Option<f64>,
    mode: SelectMode,
    q_tile_size: i64,
    causal: bool,
    block_indices: &mut DeviceTensor,
) -> GpuResult<()> {
    let p = plan(
        x,
        block_counts,
        cu_seqlens,
        block_size,
        scale,
        mode,
        q_tile_size,
        causal,
    )?;
    if block_indices.shape() != p.out_shape.as_slice() {
        return Err(Error::shape(
            "block_indices",
            format!("{:?}", p.out_shape),
            block_indices.shape(),
        )
        .into());
    }
    if block_indices.dtype() != Dtype::I32 {
        return Err(Error::dtype("block_indices", "int32", block_indices.dtype().name()).into());
    }
    launch(
        gpu,
        x,
        &p,
        block_counts,
        mode,
        q_tile_size,
        causal,
        block_indices,
    )
}

/// Launches a validated call into `block_indices` (int32, of the plan's shape).
#[allow(clippy::too_many_arguments)]
fn launch(
    gpu: &Gpu,
    x: &SelectInputs<'_>,
    p: &Plan,
    block_counts: Option<BlockCounts<'_>>,
    mode: SelectMode,
    q_tile_size: i64,
    causal: bool,
    block_indices: &mut DeviceTensor,
) -> GpuResult<()> {
    if block_indices.numel() == 0 {
        return Ok(());
    }
    let dtype = x.q.dtype();
    let (t, hq, kd) = (x.q.shape()[1], x.q.shape()[2], x.q.shape()[3]);
    let h = x.k_cmp.shape()[2];
    let cu = token_offsets(gpu, &p.layout.seqs, t)?;
    let cmp = prefix_offsets(gpu, p.layout.tc.iter().copied())?;
    let counts = match block_counts {
        Some(BlockCounts::Tensor(c)) => Some(DeviceTensor::from_array(gpu, c.into_dyn())?),
        _ => None,
    };
    let mut args = SelectArgs {
        q: x.q.ptr(gpu),
        k_cmp: x.k_cmp.ptr(gpu),
        cu: cu.ptr(gpu),
        cmp: cmp.ptr(gpu),
        counts: counts.as_ref().map_or(0, |c| c.ptr(gpu)),
        out: block_indices.ptr_mut(gpu),
        nseq: p.layout.seqs.len() as i64,
        hq: hq as i64,
        h: h as i64,
        k: kd as i64,
        bs: p.layout.bs as i64,
        s: p.s as i64,
        n_sel: match block_counts {
            Some(BlockCounts::Int(n)) => n,
            _ => 16,
        },
        qt: q_tile_size,
        causal: causal as i64,
        scale: p.scale,
        ..Default::default()
    };
    let module = Module::NsaSelectBlocks;
    let acc = acc_dtype(dtype).size_bytes();
    match mode {
        SelectMode::Fla => {
            let rows = block_indices.shape()[0] * t;
            args.rows = rows as i64;
            let half = matches!(dtype, Dtype::BF16 | Dtype::F16);
            if let Some((ks, mg)) = mma_tiles(kd, p.g).filter(|_| half) {
                // tensor cores: 8 warps of consecutive tokens of one head per block
                let name = format!("nsa_select_blocks_fla_mma_k{ks}_m{mg}_{}", tag(dtype));
                let grid = (rows.div_ceil(8) as u32, h as u32);
                return gpu.launch(module, &name, grid, 256, &args);
            }
            // warps of consecutive tokens of one head per block, as many as shared memory holds
            let per_warp = p.g * kd * dtype.size_bytes() + p.g * acc;
            let wpb = (SMEM.saturating_sub(16) / per_warp).clamp(1, 8);
            let smem = (wpb * p.g * acc).next_multiple_of(16) + wpb * p.g * kd * dtype.size_bytes();
            let name = format!("nsa_select_blocks_fla_{}", tag(dtype));
            let grid = (rows.div_ceil(wpb) as u32, h as u32);
            gpu.launch_with_smem(module, &name, grid, (wpb * 32) as u32, smem as u32, &args)
        }
        SelectMode::MslkTileMean => {
            let tiles = prefix_offsets(gpu, p.tiles.iter().copied())?;
            args.tiles = tiles.ptr(gpu);
            let rows: usize = p.tiles.iter().sum();
            args.rows = rows as i64;
            let wpb = 8;
            let smem = wpb * kd * acc;
            let name = format!("nsa_select_blocks_tile_mean_{}", tag(dtype));
            gpu.launch_with_smem(
                module,
                &name,
                (rows.div_ceil(wpb) as u32, hq as u32),
                (wpb * 32) as u32,
                smem as u32,
                &args,
            )
        }
    }
}
