//! `chunk_gated_delta_rule_fwd_h_split` on the GPU (`conformance/spec/ops-delta-rule.md` §5): the
//! result of `chunk_gated_delta_rule_fwd_h`, computed by cutting long sequences at chunk boundaries
//! into pieces, summarising every piece but the last of each split sequence (`fwd_h_pre_scan`:
//! `S_out = M S_in + b`), chaining the summaries into the pieces' initial states (the merge:
//! `X ← M X + b` from `initial_state[n]`), and running the recurrence on every piece from its
//! initial state, all pieces at once. Because inner boundaries are chunk-aligned the pieces
//! hold exactly the original chunks in the original packed order: `h` and `v_new` are written
//! in place, and the exit state of each sequence's last piece is its `final_state`.
//!
//! The entry point is [`chunk_gated_delta_rule_fwd_h_split`] with a [`SplitMode`]: `Auto` (the
//! policy of [`super::policy`] decides: serial or split, whichever it estimates faster, with a
//! margin), `Serial`, `Split` (the policy's best split whatever its estimate) or `Pieces` (an
//! explicit `subseq_cu_seqlens`, validated per `conformance/spec/ops-delta-rule.md` §5.2). Like
//! every op of this crate it takes `cu_seqlens` on the host: the policy and the piece tables are
//! computed there, once per [`FwdHSplitPlan`]. A caller whose boundaries live only on the device
//! must copy them to the host first (one synchronisation) or call with `SplitMode::Serial`, which
//! needs nothing the serial op does not.
//!
//! The three stages (pre-scan, merge, re-run) and the final-state copy are queued back to back
//! on the stream with no host synchronisation between them (a checked [`Gpu`] waits once, at
//! the end). A plan allocates its small tables once; a run allocates nothing: its scratch is one
//! [`FwdHSplitWorkspace`] the caller may reuse.

use super::fwd_h::{FwdHDeviceOutputs, FwdHPlan, FwdHTensors};
use super::launch::{code, kernel_choice, queue, state_dtype, FwdHArgs, KernelChoice, Workload};
use super::pieces::Tables;
use super::policy::{split_policy, SplitDecision, SplitQuery};
use super::truncation::{TruncationInputs, TruncationParams, TruncationPolicy};
use crate::device::Gpu;
use crate::error::{GpuError, GpuResult};
use crate::kernels::Module;
use crate::params::dtype_code;
use crate::tensor::DeviceTensor;
use attn_reference::delta::{FwdHParams, Geometry};
use attn_reference::{Dtype, Error};
use cudarc::driver::DeviceRepr;

/// How [`FwdHSplitPlan`] chooses between the serial and the split path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitMode<'a> {
    /// The policy's choice (the fastest path by its estimate; never a split it does not
    /// estimate at least 20% faster).
    Auto,
    /// Always the serial kernel.
    Serial,
    /// The policy's best split even where it estimates no gain (serial when no sequence has
    /// 32 chunks to cut).
    Split,
    /// This `subseq_cu_seqlens` (`conformance/spec/ops-delta-rule.md` §5.1: boundaries over the
    /// flattened tokens).
    Pieces(&'a [i64]),
    /// This `subseq_cu_seqlens` with per-piece `warmup_chunks` (§5.9): a piece with `w > 0`
    /// starts from zero `w` chunks early (from `initial_state` when that reaches its sequence's
    /// start), updating the state only over those chunks; no summary or merge step of its own.
    Warmup {
        subseq_cu_seqlens: &'a [i64],
        warmup_chunks: &'a [i64],
    },
}

/// The stages of a split run, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitStage {
    /// `fwd_h_pre_scan` of every piece but the last of each split sequence.
    PreScan,
    /// The chain of summaries into every piece's initial state.
    Merge,
    /// The recurrence on every piece, and the final-state copy.
    Rerun,
}

impl SplitStage {
    pub const ALL: [SplitStage; 3] = [SplitStage::PreScan, SplitStage::Merge, SplitStage::Rerun];
}

