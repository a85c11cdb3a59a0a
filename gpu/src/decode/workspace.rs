//! The device state of decode steps: the error flag, and the split-KV workspace (partial
//! outputs, per-(row, KV head) counters), sized once from the shapes, so that every step of a
//! captured graph uses the same buffers and the same grid.

use super::check::DecodeShape;
use crate::device::Gpu;
use crate::error::{GpuError, GpuResult};
use crate::kernels::Module;
use crate::knobs;
use crate::params::tag;
use attn_reference::{Dtype, Error};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};

/// Keys per split are a multiple of this (short rows then need no combine).
const CHUNK_UNIT: usize = 128;
/// The most splits of one row (`DECODE_MAX_SPLITS` of decode_attention.cu).
pub const MAX_SPLITS: usize = 1024;
/// Blocks per multiprocessor a full-length launch aims for: enough splits that long rows
/// spread over the whole GPU (8 measured best of 4, 8, 16, 32 on the H100: NOTES.md, run D3).
const BLOCKS_PER_SM: usize = 8;

/// Which attention kernel a workspace launches (`NOTES.md`, session 6). Both compute the same
/// function; they differ in how the keys reach the multiprocessors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeKernel {
    /// Split-KV grid `(nsplit, H_kv, B)` ([`split_plan`]), keys loaded into registers.
    Split,
    /// Persistent walk: `blocks_per_sm` blocks per multiprocessor (at most the resident ones)
    /// share the valid keys evenly (at least `min_portion` keys a block), through `stages`
    /// shared-memory stages filled by `cp.async` (2 ..= 7; fewer when the memory is short).
    Walk {
        blocks_per_sm: usize,
        stages: usize,
        min_portion: usize,
    },
}

impl DecodeKernel {
    /// The walk's defaults: 2 blocks per multiprocessor, 4 stages, 128 keys a block at least.
    pub const WALK: DecodeKernel = DecodeKernel::Walk {
        blocks_per_sm: 2,
        stages: 4,
        min_portion: 128,
    };

    /// Parses `split`, `walk`, or `walk:BLOCKS_PER_SM[:STAGES[:MIN_PORTION]]` (missing fields
    /// take the walk's defaults).
    pub fn parse(s: &str) -> Result<DecodeKernel, Error> {
        let bad = || Error::param("decode kernel", "split or walk[:blocks[:stages[:keys]]]", s);
        let mut it = s.trim().split(':');
        match it.next() {
            Some("split") if it.next().is_none() => Ok(DecodeKernel::Split),
            Some("walk") => {
                let DecodeKernel::Walk {
                    blocks_per_sm,
                    stages,
                    min_portion,
                } = DecodeKernel::WALK
                else {
                    return Err(bad());
                };
                let mut field = |d: usize, ok: &dyn Fn(usize) -> bool| match it.next() {
                    None => Ok(d),
                    Some(v) => v.parse().ok().filter(|&v| ok(v)).ok_or_else(bad),
                };
                let k = DecodeKernel::Walk {
                    blocks_per_sm: field(blocks_per_sm, &|v| (1..=8).contains(&v))?,
                    stages: field(stages, &|v| (2..=7).contains(&v))?,
                    min_portion: field(min_portion, &|v| v > 0)?,
                };
                match it.next() {
                    None => Ok(k),
                    Some(_) => Err(bad()),
                }
            }
            _ => Err(bad()),
        }
    }

    /// The kernel of a new workspace: `$ATTN_DECODE_KERNEL` when set and valid, else
    /// [`DecodeKernel::Split`].
    pub fn from_env() -> DecodeKernel {
        knobs::decode_kernel()
            .and_then(|s| DecodeKernel::parse(&s).ok())
            .unwrap_or(DecodeKernel::Split)
    }
}

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
/// 128 keys, at most [`MAX_SPLITS`]. Tuning knobs: `$ATTN_DECODE_CHUNK` sets the chunk,
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
                .max(floor.next_multiple_of(CHUNK_UNIT))
        }
    };
    (s.div_ceil(chunk).max(1), chunk)
}

