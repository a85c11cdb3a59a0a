//! The decode kernels' block timeline, a diagnostic: with `-DDECODE_TIMELINE` in
//! `ATTN_NVRTC_OPTS`, thread 0 of each block of a `decode_attention` launch records its start and
//! end on the GPU's global timer (ns) and its multiprocessor into the module's table
//! `decode_timeline` (`decode_attention.cu`). [`reset`] clears the table before a launch and
//! [`read`] returns the blocks that ran since, in linear block order
//! (`x + nsplit·(y + H_kv·z)` of the grid `(nsplit, H_kv, B)`). Without the macro both are a
//! driver error (the module has no table), never zeros that look like a measurement.

use crate::device::Gpu;
use crate::error::{GpuError, GpuResult};
use crate::kernels::Module;

/// Blocks the table holds (`DECODE_TIMELINE_BLOCKS`); later blocks are not recorded.
pub const BLOCKS: usize = 1 << 18;

/// One block: its linear id, start and end (ns on the global timer), and multiprocessor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockSpan {
    pub block: usize,
    pub start_ns: u64,
    pub end_ns: u64,
    pub sm: u32,
}

const MISSING: &str = "the decode_timeline table (compile the decode module with \
                       ATTN_NVRTC_OPTS=-DDECODE_TIMELINE)";

/// Clears the table (queued on the GPU's stream).
pub fn reset(gpu: &Gpu) -> GpuResult<()> {
    let m = gpu.module(Module::DecodeAttention)?;
    let mut table = m
        .get_global("decode_timeline", gpu.stream())
        .map_err(GpuError::driver(MISSING))?;
    gpu.stream()
        .memset_zeros(&mut table)
        .map_err(GpuError::driver("clearing decode_timeline"))
}

/// Waits for the queued work and returns the blocks recorded since [`reset`] (start ≠ 0).
pub fn read(gpu: &Gpu) -> GpuResult<Vec<BlockSpan>> {
    let m = gpu.module(Module::DecodeAttention)?;
    let table = m
        .get_global("decode_timeline", gpu.stream())
        .map_err(GpuError::driver(MISSING))?;
    // the table is 3 · BLOCKS words of 8 bytes: read as bytes, then taken as words
    let mut bytes = vec![0u8; table.len()];
    gpu.stream()
        .memcpy_dtoh(&table, &mut bytes)
        .map_err(GpuError::driver("reading decode_timeline"))?;
    gpu.synchronize()?;
    let raw: Vec<u64> = bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
        .collect();
    Ok(raw
        .chunks_exact(3)
        .enumerate()
        .filter(|(_, r)| r[0] != 0)
        .map(|(block, r)| BlockSpan {
            block,
            start_ns: r[0],
            end_ns: r[1],
            sm: r[2] as u32,
        })
        .collect())
}