/// Mirror of `SplitMergeArgs` (fwd_h_split.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct SplitMergeArgs {
    hm: u64,
    table: u64,
    h0: u64,
    init: u64,
    n: i64,
    value_heads: i64,
    k_dim: i64,
    v_dim: i64,
    h0_dtype: i64,
    v_first: i64,
    run: u64,
    warm: u64,
}
// SAFETY: plain `#[repr(C)]` data (every field 8 bytes) matching the kernel's struct.
unsafe impl DeviceRepr for SplitMergeArgs {}

/// State columns per merge block (`SPLIT_MERGE_BV`) and M columns per shared tile
/// (`SPLIT_MERGE_LT`).
const MERGE_BV: usize = 8;
const MERGE_LT: usize = 32;

/// The device tables of a split: see fwd_h_split.cu for the piece numbering.
#[derive(Debug)]
struct Split {
    /// The `subseq_cu_seqlens` used.
    pieces: Vec<i64>,
    /// The host tables.
    tables: Tables,
    /// Explicit warm-ups (`SplitMode::Warmup`): `[S]` per re-run row (clamped to the sequence
    /// start) and `[Q]` per summary row (`-1`: not read by the merge, skipped).
    fixed_warm: Option<(DeviceTensor, DeviceTensor)>,
    /// Sequences `N`, pieces `S`, summarised pieces `Q = S − N`.
    n: usize,
    s: usize,
    q: usize,
    pre_choice: KernelChoice,
    /// `[Q, 3]` rows (first token row, length, unused) of the summarised pieces.
    pre_seqs: DeviceTensor,
    /// `[N, 2]`: pieces of sequence `n`, its first summary row.
    merge_table: DeviceTensor,
    run_choice: KernelChoice,
    /// `[S, 3]` rows (first token row, length, first `h` row) of the re-run.
    run_seqs: DeviceTensor,
    /// The pre-scan also summarises the last sequence's last piece, into `hm` row `Q`
    /// ([`FwdHSplitPlan::with_exit_summary`]): the last sequence's first summary row and its
    /// pieces.
    exit: Option<(usize, usize)>,
}

/// The scratch of a split run: summaries, the pieces' initial states, their exit states, and
/// the truncation policy's chunk bounds and per-piece decisions ([`FwdHSplitPlan::run_truncated`]).
#[derive(Debug)]
pub struct FwdHSplitWorkspace {
    hm: Option<DeviceTensor>,
    init: Option<DeviceTensor>,
    ht: Option<DeviceTensor>,
    decision: Option<Decision>,
}

/// The device side of a truncation decision: `bounds` `[C, HV]` f64, `warm` `[S]` and `skip`
/// `[Q]` i64 (see [`TruncationPolicy`]).
#[derive(Debug)]
struct Decision {
    bounds: DeviceTensor,
    warm: DeviceTensor,
    skip: DeviceTensor,
}

/// Where the re-run's warm-ups and the pre-scan's skips come from.
#[derive(Clone, Copy)]
enum WarmSource {
    /// None: every piece exact.
    Exact,
    /// The plan's explicit `warmup_chunks`, or none.
    Plan,
    /// The workspace's decision (written by the truncation policy in the same stream).
    Workspace,
}

/// A validated call with its path chosen and its tables on the device.
#[derive(Debug)]
pub struct FwdHSplitPlan {
    serial: FwdHPlan,
    params: FwdHParams,
    dtype: Dtype,
    decision: Option<SplitDecision>,
    split: Option<Split>,
}

