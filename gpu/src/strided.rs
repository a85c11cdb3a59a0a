//! Launching the strided scan (kernels/strided.cuh) over a set of jobs: one kernel when there
//! are enough lanes to fill the GPU, else three passes over chunks of [`SPLIT_ROWS`] rows (chunk
//! totals; their running totals, by the same scan, split again while still long; chunk scans
//! carried in), which gives few long lanes the whole GPU at the price of reading the input
//! twice. Chunk scans whose chunks fit a tile take the tile kernel instead ([`crate::tile`]).
//! All are deterministic.

use crate::device::Gpu;
use crate::error::GpuResult;
use crate::kernels::Module;
use crate::params::{grid_for, strided_width, tag, GateArgs, StridedArgs};
use crate::tensor::DeviceTensor;
use crate::tile::{tile_layout, tile_smem_bytes, TileLayout};
use attn_reference::cumsum::SeqScanPlan;
use attn_reference::Dtype;

/// Rows per chunk of the three-pass (split) scan.
pub const SPLIT_ROWS: usize = 64;

/// The jobs of a strided scan: `njobs` lane segments, each scanned from zero. Uniform: batch
/// `b = job / jobs_per_batch` has `rows_per_batch` rows cut into segments of `seg` rows. With
/// `table`: job `j` is rows `row0[j] .. row0[j] + len[j]` of the flattened tensor.
#[derive(Debug, Clone)]
pub(crate) struct Jobs {
    pub njobs: usize,
    pub rows_per_batch: usize,
    pub seg: usize,
    pub jobs_per_batch: usize,
    pub table: Option<(Vec<i64>, Vec<i64>)>,
}

impl Jobs {
    /// `batches` batches of `rows` rows, one whole-lane job each.
    pub fn whole(batches: usize, rows: usize) -> Jobs {
        Jobs {
            njobs: if rows == 0 { 0 } else { batches },
            rows_per_batch: rows,
            seg: rows.max(1),
            jobs_per_batch: 1,
            table: None,
        }
    }

    /// Jobs of `seg` tokens (`None`: whole sequences) over the sequences of `plan`.
    pub fn for_plan(plan: &SeqScanPlan, varlen: bool, seg: Option<usize>) -> Jobs {
        if !varlen {
            let seg = seg.unwrap_or(plan.t).max(1);
            let jpb = plan.t.div_ceil(seg);
            return Jobs {
                njobs: plan.b * jpb,
                rows_per_batch: plan.t,
                seg,
                jobs_per_batch: jpb.max(1),
                table: None,
            };
        }
        let (mut row0, mut len) = (Vec::new(), Vec::new());
        for s in &plan.seqs {
            for (a, e) in s.chunks(seg.unwrap_or(s.len()).max(1)) {
                row0.push((s.batch * plan.t + a) as i64);
                len.push((e - a) as i64);
            }
        }
        Jobs {
            njobs: row0.len(),
            rows_per_batch: plan.t,
            seg: 1,
            jobs_per_batch: 1,
            table: Some((row0, len)),
        }
    }

    /// The longest job, in rows.
    fn longest(&self) -> usize {
        match &self.table {
            Some((_, len)) => len.iter().copied().max().unwrap_or(0) as usize,
            None => self.seg.min(self.rows_per_batch),
        }
    }

