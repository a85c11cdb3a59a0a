//! The device state of decode steps: the error flag, and the split-KV workspace (partial
//! outputs, per-(row, KV head) counters), sized once from the shapes, so that every step of a
//! captured graph uses the same buffers and the same grid.

use super::check::DecodeShape;
use crate::device::Gpu;
use crate::error::{GpuError, GpuResult};
use crate::knobs;
use attn_reference::{Dtype, Error};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};

/// Keys per split are a multiple of this (short rows then need no combine).
const CHUNK_UNIT: usize = 128;
/// The most splits of one row (`DECODE_MAX_SPLITS` of decode_attention.cu).
pub const MAX_SPLITS: usize = 1024;
/// Blocks per multiprocessor a full-length launch aims for: enough splits that long rows
/// spread over the whole GPU (with the cp.async ring, 16 measured best of 8, 12, 16, 24, 32 on
/// the H100 over the serving rows: NOTES.md, S11-3; 8 before the ring, run D3).
const BLOCKS_PER_SM: usize = 16;
/// The most keys of one split: long rows then run as many short blocks, which balance over
/// the multiprocessors (S11-3: the full serving cache of 32768 keys 2.969 -> 2.926 ms).
const CHUNK_MAX: usize = 2048;

/// The device-side error word of the decode kernels: bit 1 a `cache_seqlens` value out of
/// range (negative, or past `S` with the new tokens), bit 2 a `cache_batch_idx` value outside
/// `0 .. B_cache`, bit 4 a repeated `cache_batch_idx` value. Kernels set bits and skip the row
/// (no cache write; attention writes NaN into its `o` and `lse`); the host reads the word
/// only when asked ([`DecodeFlag::check`]), so that a step needs no synchronisation.
pub struct DecodeFlag {
    word: CudaSlice<u32>,
}

impl DecodeFlag {
    pub fn new(gpu: &Gpu) -> GpuResult<DecodeFlag> {
        let word = gpu
            .stream()
            .alloc_zeros::<u32>(1)
            .map_err(GpuError::driver("decode flag allocation"))?;
        Ok(DecodeFlag { word })
    }

    /// Device address of the word (for the kernels).
    pub(crate) fn ptr(&mut self, gpu: &Gpu) -> u64 {
        let (p, _g) = self.word.device_ptr_mut(gpu.stream());
        p
    }

    /// Waits for the queued work, returns the word and clears it.
    pub fn take(&mut self, gpu: &Gpu) -> GpuResult<u32> {
        let mut w = [0u32];
        gpu.stream()
            .memcpy_dtoh(&self.word, &mut w)
            .map_err(GpuError::driver("reading the decode flag"))?;
        gpu.stream()
            .memset_zeros(&mut self.word)
            .map_err(GpuError::driver("clearing the decode flag"))?;
        gpu.synchronize()?;
        Ok(w[0])
    }

    /// [`DecodeFlag::take`] as a typed error naming the argument whose value was refused.
    pub fn check(&mut self, gpu: &Gpu) -> GpuResult<()> {
        flag_error(self.take(gpu)?).map_or(Ok(()), |e| Err(e.into()))
    }
}

/// The error of a flag word (`None` for 0).
pub fn flag_error(word: u32) -> Option<Error> {
    let got = "a row refused on the device (decode flag)";
    if word & 1 != 0 {
        Some(Error::index(
            "cache_seqlens",
            "0 <= cache_seqlens[b] and cache_seqlens[b] + L_new <= S",
            got,
        ))
    } else if word & 2 != 0 {
        Some(Error::index(
            "cache_batch_idx",
            "values in 0 .. B_cache",
            got,
        ))
    } else if word & 4 != 0 {
        Some(Error::index("cache_batch_idx", "distinct values", got))
    } else {
        None
    }
}

