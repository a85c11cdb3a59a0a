//! Which kernel scans chunks (`chunk_local_cumsum`, `kda_gate_chunk_cumsum`), and how the tile
//! kernel (kernels/tile.cuh) is laid out: one block per tile, a tile being the rows of one chunk
//! over `groups` groups of `vec` adjacent lanes, the rows cut into `parts` parts of
//! [`tile_rows`] rows scanned side by side and joined through shared memory. Chunks longer than
//! [`MAX_PARTS`] parts, or lanes of fewer than 32 groups, take the strided kernel (one thread
//! walks a whole chunk).

use crate::knobs;
use crate::params::widths;
use attn_reference::Dtype;

/// Most row parts in a tile.
pub const MAX_PARTS: usize = 16;

/// Rows per part of a tile: `$ATTN_TILE_RP` (a tuning knob: 4 or 8, passed to NVRTC too; 0
/// turns the tile kernel off), else 8. (16 would take more than the 48 KiB of shared memory a
/// fused block may have without opting in.)
pub fn tile_rows() -> usize {
    knobs::tile_rows().unwrap_or(8)
}

/// Dynamic shared memory of a tile block (kernels/tile.cuh): the part totals, and with the gate
/// the gated values of every thread's rows, in accumulators of `acc_bytes`.
pub(crate) fn tile_smem_bytes(t: &TileLayout, gated: bool, acc_bytes: usize) -> usize {
    let totals = t.parts * t.groups * t.vec * acc_bytes;
    // the gated values: a fixed stride of 256 threads per row
    let kept = if gated {
        tile_rows() * 256 * t.vec * acc_bytes
    } else {
        0
    };
    totals + kept
}

/// The layout of a tile launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TileLayout {
    /// Lanes per thread.
    pub vec: usize,
    /// Row parts per tile (a power of two up to [`MAX_PARTS`]).
    pub parts: usize,
    /// Lane groups per tile: a power of two, at least 16 (half a warp), `parts * groups <= 256`
    /// (the block).
    pub groups: usize,
}

/// The tile layout for jobs of at most `longest` rows over `cols` lanes, `din` -> `dout`, the
/// lanes of a thread within one `unit` (a divisor of `cols`); `None` when the strided kernel is
/// the one to use.
pub(crate) fn tile_layout(
    din: Dtype,
    dout: Dtype,
    cols: usize,
    unit: usize,
    longest: usize,
) -> Option<TileLayout> {
    let rows = tile_rows();
    if rows == 0 {
        return None;
    }
    // at most 8 input bytes per row and thread: the raw rows held for the rescan then fit the
    // kernel's 64 registers
    let vec = widths(din, dout, unit)
        .into_iter()
        .find(|w| w * din.size_bytes() <= 8)
        .unwrap_or(1);
    let ncv = cols / vec;
    let parts = longest.div_ceil(rows).max(1).next_power_of_two();
    // the kernel offsets rows within a part in 32 bits
    let offsets_fit = cols.saturating_mul(rows) < i32::MAX as usize;
    if parts > MAX_PARTS || ncv < 32 || !offsets_fit {
        return None;
    }
    let groups = (256 / parts).min(ncv.next_power_of_two());
    Some(TileLayout { vec, parts, groups })
}

/// Which kernel scans the chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkScanKernel {
    /// A block per chunk and group of lanes (tile.cuh).
    Tile,
    /// A thread per chunk and group of adjacent lanes (strided.cuh).
    Strided,
}

/// The kernel `chunk_local_cumsum` and `kda_gate_chunk_cumsum` use for chunks of `chunk_size`
/// tokens over `cols = H * S` (or `HV * K`) lanes, `din` -> `dout`. `unit`: the lanes a thread's
/// vector must stay within: `cols` for `chunk_local_cumsum`, `K` for `kda_gate_chunk_cumsum`
/// (one head's gate).
pub fn chunk_scan_kernel(
    din: Dtype,
    dout: Dtype,
    cols: usize,
    unit: usize,
    chunk_size: usize,
) -> ChunkScanKernel {
    match tile_layout(din, dout, cols, unit, chunk_size) {
        Some(_) => ChunkScanKernel::Tile,
        None => ChunkScanKernel::Strided,
    }
}