impl FwdHSplitPlan {
    /// Validates the call (`conformance/spec/ops-delta-rule.md` §5.6), chooses the path by `mode`
    /// and uploads the piece tables.
    pub fn new(
        gpu: &Gpu,
        inputs: &FwdHTensors<'_>,
        cu_seqlens: Option<&[i64]>,
        mode: SplitMode<'_>,
        params: &FwdHParams,
    ) -> GpuResult<FwdHSplitPlan> {
        let serial = FwdHPlan::new(gpu, inputs, cu_seqlens, params)?;
        let geo = serial.geometry().clone();
        let dtype = inputs.k.dtype();
        let flat = flat_bounds(&geo);
        let query = SplitQuery {
            cu_seqlens: &flat,
            h: geo.h,
            hv: geo.hv,
            k: geo.k,
            v: geo.v,
            chunk_size: geo.bt,
            dtype,
            sm_count: gpu.sm_count(),
        };
        let (decision, pieces) = match mode {
            SplitMode::Serial => (None, None),
            SplitMode::Pieces(p)
            | SplitMode::Warmup {
                subseq_cu_seqlens: p,
                ..
            } => (None, Some(p.to_vec())),
            SplitMode::Auto | SplitMode::Split => {
                let d = split_policy(&query)?;
                let p = if mode == SplitMode::Auto {
                    d.auto()
                } else {
                    d.forced()
                };
                let p = p.map(<[i64]>::to_vec);
                (Some(d), p)
            }
        };
        let warmup_chunks = match mode {
            SplitMode::Warmup { warmup_chunks, .. } => Some(warmup_chunks),
            _ => None,
        };
        let split = match pieces {
            Some(p) => Split::new(gpu, &geo, cu_seqlens.is_some(), dtype, p, warmup_chunks)?,
            None => None,
        };
        Ok(FwdHSplitPlan {
            serial,
            params: *params,
            dtype,
            decision,
            split,
        })
    }

    /// The plan whose pre-scan also summarises the last piece of the last sequence (one more
    /// `hm` row, `Q`, right after that sequence's other summaries), so that the summaries of all
    /// the last sequence's pieces are consecutive rows ([`Self::exit_summaries`]): chained
    /// from `[0 | I]` they give that sequence's whole map `[b | M]`, the context-parallel
    /// summary of a shard's continuing piece, at the cost of one piece beside the pre-scan.
    /// Exact pieces only: a serial plan, one with explicit warm-ups, or one that leaves the last
    /// sequence whole (its summary would be one serial chain) is returned unchanged, and a run
    /// with the truncation policy ([`Self::run_truncated`]) is refused.
    pub(crate) fn with_exit_summary(mut self, gpu: &Gpu) -> GpuResult<FwdHSplitPlan> {
        let Some(s) = self
            .split
            .as_mut()
            .filter(|s| s.fixed_warm.is_none() && s.exit.is_none())
        else {
            return Ok(self);
        };
        let Some((pre, first, pieces)) = s.tables.with_exit_row() else {
            return Ok(self);
        };
        s.pre_seqs = DeviceTensor::from_slice(gpu, &pre)?;
        s.exit = Some((first, pieces));
        Ok(self)
    }