/// Splits of the key range: `(nsplit, chunk)` with `nsplit * chunk >= S`, from `S`, the
/// number of (row, KV head) pairs and the device only (never from the lengths): about
/// `BLOCKS_PER_SM` blocks per multiprocessor when every row is full, chunks of a multiple of
/// 128 keys and at most `CHUNK_MAX` (unless `S` needs more for [`MAX_SPLITS`]), at most
/// [`MAX_SPLITS`] splits. Tuning knobs: `$ATTN_DECODE_CHUNK` sets the chunk,
/// `$ATTN_DECODE_BLOCKS_PER_SM` the blocks per multiprocessor aimed for.
pub fn split_plan(sm_count: usize, pairs: usize, s: usize) -> (usize, usize) {
    let floor = s.div_ceil(MAX_SPLITS).max(1);
    let chunk = match knobs::decode_chunk() {
        Some(c) => c.max(floor),
        None => {
            let per_sm = knobs::decode_blocks_per_sm().unwrap_or(BLOCKS_PER_SM);
            let want = (per_sm * sm_count)
                .div_ceil(pairs.max(1))
                .clamp(1, MAX_SPLITS);
            s.div_ceil(want)
                .next_multiple_of(CHUNK_UNIT)
                .min(CHUNK_MAX)
                .max(floor.next_multiple_of(CHUNK_UNIT))
        }
    };
    (s.div_ceil(chunk).max(1), chunk)
}

/// Scratch of `decode_attention` for one geometry: the split plan, the partial outputs
/// `[B * H_kv, nsplit, G * L_q, D]` and their `lse` (in the accumulator type), the counters of the combine (zero between
/// launches: the last block of each (row, KV head) resets its own), and the error flag.
/// One workspace serves one stream at a time.
pub struct DecodeWorkspace {
    pub(crate) shape: DecodeShape,
    pub(crate) nsplit: usize,
    pub(crate) chunk: usize,
    part_o: CudaSlice<u8>,
    part_lse: CudaSlice<u8>,
    counters: CudaSlice<u32>,
    flag: DecodeFlag,
}

impl DecodeWorkspace {
    /// A workspace for attention of geometry `shape` (from
    /// [`super::check::check_attention_shapes`]).
    pub fn new(gpu: &Gpu, shape: DecodeShape) -> GpuResult<DecodeWorkspace> {
        let pairs = shape.b * shape.h_kv;
        let (nsplit, chunk) = split_plan(gpu.sm_count(), pairs, shape.s);
        let rows = shape.h / shape.h_kv.max(1) * shape.l;
        let part = pairs
            .checked_mul(nsplit)
            .and_then(|x| x.checked_mul(rows))
            .ok_or_else(|| Error::shape("q", "a workspace that fits in memory", [pairs, rows]))?;
        let stream = gpu.stream();
        // partials in the accumulator type: fp64 for fp64, else fp32
        let acc_bytes = if shape.dtype == Dtype::F64 { 8 } else { 4 };
        let alloc = |n: usize| {
            stream
                .alloc_zeros::<u8>(n.max(1).saturating_mul(acc_bytes))
                .map_err(GpuError::driver("decode workspace allocation"))
        };
        Ok(DecodeWorkspace {
            shape,
            nsplit,
            chunk,
            part_o: alloc(part.saturating_mul(shape.d))?,
            part_lse: alloc(part)?,
            counters: stream
                .alloc_zeros::<u32>(pairs.max(1))
                .map_err(GpuError::driver("decode workspace allocation"))?,
            flag: DecodeFlag::new(gpu)?,
        })
    }

    /// The geometry this workspace was made for.
    pub fn shape(&self) -> &DecodeShape {
        &self.shape
    }
    /// `(nsplit, chunk)`: the grid's splits and the keys per split.
    pub fn splits(&self) -> (usize, usize) {
        (self.nsplit, self.chunk)
    }
    pub fn flag(&mut self) -> &mut DecodeFlag {
        &mut self.flag
    }

    /// Device addresses `(part_o, part_lse, counters, flag)`.
    pub(crate) fn ptrs(&mut self, gpu: &Gpu) -> (u64, u64, u64, u64) {
        let s = gpu.stream();
        let (po, _a) = self.part_o.device_ptr(s);
        let (pl, _b) = self.part_lse.device_ptr(s);
        let (c, _c) = self.counters.device_ptr(s);
        (po, pl, c, self.flag.ptr(gpu))
    }
}
