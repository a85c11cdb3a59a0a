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

/// The kernel for main data of `dtype` with key dim `k`, `cols` state columns and `tasks`
/// (sequence, value head) pairs on `sm_count` multiprocessors. Half precision: keys padded to the
/// next of 64/128/256, and the widest column block (64, 32, 16; 64 only up to 128 keys, for
/// shared memory) that still gives every multiprocessor a block, else 16 (more blocks shorten
/// the serial chain's step). `$ATTN_FWDH_BV` (16, 32, 64) overrides the width (a tuning knob).
pub fn kernel_choice(
    dtype: Dtype,
    k: usize,
    cols: usize,
    tasks: usize,
    sm_count: usize,
) -> KernelChoice {
    if !matches!(dtype, Dtype::BF16 | Dtype::F16) {
        return KernelChoice::Fma;
    }
    let kp = if k <= 64 {
        64
    } else if k <= 128 {
        128
    } else {
        256
    };
    let allowed: Vec<usize> = [64, 32, 16]
        .into_iter()
        .filter(|&bv| (kp <= 128 || bv <= 32) && (bv == 16 || bv / 2 < cols))
        .collect();
    let forced = std::env::var("ATTN_FWDH_BV")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|bv| allowed.contains(bv));
    let bv = forced.unwrap_or_else(|| {
        allowed
            .iter()
            .copied()
            .find(|&bv| tasks * cols.div_ceil(bv) >= sm_count)
            .unwrap_or(16)
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
    if tasks == 0 || blocks == 0 {
        return Ok(());
    }
    let grid_x = u32::try_from(tasks)
        .ok()
        .filter(|&x| x <= i32::MAX as u32)
        .ok_or_else(|| Error::shape("u", "N * HV < 2^31", vec![tasks]))?;
    gpu.launch_with_smem(
        module,
        &choice.kernel_name(module.name(), dtype),
        (grid_x, blocks as u32),
        256,
        choice.smem_bytes(dtype) as u32,
        args,
    )
}