    /// Whole-lane jobs cut into chunks of `SPLIT_ROWS` rows: the chunk jobs, the jobs of the
    /// scan over their totals (one per original job, rows = its chunks), and for tables the
    /// carry job of every chunk (the chunk before it in its job, after it when `reverse`).
    fn split(&self, reverse: bool) -> (Jobs, Jobs, Option<Vec<i64>>) {
        match &self.table {
            None => {
                let jpb = self.rows_per_batch.div_ceil(SPLIT_ROWS);
                let batches = self.njobs;
                (
                    Jobs {
                        njobs: batches * jpb,
                        rows_per_batch: self.rows_per_batch,
                        seg: SPLIT_ROWS,
                        jobs_per_batch: jpb,
                        table: None,
                    },
                    Jobs::whole(batches, jpb),
                    None,
                )
            }
            Some((row0, len)) => {
                let (mut c0, mut cl, mut carry) = (Vec::new(), Vec::new(), Vec::new());
                let (mut s0, mut sl) = (Vec::new(), Vec::new());
                for (&r, &l) in row0.iter().zip(len) {
                    let n = (l as usize).div_ceil(SPLIT_ROWS);
                    if n == 0 {
                        continue;
                    }
                    let first = c0.len() as i64;
                    s0.push(first);
                    sl.push(n as i64);
                    for k in 0..n {
                        let a = k * SPLIT_ROWS;
                        c0.push(r + a as i64);
                        cl.push((l as usize - a).min(SPLIT_ROWS) as i64);
                        let idx = first + k as i64;
                        carry.push(match (reverse, k) {
                            (false, 0) => -1,
                            (false, _) => idx - 1,
                            (true, k) if k + 1 == n => -1,
                            (true, _) => idx + 1,
                        });
                    }
                }
                let chunks = Jobs {
                    njobs: c0.len(),
                    rows_per_batch: self.rows_per_batch,
                    seg: 1,
                    jobs_per_batch: 1,
                    table: Some((c0, cl)),
                };
                let totals = Jobs {
                    njobs: s0.len(),
                    rows_per_batch: 0,
                    seg: 1,
                    jobs_per_batch: 1,
                    table: Some((s0, sl)),
                };
                (chunks, totals, Some(carry))
            }
        }
    }
}

/// How the threads of a launch cover its jobs.
#[derive(Debug, Clone, Copy)]
enum Layout {
    /// strided.cuh: a thread per job and group of adjacent lanes, width by [`strided_width`].
    Strided,
    /// tile.cuh: a block per tile.
    Tile(TileLayout),
}

/// A launch of one strided or tile kernel: `name` over `jobs`, reading `x`, writing `y`.
struct Pass<'a> {
    name: String,
    x: u64,
    y: u64,
    dtypes: (Dtype, Dtype),
    jobs: &'a Jobs,
    sums: u64,
    job_carry: u64,
}

#[allow(clippy::too_many_arguments)]
fn launch_pass(
    gpu: &Gpu,
    module: Module,
    pass: Pass<'_>,
    layout: Layout,
    cols: usize,
    reverse: bool,
    scale: Option<f64>,
    gate: GateArgs,
) -> GpuResult<()> {
    if pass.jobs.njobs == 0 || cols == 0 {
        return Ok(());
    }
    let vec = match layout {
        Layout::Strided => strided_width(
            gpu.sm_count(),
            pass.dtypes.0,
            pass.dtypes.1,
            cols,
            width_unit(module, &gate, cols),
            pass.jobs.njobs,
        ),
        Layout::Tile(t) => t.vec,
    };
    let ncv = cols / vec;
    // job tables live on the device until the launch has been queued (stream-ordered frees)
    let table = match &pass.jobs.table {
        Some((r, l)) => Some((
            DeviceTensor::from_slice(gpu, r)?,
            DeviceTensor::from_slice(gpu, l)?,
        )),
        None => None,
    };
    let (job_row0, job_len) = table
        .as_ref()
        .map_or((0, 0), |(r, l)| (r.ptr(gpu), l.ptr(gpu)));
    let args = StridedArgs {
        x: pass.x,
        y: pass.y,
        cols: cols as i64,
        ncv: ncv as i64,
        njobs: pass.jobs.njobs as i64,
        rows_per_batch: pass.jobs.rows_per_batch as i64,
        seg: pass.jobs.seg as i64,
        jobs_per_batch: pass.jobs.jobs_per_batch as i64,
        job_row0,
        job_len,
        reverse: reverse as i64,
        scale: scale.unwrap_or(1.0),
        gate,
        sums: pass.sums,
        job_carry: pass.job_carry,
        parts: match layout {
            Layout::Strided => 0,
            Layout::Tile(t) => t.parts as i64,
        },
    };
    let (dtypes, name) = (pass.dtypes, pass.name);
    let (kind, grid, block, smem) = match layout {
        Layout::Strided => ("", grid_for(pass.jobs.njobs * ncv), 256, 0),
        Layout::Tile(t) => {
            let tiles = pass.jobs.njobs * ncv.div_ceil(t.groups);
            let gated = module == Module::KdaGateChunkCumsum;
            let acc = if dtypes.0 == Dtype::F64 || dtypes.1 == Dtype::F64 {
                8
            } else {
                4
            };
            (
                "_tile",
                tiles.min(i32::MAX as usize) as u32,
                t.parts * t.groups,
                tile_smem_bytes(&t, gated, acc),
            )
        }
    };
    let name = format!("{name}{kind}_v{vec}_{}_{}", tag(dtypes.0), tag(dtypes.1));
    gpu.launch_with_smem(module, &name, (grid, 1), block as u32, smem as u32, &args)
}

