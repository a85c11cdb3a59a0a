//! The launch side shared by `chunk_gated_delta_rule_fwd_h` and `fwd_h_pre_scan`: the kernel
//! choice (tensor-core tile sizes or the fp32 FMA kernel), the per-sequence table, and the
//! `#[repr(C)]` mirror of the kernels' `FwdHArgs` (fwd_h.cuh).

use crate::device::Gpu;
use crate::error::GpuResult;
use crate::kernels::Module;
use crate::params::dtype_code;
use crate::tensor::DeviceTensor;
use attn_reference::delta::Geometry;
use attn_reference::{Dtype, Error};
use cudarc::driver::DeviceRepr;

/// Mirror of `FwdHArgs` (fwd_h.cuh).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct FwdHArgs {
    pub k: u64,
    pub w: u64,
    pub u: u64,
    pub g: u64,
    pub gk: u64,
    pub h0: u64,
    pub seqs: u64,
    pub h: u64,
    pub v_new: u64,
    pub ht: u64,
    pub heads: i64,
    pub value_heads: i64,
    pub k_dim: i64,
    pub v_dim: i64,
    pub cols: i64,
    pub bt: i64,
    pub g_dtype: i64,
    pub gk_dtype: i64,
    pub h0_dtype: i64,
    pub v_first: i64,
    pub nb_b: i64,
    pub split: i64,
    /// `i64 [rows]` warm-up chunks per row (fwd_h.cuh `row_warmup`), 0 = none.
    pub warm: u64,
}
// SAFETY: plain `#[repr(C)]` data (every field 8 bytes) matching the kernel's struct.
unsafe impl DeviceRepr for FwdHArgs {}

/// Which kernel runs a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelChoice {
    /// Tensor cores: keys padded to `kp` (64, 128 or 256) rows, `bv` state columns per block.
    Mma { kp: usize, bv: usize },
    /// FMAs in the input's precision (IEEE fp32, or fp64), 32 state columns per block.
    Fma,
}

/// Columns per block of the FMA kernel (`FMA_BV`).
const FMA_BV: usize = 32;
/// Largest chunk (`FWDH_BT`).
const MAX_BT: usize = 64;

impl KernelChoice {
    /// State columns per block.
    pub fn bv(self) -> usize {
        match self {
            KernelChoice::Mma { bv, .. } => bv,
            KernelChoice::Fma => FMA_BV,
        }
    }

    /// Dynamic shared memory of the kernel for main data of `dtype` (the size of `MmaSmem` /
    /// `FmaSmem<Acc>`).
    pub fn smem_bytes(self, dtype: Dtype) -> usize {
        match self {
            KernelChoice::Mma { kp, bv } => {
                let (kpitch, vpitch) = (kp + 8, bv + 8);
                // chunk buffers (`MmaSmem::STAGES`)
                let st = if kp >= 256 { 2 } else { 3 };
                let tiles = st * 2 * MAX_BT * kpitch * 2 + st * MAX_BT * vpitch * 2;
                let gates = st * MAX_BT * 4 + st * kp * 4;
                let state = 2 * kp * vpitch * 2 + 2 * MAX_BT * vpitch * 2;
                tiles + gates + state
            }
            KernelChoice::Fma => {
                let p = FMA_BV + 1;
                let acc = if dtype == Dtype::F64 { 8 } else { 4 };
                (256 * p + MAX_BT * p + MAX_BT * 33 + MAX_BT + 256) * acc
            }
        }
    }

    fn kernel_name(self, op: &str, dtype: Dtype) -> String {
        match self {
            KernelChoice::Mma { kp, bv } => format!("{op}_mma_{}_k{kp}_v{bv}", dtype.name_tag()),
            KernelChoice::Fma => format!("{op}_fma_{}", dtype.name_tag()),
        }
    }
}

/// Short dtype tags of the kernel names.
trait NameTag {
    fn name_tag(self) -> &'static str;
}
impl NameTag for Dtype {
    fn name_tag(self) -> &'static str {
        match self {
            Dtype::BF16 => "bf16",
            Dtype::F16 => "f16",
            Dtype::F64 => "f64",
            _ => "f32",
        }
    }
}

/// The dtype of the fp32 outputs (`final_state`, `hm`): float64 for float64 main data (its
/// kernel computes in fp64), else float32.
pub fn state_dtype(main: Dtype) -> Dtype {
    if main == Dtype::F64 {
        Dtype::F64
    } else {
        Dtype::F32
    }
}

/// What the kernel choice needs to know of a call: the main dtype, `K`, the state columns of
/// each (sequence, head) as column groups (`[V]` for fwd_h, `[V, K]` for the pre-scan, whose `b`
/// and `M` columns are blocked separately), the chunks of every sequence, and `HV`.
#[derive(Debug, Clone, Copy)]
pub struct Workload<'a> {
    pub dtype: Dtype,
    pub k: usize,
    pub col_groups: &'a [usize],
    pub seq_chunks: &'a [usize],
    pub hv: usize,
}