    /// Where the last run with `ws` of a [`Self::with_exit_summary`] plan left the summaries of
    /// the last sequence's pieces: `hm` (`[Q + 1, HV, K, V + K]`, `[b | M]` per piece), the
    /// first row and the number of pieces, in order (`None` for other plans).
    pub(crate) fn exit_summaries<'w>(
        &self,
        ws: &'w FwdHSplitWorkspace,
    ) -> Option<(&'w DeviceTensor, usize, usize)> {
        let (first, pieces) = self.split.as_ref()?.exit?;
        Some((ws.hm.as_ref()?, first, pieces))
    }

    /// The split used (`subseq_cu_seqlens`), or `None` when the plan runs the serial kernel.
    pub fn pieces(&self) -> Option<&[i64]> {
        self.split.as_ref().map(|s| s.pieces.as_slice())
    }

    /// The policy's estimates (for `Auto` and `Split`).
    pub fn decision(&self) -> Option<&SplitDecision> {
        self.decision.as_ref()
    }

    /// The explicit warm-ups of a `SplitMode::Warmup` plan per piece, each clamped to the piece's
    /// first chunk in its sequence (what runs; `None` for other modes or a serial plan).
    pub fn warmup_chunks(&self) -> Option<Vec<i64>> {
        let s = self.split.as_ref()?;
        s.fixed_warm.as_ref()?;
        Some(s.tables.warmup_in_piece_order(&s.tables.fixed))
    }

    /// The truncation policy of this plan's pieces (`None` when the plan is serial); run it with
    /// [`FwdHSplitPlan::run_truncated`].
    pub fn truncation_policy(
        &self,
        gpu: &Gpu,
        params: &TruncationParams,
    ) -> GpuResult<Option<TruncationPolicy>> {
        self.split
            .as_ref()
            .map(|s| TruncationPolicy::new(gpu, self.geometry(), &s.tables, params))
            .transpose()
    }

    /// The warm-ups the last [`FwdHSplitPlan::run_truncated`] with `ws` chose, per piece in
    /// `subseq_cu_seqlens` order (0: exact summaries). A debug query: it waits for the stream.
    pub fn chosen_warmups(
        &self,
        gpu: &Gpu,
        ws: &FwdHSplitWorkspace,
    ) -> GpuResult<Option<Vec<i64>>> {
        let (Some(s), Some(d)) = (&self.split, &ws.decision) else {
            return Ok(None);
        };
        let rows = d.warm.to_array::<i64>(gpu)?;
        let rows: Vec<i64> = rows.iter().copied().collect();
        Ok(Some(s.tables.warmup_in_piece_order(&rows)))
    }

    /// The kernels of the pre-scan and of the re-run (the serial kernel twice when not split).
    pub fn choices(&self) -> (KernelChoice, KernelChoice) {
        match &self.split {
            Some(s) => (s.pre_choice, s.run_choice),
            None => (self.serial.choice(), self.serial.choice()),
        }
    }

    /// The validated geometry.
    pub fn geometry(&self) -> &Geometry {
        self.serial.geometry()
    }

    /// Fresh (unwritten) outputs of the plan's shapes and dtypes (section 2's).
    pub fn alloc_outputs(&self, gpu: &Gpu) -> GpuResult<FwdHDeviceOutputs> {
        self.serial.alloc_outputs(gpu)
    }

    /// A workspace for [`FwdHSplitPlan::run`] (empty when the plan is serial).
    pub fn alloc_workspace(&self, gpu: &Gpu) -> GpuResult<FwdHSplitWorkspace> {
        let Some(s) = &self.split else {
            return Ok(FwdHSplitWorkspace {
                hm: None,
                init: None,
                ht: None,
                decision: None,
            });
        };
        let g = self.geometry();
        let sd = state_dtype(self.dtype);
        let state = |rows: usize| {
            if self.params.state_v_first {
                [rows, g.hv, g.v, g.k]
            } else {
                [rows, g.hv, g.k, g.v]
            }
        };
        Ok(FwdHSplitWorkspace {
            hm: Some(DeviceTensor::alloc(
                gpu,
                &[s.summaries(), g.hv, g.k, g.v + g.k],
                sd,
            )?),
            init: Some(DeviceTensor::alloc(gpu, &state(s.s), sd)?),
            ht: self
                .params
                .output_final_state
                .then(|| DeviceTensor::alloc(gpu, &state(s.s), sd))
                .transpose()?,
            decision: Some(Decision {
                bounds: DeviceTensor::alloc(gpu, &[s.tables.chunks.len() / 2, g.hv], Dtype::F64)?,
                warm: DeviceTensor::alloc(gpu, &[s.s], Dtype::I64)?,
                skip: DeviceTensor::alloc(gpu, &[s.q], Dtype::I64)?,
            }),
        })
    }

    /// Runs the call on `inputs` (the shapes the plan was made for) into `out`, with `ws` from
    /// [`FwdHSplitPlan::alloc_workspace`] of this plan.
    pub fn run(
        &self,
        gpu: &Gpu,
        inputs: &FwdHTensors<'_>,
        ws: &mut FwdHSplitWorkspace,
        out: &mut FwdHDeviceOutputs,
    ) -> GpuResult<()> {
        self.run_stages(gpu, inputs, ws, out, &SplitStage::ALL)
    }

    /// Runs the call with the warm-ups `policy` (from [`FwdHSplitPlan::truncation_policy`])
    /// decides on the device from `bound` (`conformance/spec/ops-delta-rule.md` §5.10): the bound
    /// and decision kernels, then the stages, queued on the stream with no host synchronisation.
    /// A serial plan runs its kernel.
    pub fn run_truncated(
        &self,
        gpu: &Gpu,
        inputs: &FwdHTensors<'_>,
        bound: &TruncationInputs<'_>,
        policy: &TruncationPolicy,
        ws: &mut FwdHSplitWorkspace,
        out: &mut FwdHDeviceOutputs,
    ) -> GpuResult<()> {
        if self.split.is_none() {
            return self.serial.run(gpu, inputs, out);
        }
        policy.check(self.geometry(), bound)?;
        let Some(d) = ws.decision.as_mut() else {
            return Err(Error::missing(
                "workspace",
                "the workspace of this plan (alloc_workspace)",
                "another one",
            )
            .into());
        };
        policy.queue(gpu, bound, &mut d.bounds, &mut d.warm, &mut d.skip)?;
        self.stages(
            gpu,
            inputs,
            ws,
            out,
            &SplitStage::ALL,
            WarmSource::Workspace,
        )
    }

    /// Runs only the given stages of a split plan (benchmarks time them one by one; the
    /// outputs are complete only when every stage runs, in order). A serial plan runs its
    /// kernel whatever `stages` asks.
    pub fn run_stages(
        &self,
        gpu: &Gpu,
        inputs: &FwdHTensors<'_>,
        ws: &mut FwdHSplitWorkspace,
        out: &mut FwdHDeviceOutputs,
        stages: &[SplitStage],
    ) -> GpuResult<()> {
        self.stages(gpu, inputs, ws, out, stages, WarmSource::Plan)
    }

    fn stages(
        &self,
        gpu: &Gpu,
        inputs: &FwdHTensors<'_>,
        ws: &mut FwdHSplitWorkspace,
        out: &mut FwdHDeviceOutputs,
        stages: &[SplitStage],
        source: WarmSource,
    ) -> GpuResult<()> {
        let Some(s) = &self.split else {
            return self.serial.run(gpu, inputs, out);
        };
        let geo = self.serial.recheck(inputs)?;
        if &geo != self.geometry() || inputs.k.dtype() != self.dtype {
            return Err(Error::shape(
                "k",
                "the shapes and dtype the plan was made for",
                inputs.k.shape(),
            )
            .into());
        }
        self.serial.check_outputs(out)?;
        let (hm, init) = match (&mut ws.hm, &mut ws.init) {
            (Some(hm), Some(init))
                if hm.shape()[0] == s.summaries()
                    && init.shape()[0] == s.s
                    && ws.ht.is_some() == self.params.output_final_state =>
            {
                (hm, init)
            }
            _ => {
                return Err(Error::missing(
                    "workspace",
                    "the workspace of this plan (alloc_workspace)",
                    "another one",
                )
                .into())
            }
        };
        let source = match (source, &s.fixed_warm) {
            (WarmSource::Plan, None) => WarmSource::Exact,
            (src, _) => src,
        };
        if s.exit.is_some() && !matches!(source, WarmSource::Exact) {
            return Err(Error::missing(
                "warmup_chunks",
                "exact pieces (a plan with the exit summary)",
                "warm-ups",
            )
            .into());
        }
        let (warm, skip) = match (source, &s.fixed_warm, &ws.decision) {
            (WarmSource::Exact, ..) => (0, 0),
            (WarmSource::Plan, Some((w, k)), _) => (w.ptr(gpu), k.ptr(gpu)),
            (WarmSource::Workspace, _, Some(d)) => (d.warm.ptr(gpu), d.skip.ptr(gpu)),
            _ => {
                return Err(Error::missing(
                    "workspace",
                    "the workspace of this plan (alloc_workspace)",
                    "another one",
                )
                .into())
            }
        };
        let g = &geo;
        let p = &self.params;
        let base = FwdHArgs {
            k: inputs.k.ptr(gpu),
            w: inputs.w.ptr(gpu),
            u: inputs.u.ptr(gpu),
            g: inputs.g.map_or(0, |t| t.ptr(gpu)),
            gk: inputs.gk.map_or(0, |t| t.ptr(gpu)),
            heads: g.h as i64,
            value_heads: g.hv as i64,
            k_dim: g.k as i64,
            v_dim: g.v as i64,
            bt: g.bt as i64,
            g_dtype: code(inputs.g),
            gk_dtype: code(inputs.gk),
            h0_dtype: -1,
            ..FwdHArgs::default()
        };
        // 1. pre-scan of the summarised pieces into hm
        let bv = s.pre_choice.bv();
        let pre = FwdHArgs {
            seqs: s.pre_seqs.ptr(gpu),
            ht: hm.ptr_mut(gpu),
            cols: (g.v + g.k) as i64,
            nb_b: g.v.div_ceil(bv) as i64,
            split: crate::knobs::prescan_split() as i64,
            warm: skip,
            ..base
        };
        let blocks = g.v.div_ceil(bv) + g.k.div_ceil(bv);
        let on = |st: SplitStage| stages.contains(&st);
        on(SplitStage::PreScan)
            .then(|| {
                queue(
                    gpu,
                    Module::FwdHPreScan,
                    s.pre_choice,
                    self.dtype,
                    s.summaries() * g.hv,
                    blocks,
                    &pre,
                )
            })
            .transpose()?;
        // 2. merge into every piece's initial state
        let sd = state_dtype(self.dtype);
        let merge = SplitMergeArgs {
            hm: hm.ptr(gpu),
            table: s.merge_table.ptr(gpu),
            h0: inputs.initial_state.map_or(0, |t| t.ptr(gpu)),
            init: init.ptr_mut(gpu),
            n: s.n as i64,
            value_heads: g.hv as i64,
            k_dim: g.k as i64,
            v_dim: g.v as i64,
            h0_dtype: code(inputs.initial_state),
            v_first: p.state_v_first as i64,
            run: s.run_seqs.ptr(gpu),
            warm,
        };
        let (kernel, size) = if sd == Dtype::F64 {
            ("fwd_h_split_merge_f64", 8)
        } else {
            ("fwd_h_split_merge_f32", 4)
        };
        if on(SplitStage::Merge) {
            gpu.queue_with_smem(
                Module::FwdHSplit,
                kernel,
                (grid_x(s.n * g.hv)?, g.v.div_ceil(MERGE_BV) as u32),
                256,
                (256 * (MERGE_BV + MERGE_LT) * size) as u32,
                &merge,
            )?;
        }
        // 3. every piece from its initial state
        let bv = s.run_choice.bv();
        let run = FwdHArgs {
            h0: init.ptr(gpu),
            h0_dtype: dtype_code(sd),
            seqs: s.run_seqs.ptr(gpu),
            h: out.h.ptr_mut(gpu),
            v_new: out.v_new.as_mut().map_or(0, |t| t.ptr_mut(gpu)),
            ht: ws.ht.as_mut().map_or(0, |t| t.ptr_mut(gpu)),
            cols: g.v as i64,
            v_first: p.state_v_first as i64,
            nb_b: g.v.div_ceil(bv) as i64,
            warm,
            ..base
        };
        on(SplitStage::Rerun)
            .then(|| {
                queue(
                    gpu,
                    Module::ChunkGatedDeltaRuleFwdH,
                    s.run_choice,
                    self.dtype,
                    s.s * g.hv,
                    g.v.div_ceil(bv),
                    &run,
                )
            })
            .transpose()?;
        // 4. the last pieces' exit states (rows 0 .. N) are the final states
        if let (true, Some(ht), Some(fs)) =
            (on(SplitStage::Rerun), &ws.ht, out.final_state.as_mut())
        {
            let bytes = fs.num_bytes();
            if bytes > 0 {
                let src = ht.buffer().slice(0..bytes);
                let mut dst = fs.buffer_mut().slice_mut(0..bytes);
                gpu.stream()
                    .memcpy_dtod(&src, &mut dst)
                    .map_err(GpuError::driver("final-state copy"))?;
            }
        }
        gpu.wait_if_checked("chunk_gated_delta_rule_fwd_h_split")
    }
}

