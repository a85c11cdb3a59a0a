//! `#[repr(C)]` mirrors of the kernels' parameter structs (every field 8 bytes, so the C and
//! Rust layouts agree without padding), and the dtype rules shared by the ops.

use crate::knobs;
use attn_reference::{Dtype, Error};
use cudarc::driver::DeviceRepr;

/// Mirror of `RowArgs` (rows.cuh).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RowArgs {
    pub x: u64,
    pub y: u64,
    pub rows: i64,
    pub len: i64,
    pub reverse: i64,
    pub status: u64,
    pub epoch: i64,
    pub tiles_per_row: i64,
}
// SAFETY: plain `#[repr(C)]` data matching the kernel's struct.
unsafe impl DeviceRepr for RowArgs {}

/// Mirror of `GateArgs` (gate.cuh).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct GateArgs {
    pub a_log: u64,
    pub dt_bias: u64,
    pub a_log_dtype: i64,
    pub dt_bias_dtype: i64,
    pub has_lower_bound: i64,
    pub lower_bound: f64,
    pub head_dim: i64,
}

impl GateArgs {
    /// No gate: a plain scan (no side inputs; the kernels never read the rest).
    pub(crate) fn none() -> GateArgs {
        GateArgs {
            a_log_dtype: -1,
            dt_bias_dtype: -1,
            head_dim: 1,
            ..Default::default()
        }
    }
}

/// Mirror of `StridedArgs` (strided.cuh).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct StridedArgs {
    pub x: u64,
    pub y: u64,
    pub cols: i64,
    pub ncv: i64,
    pub njobs: i64,
    pub rows_per_batch: i64,
    pub seg: i64,
    pub jobs_per_batch: i64,
    pub job_row0: u64,
    pub job_len: u64,
    pub reverse: i64,
    pub scale: f64,
    pub gate: GateArgs,
    pub sums: u64,
    pub job_carry: u64,
    pub parts: i64,
}
// SAFETY: as above.
unsafe impl DeviceRepr for StridedArgs {}

/// Mirror of `GateElemArgs` (kda_gate.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct GateElemArgs {
    pub x: u64,
    pub y: u64,
    pub rows: i64,
    pub cols: i64,
    pub gate: GateArgs,
}
// SAFETY: as above.
unsafe impl DeviceRepr for GateElemArgs {}

/// The kernels' name tag of a float dtype.
pub(crate) fn tag(d: Dtype) -> &'static str {
    match d {
        Dtype::F64 => "f64",
        Dtype::F32 => "f32",
        Dtype::BF16 => "bf16",
        Dtype::F16 => "f16",
        Dtype::I32 => "i32",
        Dtype::I64 => "i64",
    }
}

/// The `load_any` code of a float dtype (common.cuh).
pub(crate) fn dtype_code(d: Dtype) -> i64 {
    match d {
        Dtype::F64 => 0,
        Dtype::F32 => 1,
        Dtype::BF16 => 2,
        _ => 3,
    }
}

/// Elements of `d` in one 16-byte access.
pub(crate) fn vmax(d: Dtype) -> usize {
    16 / d.size_bytes()
}

/// `arg` must hold floats.
pub(crate) fn check_float(arg: &str, d: Dtype) -> attn_reference::Result<()> {
    if d.is_float() {
        Ok(())
    } else {
        Err(Error::dtype(
            arg,
            "float64, float32, bfloat16 or float16",
            d.name(),
        ))
    }
}

/// The output dtype of a scan: `None` keeps the input's; otherwise float32, float64 or the
/// input's own dtype.
pub(crate) fn scan_output_dtype(
    input: Dtype,
    requested: Option<Dtype>,
) -> attn_reference::Result<Dtype> {
    match requested {
        None => Ok(input),
        Some(d) if d == Dtype::F32 || d == Dtype::F64 || d == input => Ok(d),
        Some(d) => Err(Error::dtype(
            "output_dtype",
            format!("float32, float64 or the input's dtype ({input})"),
            d.name(),
        )),
    }
}

/// A grid of 256-thread blocks covering `threads` threads (at least one block, capped for
/// grid-stride kernels).
pub(crate) fn grid_for(threads: usize) -> u32 {
    threads.div_ceil(256).clamp(1, i32::MAX as usize) as u32
}

/// The widths (elements per thread) a strided or elementwise kernel may use for `din` ->
/// `dout` over `cols` lanes, widest first: powers of two up to one 16-byte load, dividing
/// `cols` (aligned accesses), with stores of at most 16 bytes (a warp's store instruction then
/// covers whole 32-byte sectors); 1 always.
pub(crate) fn widths(din: Dtype, dout: Dtype, cols: usize) -> Vec<usize> {
    let wide = din.size_bytes().max(dout.size_bytes());
    [8, 4, 2, 1]
        .into_iter()
        .filter(|&w| w == 1 || (w <= vmax(din) && cols % w == 0 && w * wide <= 16))
        .collect()
}

/// The width of a strided scan over `cols` lanes in `jobs` jobs, a divisor of `unit` (which
/// divides `cols`: K when a vector's lanes must share one head's gate): the widest allowed one that
/// still gives `STRIDED_WAVES` waves of resident threads (fewer, longer threads leave the GPU
/// idle at the tail), else the narrowest vector width. `$ATTN_STRIDED_WIDTH` overrides it
/// (a tuning knob; ignored when not allowed).
pub(crate) fn strided_width(
    sm_count: usize,
    din: Dtype,
    dout: Dtype,
    cols: usize,
    unit: usize,
    jobs: usize,
) -> usize {
    let allowed = widths(din, dout, unit);
    if let Some(w) = knobs::strided_width(&allowed) {
        return w;
    }
    // resident threads: 256-thread blocks, at least 3 per multiprocessor (ATTN_MIN_BLOCKS)
    let resident = sm_count * 3 * 256;
    let waves = knobs::strided_waves().unwrap_or(STRIDED_WAVES);
    allowed
        .iter()
        .copied()
        .find(|&w| jobs * (cols / w) >= waves * resident)
        .unwrap_or_else(|| allowed.iter().copied().rev().find(|&w| w > 1).unwrap_or(1))
}

/// Waves of resident threads a strided scan aims for (see [`strided_width`]).
const STRIDED_WAVES: usize = 4;