/// The width of `allowed` with the least estimated time
/// `step_cost(bv) · max(chunks of the longest sequence, all block-chunks / resident blocks)` for
/// sequences of `seq_chunks` chunks, `hv` heads and `sm_count` multiprocessors; `shape(bv)` gives
/// a block's shared memory and the blocks of one (sequence, head). Shared by the recurrence
/// kernels (fwd_h, the pre-scan, the fused forward).
pub(crate) fn cheapest_width(
    allowed: &[usize],
    seq_chunks: &[usize],
    hv: usize,
    sm_count: usize,
    shape: impl Fn(usize) -> (usize, usize),
) -> usize {
    let longest = seq_chunks.iter().copied().max().unwrap_or(0) as f64;
    let total: usize = seq_chunks.iter().sum::<usize>() * hv;
    let estimate = |bv: usize| {
        let (smem, blocks) = shape(bv);
        let per_sm = (SMEM_PER_SM / smem.max(1)).max(1);
        let spread = (total * blocks) as f64 / (sm_count.max(1) * per_sm) as f64;
        step_cost(bv) * longest.max(spread)
    };
    allowed
        .iter()
        .copied()
        .min_by(|&a, &b| estimate(a).total_cmp(&estimate(b)))
        .unwrap_or(16)
}

/// Relative cost of one chunk step of a block by its width (H100, K = 128, fwdh2 run 1 of
/// NOTES.md: 1.28, 1.96 and 2.87 µs per step for 16, 32 and 64 columns).
fn step_cost(bv: usize) -> f64 {
    match bv {
        16 => 1.0,
        32 => 1.53,
        _ => 2.24,
    }
}

/// Shared memory per multiprocessor available to blocks (227 KiB on sm_90).
pub(crate) const SMEM_PER_SM: usize = 227 * 1024;

/// The kernel of a call on `sm_count` multiprocessors. Float32/float64: the FMA kernel. Half
/// precision: keys padded to the next of 64/128/256, and the column-block width (64, 32, 16; 64
/// only up to 128 keys, for shared memory) with the least estimated time
/// `step_cost(bv) · max(chunks of the longest sequence, all block-chunks / resident blocks)`:
/// a few long sequences are a serial chain (narrow blocks: shorter steps, more of them run at
/// once), many heads are throughput (wide blocks load `k` and `w` fewer times).
/// `$ATTN_FWDH_BV` (16, 32, 64) overrides the width (a tuning knob).
pub fn kernel_choice(w: &Workload<'_>, sm_count: usize) -> KernelChoice {
    if !matches!(w.dtype, Dtype::BF16 | Dtype::F16) {
        return KernelChoice::Fma;
    }
    let kp = if w.k <= 64 {
        64
    } else if w.k <= 128 {
        128
    } else {
        256
    };
    let widest = w.col_groups.iter().copied().max().unwrap_or(1);
    let allowed: Vec<usize> = [64, 32, 16]
        .into_iter()
        .filter(|&bv| (kp <= 128 || bv <= 32) && (bv == 16 || bv / 2 < widest))
        .collect();
    let forced = crate::knobs::fwd_h_bv().filter(|bv| allowed.contains(bv));
    let bv = forced.unwrap_or_else(|| {
        cheapest_width(&allowed, w.seq_chunks, w.hv, sm_count, |bv| {
            let smem = KernelChoice::Mma { kp, bv }.smem_bytes(w.dtype);
            let blocks: usize = w.col_groups.iter().map(|c| c.div_ceil(bv)).sum();
            (smem, blocks)
        })
    });
    KernelChoice::Mma { kp, bv }
}

/// The per-sequence table `[N, 3]` (first token row of the packed `B * T` rows, length, first
/// `h` chunk row of the `B * NT` rows) of a validated geometry.
pub(crate) fn seq_table(gpu: &Gpu, geo: &Geometry, varlen: bool) -> GpuResult<DeviceTensor> {
    let nt = geo.nt(varlen);
    let starts = geo.chunk_starts(varlen);
    let mut rows = Vec::with_capacity(geo.n() * 3);
    for s in &geo.seqs {
        rows.push((s.batch * geo.t + s.bos) as i64);
        rows.push(s.len() as i64);
        rows.push((s.batch * nt + starts[s.n]) as i64);
    }
    if rows.is_empty() {
        rows.push(0);
    }
    DeviceTensor::from_slice(gpu, &rows)
}

/// Dtype code of an optional gate / state tensor (-1 when absent).
pub(crate) fn code(t: Option<&DeviceTensor>) -> i64 {
    t.map_or(-1, |t| dtype_code(t.dtype()))
}

/// Launches the recurrence kernel of `module` (its kernels are named after it) for `args`,
/// over `tasks` (sequence, value head) pairs and `blocks` column blocks.
pub(crate) fn launch(
    gpu: &Gpu,
    module: Module,
    choice: KernelChoice,
    dtype: Dtype,
    tasks: usize,
    blocks: usize,
    args: &FwdHArgs,
) -> GpuResult<()> {
    queue(gpu, module, choice, dtype, tasks, blocks, args)?;
    gpu.wait_if_checked(&choice.kernel_name(module.name(), dtype))
}

/// `n` as a grid's x extent (below 2^31), or an error naming `arg` with what was `expected`.
pub(crate) fn grid_x(n: usize, arg: &str, expected: &str) -> attn_reference::Result<u32> {
    u32::try_from(n)
        .ok()
        .filter(|&x| x <= i32::MAX as u32)
        .ok_or_else(|| Error::shape(arg, expected, vec![n]))
}

/// [`launch`] without waiting for the kernel (the split queues its stages back to back).
pub(crate) fn queue(
    gpu: &Gpu,
    module: Module,
    choice: KernelChoice,
    dtype: Dtype,
    tasks: usize,
    blocks: usize,
    args: &FwdHArgs,
) -> GpuResult<()> {
    if tasks == 0 || blocks == 0 {
        return Ok(());
    }
    let grid_x = grid_x(tasks, "u", "N * HV < 2^31")?;
    gpu.queue_with_smem(
        module,
        &choice.kernel_name(module.name(), dtype),
        (grid_x, blocks as u32),
        256,
        choice.smem_bytes(dtype) as u32,
        args,
    )
}