impl Split {
    /// The pre-scan's rows: `Q`, and the exit summary's.
    fn summaries(&self) -> usize {
        self.q + self.exit.is_some() as usize
    }

    /// The device side of [`Tables::new`] with the kernels of both launches.
    fn new(
        gpu: &Gpu,
        geo: &Geometry,
        varlen: bool,
        dtype: Dtype,
        pieces: Vec<i64>,
        warmup_chunks: Option<&[i64]>,
    ) -> GpuResult<Option<Split>> {
        let Some(t) = Tables::new(geo, varlen, &pieces, warmup_chunks)? else {
            return Ok(None);
        };
        let choice = |groups: &[usize], rows: &[i64], warm: &[i64]| {
            let mut chunks = Tables::chunks(rows, geo.bt);
            // warm-up chunks run too; a skipped row (-1) runs none
            for (c, &w) in chunks.iter_mut().zip(warm) {
                *c = if w < 0 { 0 } else { *c + w as usize };
            }
            kernel_choice(
                &Workload {
                    dtype,
                    k: geo.k,
                    col_groups: groups,
                    seq_chunks: &chunks,
                    hv: geo.hv,
                },
                gpu.sm_count(),
            )
        };
        let (n, q) = (geo.n(), t.pre.len() / 3);
        let fixed_warm = warmup_chunks
            .map(|_| -> GpuResult<_> {
                Ok((
                    DeviceTensor::from_slice(gpu, &t.fixed)?,
                    DeviceTensor::from_slice(gpu, &t.skip)?,
                ))
            })
            .transpose()?;
        Ok(Some(Split {
            pieces,
            n,
            s: n + q,
            q,
            pre_choice: choice(
                &[geo.v, geo.k],
                &t.pre,
                if fixed_warm.is_some() { &t.skip } else { &[] },
            ),
            pre_seqs: DeviceTensor::from_slice(gpu, &t.pre)?,
            merge_table: DeviceTensor::from_slice(gpu, &t.merge)?,
            run_choice: choice(&[geo.v], &t.run, &t.fixed),
            run_seqs: DeviceTensor::from_slice(gpu, &t.run)?,
            fixed_warm,
            tables: t,
            exit: None,
        }))
    }
}