/// How a workspace's kernel is launched (from the shapes and the device only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Grid `(nsplit, H_kv, B)`, `chunk` keys per split.
    Split {
        nsplit: usize,
        chunk: usize,
    },
    Walk(WalkPlan),
}

/// The walk's launch: `grid` blocks, `smem` bytes of stages each, `npass` passes of `rb` rows
/// per KV head, at least `min_portion` keys a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WalkPlan {
    pub grid: usize,
    pub smem: usize,
    pub npass: usize,
    pub rb: usize,
    pub min_portion: usize,
}

/// Scratch of `decode_attention` for one geometry and kernel: the launch plan, the partial
/// outputs and their `lse` (in the accumulator type; split: `[B * H_kv, nsplit, G * L_q, D]`,
/// walk: `[grid + B * H_kv * npass, rb, D]`), the counters of the combine (one per (row, KV
/// head), or per walk unit; zero between launches: the last block of each resets its own), and
/// the error flag. One workspace serves one stream at a time.
pub struct DecodeWorkspace {
    pub(crate) shape: DecodeShape,
    pub(crate) plan: Plan,
    part_o: CudaSlice<u8>,
    part_lse: CudaSlice<u8>,
    counters: CudaSlice<u32>,
    flag: DecodeFlag,
}

impl DecodeWorkspace {
    /// A workspace for attention of geometry `shape` (from
    /// [`super::check::check_attention_shapes`]), with the kernel of [`DecodeKernel::from_env`].
    pub fn new(gpu: &Gpu, shape: DecodeShape) -> GpuResult<DecodeWorkspace> {
        DecodeWorkspace::with_kernel(gpu, shape, DecodeKernel::from_env())
    }