/// The lanes a thread's vector must stay within: one head (K lanes) under the KDA gate, whose
/// A_log factor is per head; else all `cols`.
fn width_unit(module: Module, gate: &GateArgs, cols: usize) -> usize {
    if module == Module::KdaGateChunkCumsum {
        gate.head_dim.max(1) as usize
    } else {
        cols
    }
}

/// The strided kernels' name prefix in `module`.
fn prefix(module: Module) -> &'static str {
    match module {
        Module::Cumsum => "cumsum_strided",
        m => m.name(),
    }
}

/// Scans `g` into `o` over `jobs` with `cols` lanes (`gate` for the fused KDA gate). Whole-lane
/// jobs of `cumsum` / `chunk_global_cumsum` with too few lanes to fill the GPU take the
/// three-pass split.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_strided(
    gpu: &Gpu,
    module: Module,
    g: &DeviceTensor,
    o: &mut DeviceTensor,
    cols: usize,
    jobs: &Jobs,
    reverse: bool,
    scale: Option<f64>,
    gate: GateArgs,
) -> GpuResult<()> {
    if jobs.njobs == 0 || cols == 0 {
        return Ok(());
    }
    let dtypes = (g.dtype(), o.dtype());
    let (x, y) = (g.ptr(gpu), o.ptr_mut(gpu));
    let chunked = matches!(
        module,
        Module::ChunkLocalCumsum | Module::KdaGateChunkCumsum
    );
    let unit = width_unit(module, &gate, cols);
    let tile = tile_layout(dtypes.0, dtypes.1, cols, unit, jobs.longest()).filter(|_| chunked);
    let whole_lanes = jobs.table.is_some() || jobs.jobs_per_batch == 1;
    let few_lanes = jobs.njobs * cols < gpu.sm_count() * 3 * 256;
    let splittable = matches!(module, Module::Cumsum | Module::ChunkGlobalCumsum);
    if !(splittable && whole_lanes && few_lanes && jobs.longest() >= 2 * SPLIT_ROWS) {
        let pass = Pass {
            name: prefix(module).to_string(),
            x,
            y,
            dtypes,
            jobs,
            sums: 0,
            job_carry: 0,
        };
        let layout = tile.map_or(Layout::Strided, Layout::Tile);
        return launch_pass(gpu, module, pass, layout, cols, reverse, scale, gate);
    }
    let (chunks, totals, carry) = jobs.split(reverse);
    let acc = if dtypes.0 == Dtype::F64 || dtypes.1 == Dtype::F64 {
        Dtype::F64
    } else {
        Dtype::F32
    };
    let mut sums = DeviceTensor::alloc(gpu, &[chunks.njobs, cols], acc)?;
    let mut running = DeviceTensor::alloc(gpu, &[chunks.njobs, cols], acc)?;
    let carry = carry
        .map(|c| DeviceTensor::from_slice(gpu, &c))
        .transpose()?;
    let p = prefix(module);
    let sums_ptr = sums.ptr_mut(gpu);
    let pass1 = Pass {
        name: format!("{p}_sums"),
        x,
        y,
        dtypes,
        jobs: &chunks,
        sums: sums_ptr,
        job_carry: 0,
    };
    launch_pass(
        gpu,
        module,
        pass1,
        Layout::Strided,
        cols,
        reverse,
        None,
        gate,
    )?;
    // the running totals: the same scan over the chunk totals (split again when still long)
    launch_strided(
        gpu,
        module,
        &sums,
        &mut running,
        cols,
        &totals,
        reverse,
        None,
        gate,
    )?;
    let pass3 = Pass {
        name: format!("{p}_carry"),
        x,
        y,
        dtypes,
        jobs: &chunks,
        sums: running.ptr(gpu),
        job_carry: carry.as_ref().map_or(0, |c| c.ptr(gpu)),
    };
    launch_pass(
        gpu,
        module,
        pass3,
        Layout::Strided,
        cols,
        reverse,
        scale,
        gate,
    )
}