/// The sequence boundaries over the flattened `B · T` tokens (`cu_seqlens`, or `[0, T, 2T, …]`).
fn flat_bounds(geo: &Geometry) -> Vec<i64> {
    std::iter::once(0)
        .chain(geo.seqs.iter().map(|s| (s.batch * geo.t + s.eos) as i64))
        .collect()
}

/// A grid extent, refused beyond `2^31 − 1` blocks.
fn grid_x(tasks: usize) -> GpuResult<u32> {
    u32::try_from(tasks)
        .ok()
        .filter(|&x| x <= i32::MAX as u32)
        .ok_or_else(|| Error::shape("u", "N * HV < 2^31", vec![tasks]).into())
}

/// `chunk_gated_delta_rule_fwd_h` computed the fastest way `mode` allows, into new outputs
/// (`conformance/spec/ops-delta-rule.md` §2.3 / §5.1): the user-facing entry point. `mode =
/// SplitMode::Pieces(subseq_cu_seqlens)` is the spec's explicit split, `SplitMode::Auto` its
/// "implementation chooses".
pub fn chunk_gated_delta_rule_fwd_h_split(
    gpu: &Gpu,
    inputs: &FwdHTensors<'_>,
    cu_seqlens: Option<&[i64]>,
    mode: SplitMode<'_>,
    params: &FwdHParams,
) -> GpuResult<FwdHDeviceOutputs> {
    let plan = FwdHSplitPlan::new(gpu, inputs, cu_seqlens, mode, params)?;
    let mut ws = plan.alloc_workspace(gpu)?;
    let mut out = plan.alloc_outputs(gpu)?;
    plan.run(gpu, inputs, &mut ws, &mut out)?;
    Ok(out)
}