    /// A workspace for `shape` that launches `kernel`.
    pub fn with_kernel(
        gpu: &Gpu,
        shape: DecodeShape,
        kernel: DecodeKernel,
    ) -> GpuResult<DecodeWorkspace> {
        let pairs = shape.b * shape.h_kv;
        let rows = shape.h / shape.h_kv.max(1) * shape.l;
        let (plan, slots, slot_rows, units) = match kernel {
            DecodeKernel::Split => {
                let (nsplit, chunk) = split_plan(gpu.sm_count(), pairs, shape.s);
                (
                    Plan::Split { nsplit, chunk },
                    pairs.checked_mul(nsplit),
                    rows,
                    pairs,
                )
            }
            DecodeKernel::Walk {
                blocks_per_sm,
                stages,
                min_portion,
            } => {
                let w = walk_plan(gpu, &shape, blocks_per_sm, stages, min_portion)?;
                let units = pairs.saturating_mul(w.npass);
                (Plan::Walk(w), units.checked_add(w.grid), w.rb, units)
            }
        };
        let part = slots
            .and_then(|x| x.checked_mul(slot_rows))
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
            plan,
            part_o: alloc(part.saturating_mul(shape.d))?,
            part_lse: alloc(part)?,
            counters: stream
                .alloc_zeros::<u32>(units.max(1))
                .map_err(GpuError::driver("decode workspace allocation"))?,
            flag: DecodeFlag::new(gpu)?,
        })
    }

    /// The geometry this workspace was made for.
    pub fn shape(&self) -> &DecodeShape {
        &self.shape
    }
    /// The split kernel's `(nsplit, chunk)` (splits of the grid, keys per split); for the walk,
    /// `(grid blocks, 0)`.
    pub fn splits(&self) -> (usize, usize) {
        match self.plan {
            Plan::Split { nsplit, chunk } => (nsplit, chunk),
            Plan::Walk(w) => (w.grid, 0),
        }
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

/// The walk's plan: `npass = ceil(G * L_q / rb)` passes of the kernel's `rb` rows; stages of
/// `2 * TK * DP` elements (TK keys of K and V, [`attention_kernel`]), as many as asked that fit
/// the block's shared memory (at least 2); `grid = SMs * min(blocks_per_sm, resident)`, at most
/// [`MAX_SPLITS`] (the combine's weights).
fn walk_plan(
    gpu: &Gpu,
    shape: &DecodeShape,
    blocks_per_sm: usize,
    stages: usize,
    min_portion: usize,
) -> GpuResult<WalkPlan> {
    let k = attention_kernel(shape, "decode_walk");
    let rows = shape.h / shape.h_kv.max(1) * shape.l;
    let stage = 2 * k.tile_keys * k.dp * shape.dtype.size_bytes();
    let (_, most) = gpu.residency(Module::DecodeWalk, &k.name, THREADS, 0)?;
    let stages = stages.clamp(2, 7).min(most / stage);
    if stages < 2 {
        return Err(Error::shape(
            "k_cache",
            "a head dim whose two key tiles fit one block's shared memory",
            shape.d,
        )
        .into());
    }
    let smem = stages * stage;
    let (resident, _) = gpu.residency(Module::DecodeWalk, &k.name, THREADS, smem)?;
    let per_sm = blocks_per_sm.min(resident.max(1) as usize);
    Ok(WalkPlan {
        grid: (gpu.sm_count() * per_sm).clamp(1, MAX_SPLITS),
        smem,
        npass: rows.div_ceil(k.rb).max(1),
        rb: k.rb,
        min_portion,
    })
}

/// Threads of a decode attention block (`DECODE_THREADS`).
pub(crate) const THREADS: u32 = 128;

/// The attention kernel for `shape` of `family` (`decode_attention`, `decode_walk`).
pub(crate) struct KernelName {
    pub name: String,
    /// Padded head dim.
    pub dp: usize,
    /// Query rows per pass.
    pub rb: usize,
    /// Keys per block step (`DecodeGeo::TK`, with the default `DECODE_U`).
    pub tile_keys: usize,
}

/// The kernel of `family` for `shape`: padded head dim, elements per load, rows per pass.
pub(crate) fn attention_kernel(shape: &DecodeShape, family: &str) -> KernelName {
    let width = 16 / shape.dtype.size_bytes();
    let (dp, w) = match shape.d {
        d if d % width != 0 => (256, 1),
        d if d <= 64 => (64, width),
        d if d <= 128 => (128, width),
        _ => (256, width),
    };
    let rows = shape.h / shape.h_kv.max(1) * shape.l;
    // fp64 kernels hold at most 4 rows per pass (their shared memory)
    let most = if shape.dtype == Dtype::F64 { 4 } else { 8 };
    let rb = [1, 2, 4, 8]
        .into_iter()
        .find(|&r| r >= rows.min(most))
        .unwrap_or(most);
    let ch = dp / w;
    let lanes = ch.min(32);
    let u = if rb >= 8 { 2 } else { 4 };
    KernelName {
        name: format!("{family}_{}_d{dp}_w{w}_r{rb}", tag(shape.dtype)),
        dp,
        rb,
        tile_keys: 4 * (32 / lanes) * u,
    }
}

#[cfg(test)]
mod tests {
    use super::DecodeKernel;

    #[test]
    fn kernel_strings_parse_or_name_the_argument() {
        assert_eq!(DecodeKernel::parse("split").unwrap(), DecodeKernel::Split);
        assert_eq!(DecodeKernel::parse("walk").unwrap(), DecodeKernel::WALK);
        assert_eq!(
            DecodeKernel::parse("walk:3:5:64").unwrap(),
            DecodeKernel::Walk {
                blocks_per_sm: 3,
                stages: 5,
                min_portion: 64
            }
        );
        for bad in [
            "",
            "splitx",
            "split:1",
            "walk:0",
            "walk:2:1",
            "walk:2:8",
            "walk:2:4:0",
            "walk:1:2:3:4",
        ] {
            let e = DecodeKernel::parse(bad).unwrap_err();
            assert_eq!(e.arg, "decode kernel", "{bad}");
        }
    }
}
