//! The whole delta-rule forwards on the GPU: `kda_fwd` and `gdn_fwd`
//! (`conformance/spec/ops-delta-rule.md` §6, §8).
//!
//! The intra stage ([`super::intra`]) prepares per token `w, u, kg, qg, Aqk`, the fp32 row
//! factors `qf` (the scale; GDN's `exp2(G_r)`) and per chunk `exp2(G_ℓ)`. Then, per (sequence,
//! value head), the state recurrence and the output, in one of two paths:
//!
//! - **fused** (bf16/f16, `K ≤ 128`; `delta_fwd.cu`): one kernel carries `S` on chip through
//!   the chunks, `D = u − w S`, `o = diag(qf) qg S + Aqk D`, `S ← diag(exp2(G_ℓ)) S + kgᵀ D`,
//!   writing `o` and the final state only;
//! - **staged** (every dtype, `K` up to 256): §2's `chunk_gated_delta_rule_fwd_h` on
//!   `kg, w, u, G` writes `h` and `v_new` (bf16 / f16: through §5's split in its automatic
//!   mode, exact summaries and a merge where its policy expects a gain), and an output kernel
//!   forms `o = diag(qf) qg h + Aqk v_new`: the checkable stages.
//!
//! GDN is the same with the scalar gate broadcast over `K` (§8.5); its staged path passes the
//! raw keys and `g = G` to `fwd_h`, as FLA does. Its fused path is leaner: with a scalar gate
//! `u − w S = Akk diag(β) (V − diag(exp2(G)) K S)`, so the intra stage writes only
//! `Tb = Akk diag(β)` (hi + lo halves), `Aqk` and `G`, and the fused kernel reads `q, k, v`
//! themselves (`delta_fused_gdn`; the normalised `q, k` with l2norm). Both fused kernels split
//! long sequences into pieces with exact warm-ups when the GPU would otherwise idle
//! ([`SplitRule`], §5.9–5.10). Where the gates do not let the pieces warm up (long memory,
//! slow heads) and the chain left serial would cost more than the staged path
//! ([`FALLBACK_COST_RATIO`]), a splitting plan over a sequence long enough for that
//! ([`EXACT_FALLBACK_CHUNKS`] chunks or more, and the call's chunk-heads over the ratio) runs the
//! staged path instead, whose `fwd_h` split is exact without warm-ups:
//! the choice is the warm-up policy's, read on the host once per run
//! ([`DeltaFwdPlan::ran_exact_fallback`]).
//! Float32 runs IEEE fp32 FMAs throughout, float64 fp64.

use super::fwd_h::{FwdHDeviceOutputs, FwdHTensors};
use super::intra::{
    acc_dtype, chunk_table, launch_gdn_intra, launch_intra, tag, IntraArgs, KT, MAX_BT, THREADS,
};
use super::intra_pipe;
use super::launch::{cheapest_width, grid_x, seq_table, SMEM_PER_SM};
use super::lean::{FusedArgs, GdnFusedArgs};
use super::split::{FwdHSplitPlan, FwdHSplitWorkspace, SplitMode, SplitStage};
use super::wg::{self, GdnWgArgs, KdaWgArgs};
use crate::device::Gpu;
use crate::error::GpuResult;
use crate::kernels::Module;
use crate::knobs;
use crate::params::{dtype_code, GateArgs};
use crate::tensor::DeviceTensor;
use attn_reference::delta::{
    validate_delta_dtypes, validate_gdn_fwd, validate_kda_fwd, DeltaDtypes, FwdHParams,
    GdnFwdParams, GdnFwdShapes, Geometry, KdaFwdParams, KdaFwdShapes,
};
use attn_reference::{Dtype, Error};
use cudarc::driver::DeviceRepr;

/// Which recurrence runs a forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardPath {
    /// Fused where it applies (bf16/f16 with `K ≤ 128`), else staged.
    Auto,
    /// `fwd_h` writing `h` and `v_new`, then the output kernel.
    Staged,
    /// The fused recurrence and output (bf16/f16, `K ≤ 128`; an error elsewhere).
    Fused,
}

/// The device tensors of a `kda_fwd` or `gdn_fwd` call (`conformance/spec/ops-delta-rule.md` §6.1,
/// 8.1).
#[derive(Debug, Clone, Copy)]
pub struct ForwardTensors<'a> {
    /// `[B, T, H, K]`.
    pub q: &'a DeviceTensor,
    /// `[B, T, H, K]`.
    pub k: &'a DeviceTensor,
    /// `[B, T, HV, V]`.
    pub v: &'a DeviceTensor,
    /// KDA `[B, T, HV, K]` (natural-log decay, or the gate input with `use_gate_in_kernel`);
    /// GDN `[B, T, HV]`.
    pub g: &'a DeviceTensor,
    /// `[B, T, HV]`.
    pub beta: &'a DeviceTensor,
    pub initial_state: Option<&'a DeviceTensor>,
    /// `[HV]` (KDA with `use_gate_in_kernel`).
    pub a_log: Option<&'a DeviceTensor>,
    /// `[HV · K]` (KDA with `use_gate_in_kernel`).
    pub dt_bias: Option<&'a DeviceTensor>,
}

impl<'a> ForwardTensors<'a> {
    /// The required tensors; every optional one absent.
    pub fn new(
        q: &'a DeviceTensor,
        k: &'a DeviceTensor,
        v: &'a DeviceTensor,
        g: &'a DeviceTensor,
        beta: &'a DeviceTensor,
    ) -> Self {
        ForwardTensors {
            q,
            k,
            v,
            g,
            beta,
            initial_state: None,
            a_log: None,
            dt_bias: None,
        }
    }

    fn dtypes(&self) -> attn_reference::Result<()> {
        let mut float = vec![("g", self.g.dtype()), ("beta", self.beta.dtype())];
        for (n, t) in [
            ("initial_state", self.initial_state),
            ("A_log", self.a_log),
            ("dt_bias", self.dt_bias),
        ] {
            if let Some(t) = t {
                float.push((n, t.dtype()));
            }
        }
        validate_delta_dtypes(&DeltaDtypes {
            main: vec![
                ("q", self.q.dtype()),
                ("k", self.k.dtype()),
                ("v", self.v.dtype()),
            ],
            float,
            ..DeltaDtypes::default()
        })
    }
}

/// Outputs of `kda_fwd` / `gdn_fwd` (`conformance/spec/ops-delta-rule.md` §6.3, 8.3): `o` in `q`'s
/// dtype; the final state in float32 (float64 for float64 inputs) when asked.
#[derive(Debug)]
pub struct DeltaFwdDeviceOutputs {
    pub o: DeviceTensor,
    pub final_state: Option<DeviceTensor>,
}

/// Mirror of `OutArgs` (kda_intra.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct OutArgs {
    qg: u64,
    qf: u64,
    h: u64,
    aqk: u64,
    v_new: u64,
    o: u64,
    chunks: u64,
    value_heads: i64,
    k_dim: i64,
    v_dim: i64,
    bt: i64,
    v_first: i64,
}
// SAFETY: as above.
unsafe impl DeviceRepr for OutArgs {}

/// Mirror of `ExpandArgs` (kda_intra.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct ExpandArgs {
    q: u64,
    k: u64,
    v: u64,
    tbh: u64,
    tbl: u64,
    g: u64,
    chunks: u64,
    w: u64,
    u: u64,
    kg: u64,
    qg: u64,
    qf: u64,
    gate: u64,
    heads: i64,
    value_heads: i64,
    k_dim: i64,
    v_dim: i64,
    bt: i64,
    scale: f64,
}
// SAFETY: as above.
unsafe impl DeviceRepr for ExpandArgs {}

/// Mirror of `WarmArgs` (delta_fwd.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct WarmArgs {
    pieces: u64,
    g: u64,
    beta: u64,
    k: u64,
    lam: u64,
    heads: i64,
    value_heads: i64,
    k_dim: i64,
    bt: i64,
    npieces: i64,
    wmax: i64,
    g_dtype: i64,
    beta_dtype: i64,
    l2norm: i64,
}
// SAFETY: as above.
unsafe impl DeviceRepr for WarmArgs {}

/// Mirror of `KdaWarmArgs` (delta_fwd.cu): GDN's arguments and the KDA gate's.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct KdaWarmArgs {
    w: WarmArgs,
    gate: GateArgs,
    gate_mode: i64,
    beta_mode: i64,
}
// SAFETY: as above.
unsafe impl DeviceRepr for KdaWarmArgs {}

/// The fields of a fused kernel's arguments that name its pieces: the table and its rows, the
/// warm-ups (0: none), the verdict (0: none) and which side of it the launch runs (`gate_mode`
/// 0: all, 1: the split, 2: the serial run).
trait PieceArgs: DeviceRepr + Copy {
    fn with_pieces(self, pieces: u64, npieces: usize, warm: u64, gate: u64, gate_mode: i64)
        -> Self;
}

/// `PieceArgs` for the `mma.sync` kernels' argument structs (the piece fields in place) and for
/// the Hopper kernels' (the same fields in their `a`).
macro_rules! piece_args {
    ($($t:ty),*) => {$(
        impl PieceArgs for $t {
            fn with_pieces(self, pieces: u64, npieces: usize, warm: u64, gate: u64, gate_mode: i64) -> Self {
                let npieces = npieces as i64;
                Self { pieces, npieces, warm, gate, gate_mode, ..self }
            }
        }
    )*};
    (wrapped $($t:ty),*) => {$(
        impl PieceArgs for $t {
            fn with_pieces(self, pieces: u64, npieces: usize, warm: u64, gate: u64, gate_mode: i64) -> Self {
                Self { a: self.a.with_pieces(pieces, npieces, warm, gate, gate_mode), ..self }
            }
        }
    )*};
}
piece_args!(FusedArgs, GdnFusedArgs);
piece_args!(wrapped KdaWgArgs, GdnWgArgs);

/// Mirror of `WalkArgs` (delta_fwd.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct WalkArgs {
    pieces: u64,
    lam: u64,
    warm: u64,
    gate: u64,
    value_heads: i64,
    bt: i64,
    npieces: i64,
    wmax: i64,
    max_chain: i64,
    log_eps: f64,
}
// SAFETY: as above.
unsafe impl DeviceRepr for WalkArgs {}

/// The automatic split of the fused paths of `gdn_fwd` and `kda_fwd`
/// (`conformance/spec/ops-delta-rule.md` §5.9–5.10):
/// where the estimated makespan of its (piece, head, column block) CTAs beats the serial run
/// ([`split_choice`]), its long sequences are cut into pieces at chunk boundaries, each piece (after the first) starting from a
/// zero state `w` chunks early, the least `w ≤ max_warmup_chunks` whose bound `Λ` (§5.10,
/// computed on the device from `g`, `β` and the key norms; KDA: each token's largest per-key
/// decay after the in-kernel gate) is at most `ln 2^-30`. A piece with no
/// such `w` (long memory) is run through by the CTA of the piece before it: the result stays
/// exact and the call never slower than a serial run by more than the bound kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitRule {
    /// Fewest chunks of a piece.
    pub min_piece_chunks: usize,
    /// Most warm-up chunks of a piece (at most 64).
    pub max_warmup_chunks: usize,
}

impl Default for SplitRule {
    fn default() -> Self {
        SplitRule {
            min_piece_chunks: 32,
            max_warmup_chunks: 32,
        }
    }
}

/// Threads of `gdn_warm_bounds` and `kda_warm_bounds` (`WARM_THREADS`).
const WARM_THREADS: u32 = 256;

/// Threads of `warm_walk` (`WALK_THREADS`: a warp per (piece, value head)).
const WALK_THREADS: u32 = 128;

/// Most chunks a warm-up spans (the bound tensor's window per piece: `warm_window`).
const MAX_WARMUP_CHUNKS: usize = 64;

/// `ln 2^-30`: the truncation error the warm-ups allow, relative to the state's norm.
pub(crate) const LOG_EPS: f64 = -30.0 * std::f64::consts::LN_2;

/// Pieces per sequence for a launch of `heads · blocks` CTAs per piece (value heads × column
/// blocks) with `resident` CTAs on the GPU at once (multiprocessors × resident blocks each),
/// sized for the makespan rather than for one wave: with `slots = resident / (heads · blocks)`
/// piece slots, the target piece length is `L = max(rule.min_piece_chunks, ⌈Σ chunks / slots⌉)`
/// and a sequence of `c > L` chunks gets `⌈c / L⌉` pieces (never one shorter than
/// `min_piece_chunks`), later pieces running in later waves. The kernel's grid dispatches the
/// CTAs of the table in order (heads fastest, the column block slowest), so whether the pieces
/// beyond one wave wait for short ones depends on `L`: `L` and the lengths `⌈longest / m⌉`
/// (`m` up to twice the longest sequence's pieces at `L` and at most `slots`) are scored by
/// `makespan` and the least wins (fewer pieces on a tie; one piece per sequence when none
/// beats it). No sequence is split when none is longer than `L`.
pub fn split_pieces(
    seq_chunks: &[usize],
    heads: usize,
    blocks: usize,
    resident: usize,
    rule: &SplitRule,
) -> Vec<usize> {
    let ones = vec![1; seq_chunks.len()];
    let min_piece = rule.min_piece_chunks.max(1);
    let slots = (resident / (heads.max(1) * blocks.max(1))).max(1);
    let total: usize = seq_chunks.iter().sum();
    let longest = seq_chunks.iter().copied().max().unwrap_or(0);
    let target = min_piece.max(total.div_ceil(slots));
    if longest <= target || longest < 2 * min_piece {
        return ones;
    }
    let per = |len: usize| -> Vec<usize> {
        seq_chunks
            .iter()
            .map(|&c| match c <= len {
                true => 1,
                false => c.div_ceil(len).min(c / min_piece).max(1),
            })
            .collect()
    };
    let cost = |p: &[usize]| makespan(&piece_steps(seq_chunks, p), heads, blocks, resident);
    // at most one piece slot per piece of a sequence: more would queue pieces of the same
    // sequence behind each other, for gains (packing around short sequences) within what the
    // makespan leaves out (each CTA's prologue and state store, the policy per piece)
    let most = (2 * longest.div_ceil(target))
        .min(slots)
        .min(longest / min_piece);
    let mut lens: Vec<usize> = (2..=most)
        .map(|m| min_piece.max(longest.div_ceil(m)))
        .chain([target])
        .collect();
    lens.sort_unstable_by(|a, b| b.cmp(a));
    lens.dedup();
    let mut best = (cost(&ones), ones);
    for len in lens {
        let p = per(len);
        let t = cost(&p);
        if t < best.0 {
            best = (t, p);
        }
    }
    best.1
}

/// The rows of the pieces table for `per_seq[s]` even pieces of sequence `s` (of
/// `seq_chunks[s]` chunks): `(sequence, first chunk, end chunk)`, the sequences with the longest
/// pieces first (ties in sequence order; the grid dispatches rows in order, so the longest
/// chains start in the first wave), each sequence's pieces contiguous and in order (the
/// run-through scans of the kernel and of `warm_walk` read `p + 1, p + 2, …`).
pub fn piece_rows(seq_chunks: &[usize], per_seq: &[usize]) -> Vec<(usize, usize, usize)> {
    let mut order: Vec<usize> = (0..seq_chunks.len().min(per_seq.len())).collect();
    order.sort_by_key(|&s| std::cmp::Reverse(piece_len(seq_chunks[s], per_seq[s])));
    order
        .into_iter()
        .flat_map(|s| {
            let (c, m) = (seq_chunks[s], per_seq[s].max(1));
            (0..m).map(move |j| (s, j * c / m, (j + 1) * c / m))
        })
        .collect()
}

/// The chunk steps of a sequence's longest piece: its chunks and one warm-up chunk when split.
fn piece_len(c: usize, m: usize) -> usize {
    c.div_ceil(m.max(1)) + usize::from(m > 1)
}

/// Chunk steps of each row of the pieces table ([`piece_rows`]): its chunks, plus one warm-up
/// chunk for a sequence's later pieces (the strong-decay case the split is sized for).
fn piece_steps(seq_chunks: &[usize], per_seq: &[usize]) -> Vec<usize> {
    piece_rows(seq_chunks, per_seq)
        .into_iter()
        .map(|(_, a, e)| e - a + usize::from(a > 0))
        .collect()
}

/// Most CTAs [`makespan`] schedules one by one; a larger grid takes the closed form.
const MAKESPAN_SIM_CTAS: usize = 1 << 18;

/// Chunk steps until the last CTA of a grid ends: `heads` CTAs per row of `steps` (one row per
/// piece, in table order), all of them once per column block, dispatched in grid order (row and
/// head fastest, the column block slowest) each to the first of `resident` slots that frees up
/// (list scheduling, each CTA its row's steps at the same cost per step). Past
/// [`MAKESPAN_SIM_CTAS`] CTAs: `max(longest row, all CTA-steps / resident)`.
fn makespan(steps: &[usize], heads: usize, blocks: usize, resident: usize) -> usize {
    use std::cmp::Reverse;
    let longest = steps.iter().copied().max().unwrap_or(0);
    let ctas = steps.len() * heads * blocks;
    let resident = resident.max(1);
    if ctas <= resident {
        return longest;
    }
    if ctas > MAKESPAN_SIM_CTAS {
        let work: usize = steps.iter().sum::<usize>() * heads * blocks;
        return longest.max(work.div_ceil(resident));
    }
    let mut free: std::collections::BinaryHeap<Reverse<usize>> =
        std::iter::repeat_n(Reverse(0), resident).collect();
    let mut end = 0;
    for _ in 0..blocks {
        for &s in steps {
            for _ in 0..heads {
                if let Some(mut slot) = free.peek_mut() {
                    slot.0 += s;
                    end = end.max(slot.0);
                }
            }
        }
    }
    end
}

/// Relative cost of one chunk step of a fused kernel by its column width, in steps of the same
/// kernel at 16 columns (H100, K = 128), in the regime the split decides in: one CTA per SM, a
/// step's latency. The lean GDN kernel: about 2.7 µs per step at 16 columns and 5.9 at 64 (S9:
/// `fwd_gdn_h4_4x8192` serial, 128 chunks in 0.343 ms, and its strong-decay split, 4 waves of 9
/// steps in 0.214 ms; S6's 2.9 / 3.4 / 4.6 µs predate the kernel's present form), 32 columns
/// taken at the recurrence kernel's measured 1.5 (NOTES.md, session 5). The KDA kernel
/// (`delta_fused`): about 2.6, 3.6 and 7.3 µs (S8: the serial rows at 16 and 32 columns, the
/// split rows at 64 less their warm-up policy). The Hopper kernel (`wg`, 64 columns): 1.13 µs
/// (S19-W4: the serial H 4 × 131072 row less its intra stage, over 2048 steps).
fn step_cost(c: FusedChoice) -> f64 {
    if c.wg {
        return 0.4;
    }
    match (c.lean, c.bv) {
        (_, 16) => 1.0,
        (true, 32) => 1.5,
        (true, _) => 2.2,
        (false, 32) => 1.4,
        (false, _) => 2.8,
    }
}

/// The estimated time (in 16-column steps) of a fused kernel at `choice`'s width over `per_seq`
/// pieces of the sequences' chunks: `step_cost(choice) ·` the [`makespan`] of its grid (the
/// pieces table's rows, one warm-up chunk for each later piece, `HV` heads, the column blocks,
/// the CTAs resident at once), at least the longest piece and all CTA-steps / resident CTAs.
fn fused_estimate(
    choice: FusedChoice,
    v: usize,
    seq_chunks: &[usize],
    per_seq: &[usize],
    hv: usize,
    sm_count: usize,
) -> f64 {
    let steps = piece_steps(seq_chunks, per_seq);
    let blocks = v.div_ceil(choice.bv);
    let span = makespan(&steps, hv, blocks, choice.resident_ctas(sm_count));
    step_cost(choice) * span as f64
}

/// The split of a fused path (GDN's lean kernel or KDA's) under `rule`: the serial run (one piece per sequence at the
/// `serial` width) against, per allowed column width, the pieces of [`split_pieces`] and their
/// `fused_estimate`; a split (some sequence in more than one piece) wins only with a strictly
/// lower estimate than the serial run and every earlier candidate. A wider width than
/// `serial`'s runs fewer CTAs per piece, so more pieces fill the GPU when the gates let them
/// warm up.
pub fn split_choice(
    v: usize,
    seq_chunks: &[usize],
    hv: usize,
    sm_count: usize,
    serial: FusedChoice,
    rule: &SplitRule,
) -> (FusedChoice, Vec<usize>) {
    let ones = vec![1; seq_chunks.len()];
    let est = fused_estimate(serial, v, seq_chunks, &ones, hv, sm_count);
    let mut best = (serial, ones, est);
    let forced = crate::knobs::fwd_bv().is_some() || serial.wg;
    let widths = fused_widths(v)
        .into_iter()
        .filter(|&bv| !forced && bv != serial.bv);
    for bv in [serial.bv].into_iter().chain(widths) {
        let c = FusedChoice { bv, ..serial };
        let blocks = v.div_ceil(bv);
        let per = split_pieces(seq_chunks, hv, blocks, c.resident_ctas(sm_count), rule);
        if per.iter().all(|&m| m <= 1) {
            continue;
        }
        let est = fused_estimate(c, v, seq_chunks, &per, hv, sm_count);
        if est < best.2 {
            best = (c, per, est);
        }
    }
    (best.0, best.1)
}

/// The chunks of every sequence of `geo`.
fn seq_chunks(geo: &Geometry) -> Vec<usize> {
    geo.seqs.iter().map(|s| s.num_chunks(geo.bt)).collect()
}

/// The pieces table of the fused kernels (`[P, 5]`: first row, length, the sequence's first
/// and end rows, the sequence), `pieces[s]` even pieces of sequence `s` at chunk boundaries, in
/// the order of [`piece_rows`].
fn piece_table(geo: &Geometry, pieces: &[usize]) -> Vec<i64> {
    let chunks = seq_chunks(geo);
    let mut rows = Vec::new();
    for (i, a, e) in piece_rows(&chunks, pieces) {
        let s = &geo.seqs[i];
        let base = s.batch * geo.t;
        let first = s.bos + a * geo.bt;
        let last = (s.bos + e * geo.bt).min(s.eos);
        rows.extend(
            [base + first, last - first, base + s.bos, base + s.eos, s.n].map(|x| x as i64),
        );
    }
    rows
}

/// How a forward's gate input is read (`gate_mode` of `IntraArgs`: 1, 2; `kda_intra` reads
/// `G` itself, mode 0).
#[derive(Debug, Clone, Copy, PartialEq)]
enum GateInput {
    /// The per-step natural-log decay `a`.
    Decay,
    /// The input of the KDA gate (`use_gate_in_kernel`), with its lower bound.
    InKernel(Option<f64>),
}

/// The shape-independent description of one forward: its gate, preprocessing and scale.
#[derive(Debug, Clone, Copy)]
struct Prep {
    gate: GateInput,
    scalar_gate: bool,
    l2norm: bool,
    /// 0: β as given; 1: sigmoid; 2: 2 · sigmoid.
    beta_mode: i64,
    /// The caller's promise of per-step gates in `[−5, 0]` (spec 6.3).
    safe_gate: bool,
    scale: f64,
}

/// The op and parameters of a forward (its validation).
#[derive(Debug, Clone, Copy)]
enum Call {
    Kda(KdaFwdParams),
    Gdn(GdnFwdParams),
}

impl Call {
    /// Spec 1.5 and 6.7 / 8.7 plus the GPU's dtype rules, on `t`'s shapes and dtypes.
    fn validate(
        &self,
        t: &ForwardTensors<'_>,
        cu_seqlens: Option<&[i64]>,
    ) -> attn_reference::Result<Geometry> {
        if let Call::Gdn(_) = self {
            for (arg, x) in [("A_log", t.a_log), ("dt_bias", t.dt_bias)] {
                if let Some(x) = x {
                    return Err(Error::missing(
                        arg,
                        "no tensor (gdn_fwd takes the decay g itself)",
                        format!("a tensor of shape {:?}", x.shape()),
                    ));
                }
            }
        }
        t.dtypes()?;
        match self {
            Call::Kda(p) => validate_kda_fwd(
                &KdaFwdShapes {
                    q: t.q.shape(),
                    k: t.k.shape(),
                    v: t.v.shape(),
                    g: t.g.shape(),
                    beta: t.beta.shape(),
                    initial_state: t.initial_state.map(|x| x.shape()),
                    a_log: t.a_log.map(|x| x.shape()),
                    dt_bias: t.dt_bias.map(|x| x.shape()),
                },
                cu_seqlens,
                p,
            ),
            Call::Gdn(p) => validate_gdn_fwd(
                &GdnFwdShapes {
                    q: t.q.shape(),
                    k: t.k.shape(),
                    v: t.v.shape(),
                    g: t.g.shape(),
                    beta: t.beta.shape(),
                    initial_state: t.initial_state.map(|x| x.shape()),
                },
                cu_seqlens,
                p,
            ),
        }
    }

    /// The intra stage's gate, preprocessing and scale for `K` keys.
    fn prep(&self, k: usize) -> Prep {
        match self {
            Call::Kda(p) => Prep {
                gate: if p.use_gate_in_kernel {
                    GateInput::InKernel(p.lower_bound)
                } else {
                    GateInput::Decay
                },
                scalar_gate: false,
                l2norm: p.use_qk_l2norm_in_kernel,
                beta_mode: match (p.use_beta_sigmoid_in_kernel, p.allow_neg_eigval) {
                    (false, _) => 0,
                    (true, false) => 1,
                    (true, true) => 2,
                },
                safe_gate: p.safe_gate,
                scale: p.scale.unwrap_or(1.0 / (k as f64).sqrt()),
            },
            Call::Gdn(p) => Prep {
                gate: GateInput::Decay,
                scalar_gate: true,
                l2norm: p.use_qk_l2norm_in_kernel,
                beta_mode: 0,
                safe_gate: false,
                scale: p.scale.unwrap_or(1.0 / (k as f64).sqrt()),
            },
        }
    }

    /// `(output_final_state, state_v_first)`.
    fn state_flags(&self) -> (bool, bool) {
        match self {
            Call::Kda(p) => (p.output_final_state, p.state_v_first),
            Call::Gdn(p) => (p.output_final_state, p.state_v_first),
        }
    }
}

/// The fused kernel's tile shape: keys padded to `kp` (64, 128), `bv` state columns per block;
/// `lean`: the GDN kernel on `q, k, v` and `Akk diag(β)` (`delta_fused_gdn`), else the kernel on
/// the intra stage's `w, u, kg, qg` (`delta_fused`); `wg`: either on its Hopper kernel
/// (`delta_fwd_gdn_wg_bf16`, `delta_fwd_kda_wg_bf16`: `kp` 128, `bv` 64).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FusedChoice {
    pub kp: usize,
    pub bv: usize,
    pub lean: bool,
    pub wg: bool,
}

impl FusedChoice {
    /// CTAs of this tile shape resident at once on `sm_count` multiprocessors (one per
    /// multiprocessor unless shared memory allows more).
    pub fn resident_ctas(self, sm_count: usize) -> usize {
        sm_count.max(1) * (SMEM_PER_SM / self.smem_bytes().max(1)).max(1)
    }

    /// Dynamic shared memory of `GdnFusedSmem<T, kp, bv>` / `FusedSmem<T, kp, bv>`
    /// (half-precision elements), or of the Hopper kernel.
    fn smem_bytes(self) -> usize {
        if self.wg {
            return wg::WG_SMEM;
        }
        let (kpitch, vpitch, apitch) = (self.kp + 8, self.bv + 8, MAX_BT + 8);
        if self.lean {
            // k, q, v, Tb hi + lo, Aqk (two buffers each), G; S; W, D, D'
            let tiles = 2 * MAX_BT * (2 * kpitch + vpitch + 3 * apitch) * 2;
            tiles + 2 * MAX_BT * 4 + (self.kp + 3 * MAX_BT) * vpitch * 2
        } else {
            let tiles = 2 * MAX_BT * (3 * kpitch + vpitch + apitch) * 2;
            tiles + 2 * (self.kp + MAX_BT) * 4 + (self.kp + MAX_BT) * vpitch * 2
        }
    }
}

/// The fused kernel's tiles for `K` keys, `V` columns, the chunks of every sequence and `HV`
/// heads on `sm_count` multiprocessors: the width with the least estimated time
/// `step_cost(bv) · max(chunks of the longest sequence, block-chunks / resident blocks)`
/// (as `kernel_choice` of fwd_h). `$ATTN_FWD_BV` overrides the width (a tuning knob). `wg`: the
/// call fits the Hopper kernels, which then run at their one shape.
pub fn fused_choice(
    k: usize,
    v: usize,
    seq_chunks: &[usize],
    hv: usize,
    sm_count: usize,
    lean: bool,
    wg: bool,
) -> FusedChoice {
    if wg {
        return FusedChoice {
            kp: 128,
            bv: 64,
            lean,
            wg,
        };
    }
    let kp = if k <= 64 { 64 } else { 128 };
    let allowed = fused_widths(v);
    let forced = crate::knobs::fwd_bv().filter(|bv| allowed.contains(bv));
    let bv = forced.unwrap_or_else(|| {
        cheapest_width(&allowed, seq_chunks, hv, sm_count, |bv| {
            let c = FusedChoice {
                kp,
                bv,
                lean,
                wg: false,
            };
            (c.smem_bytes(), v.div_ceil(bv))
        })
    });
    FusedChoice {
        kp,
        bv,
        lean,
        wg: false,
    }
}

/// The fused kernels' column widths for `V` columns (16 always; 32 and 64 when `V` needs more
/// than half of them).
fn fused_widths(v: usize) -> Vec<usize> {
    [64, 32, 16]
        .into_iter()
        .filter(|&bv| bv == 16 || bv / 2 < v)
        .collect()
}

/// Value columns per CTA of the tensor-core output kernel (`OUTM_BV`).
const OUT_MMA_BV: usize = 64;

/// Smem bytes of the FMA output kernel (`OutSmem<Acc>`).
fn out_smem(dtype: Dtype) -> u32 {
    ((MAX_BT * (KT + 1) + KT * (KT + 1)) * acc_dtype(dtype).size_bytes()) as u32
}

/// A validated forward and its device tables, reusable across launches on tensors of the same
/// shapes (benchmarks time [`DeltaFwdPlan::run`] alone).
#[derive(Debug)]
pub struct DeltaFwdPlan {
    call: Call,
    geo: Geometry,
    varlen: bool,
    dtype: Dtype,
    prep: Prep,
    output_final_state: bool,
    state_v_first: bool,
    fused: Option<FusedChoice>,
    chunks: DeviceTensor,
    nchunks: usize,
    /// The sequence table of the KDA fused kernel (`seq_table`: its chunk bases, the rows of
    /// each sequence's `exp2(G_ℓ)`), when that kernel runs.
    seqs: Option<DeviceTensor>,
    /// The fused path's pieces.
    pieces: Option<Pieces>,
    split_rule: Option<SplitRule>,
    /// The staged path's `fwd_h` call (its plan is made on the workspace's tensors).
    cu_seqlens: Option<Vec<i64>>,
    /// The exact fallback: the same call on the staged path, whose `fwd_h` splits with exact
    /// summaries ([`Staged`]); run instead of the fused split when the warm-up policy leaves a
    /// long chain serial ([`Self::needs_exact_fallback`]). Made where the fused path splits a
    /// sequence long enough for that ([`exact_fallback_possible`]: at least
    /// [`EXACT_FALLBACK_CHUNKS`] chunks and the call's chunk-heads over the cost ratio).
    fallback: Option<Box<DeltaFwdPlan>>,
    /// The fused kernels run without `o` (its pointer 0): the final state alone
    /// ([`DeltaFwdPlan::final_state_only`]).
    state_only: bool,
    /// The staged path's split `fwd_h` also summarises the last sequence's last piece
    /// ([`DeltaFwdPlan::with_exit_summary`]).
    exit_summary: bool,
    /// The KDA intra stage (the fused path's, or a staged plan's: the exact fallback's twin) on
    /// the persistent `kda_intra_pipe` kernel with this many CTAs
    /// ([`DeltaFwdPlan::with_intra_pipe`]; by default two per multiprocessor where the device's
    /// shared memory holds them, `$ATTN_KDA_INTRA=mma` at plan time: none); else today's
    /// `kda_intra_mma*` kernel. Set only where every call fits it (`intra_pipe::accepts`): a
    /// call that does not is an error, never the old kernel.
    intra_pipe: Option<usize>,
    /// `g` is float32 (the pipe kernel's gate input).
    g_f32: bool,
}

/// Chunks of a sequence from which a splitting fused plan holds the exact fallback: a serial
/// chain of 256 chunks is ~0.7 ms at few heads (S12-2: ~2.7 µs a chunk), well above the host
/// read of the policy's verdict the fallback's decision costs.
pub const EXACT_FALLBACK_CHUNKS: usize = 256;

/// The staged path's time per (chunk, value head) over the fused chain's time per chunk step,
/// inverted and rounded: the fallback pays where a chain is longer than the call's (chunk,
/// value head) pairs over this. S13-6 (H100, H4 × 131072, bf16, K = V = 128): the staged path
/// ~0.36 µs (GDN) and ~0.42 µs (KDA) per pair, the fused chain ~2.7 and ~2.9 µs a step.
pub const FALLBACK_COST_RATIO: usize = 7;

/// [`FALLBACK_COST_RATIO`] where the fused chain runs on the Hopper kernel (`FusedChoice::wg`):
/// S19 (H100, H4 × 131072, bf16, K = V = 128) ~1.14 µs a step against the staged path's ~0.36 µs
/// per pair (its fallback rows 2.8 ms against the serial chain's 2.66 ms under FALLBACK_COST_RATIO).
pub const WG_FALLBACK_COST_RATIO: usize = 3;

/// The chain of chunks from which [`exact_fallback_due`] falls back: max([`EXACT_FALLBACK_CHUNKS`],
/// chunk-heads / `ratio` + 1) over sequences of `seq_chunks` chunks and `hv` value heads.
fn fallback_chain(seq_chunks: &[usize], hv: usize, ratio: usize) -> usize {
    let chunk_heads = seq_chunks.iter().sum::<usize>() * hv;
    EXACT_FALLBACK_CHUNKS.max(chunk_heads / ratio.max(1) + 1)
}

/// Whether [`exact_fallback_due`] can hold for some warm-ups at all: a CTA's chain (its warm-up,
/// its piece and the pieces it runs through) never leaves its sequence, so only a sequence of
/// at least [`fallback_chain`] chunks can make one long. Where none is, a plan holds no
/// fallback, and its warm-up policy runs beside the intra stage with no host read.
fn exact_fallback_possible(seq_chunks: &[usize], hv: usize, ratio: usize) -> bool {
    let long = fallback_chain(seq_chunks, hv, ratio);
    seq_chunks.iter().any(|&c| c >= long)
}

/// Whether a plan of `geo` with the fused path's `pieces` holds the exact fallback: where they
/// split a sequence and a fallback is possible ([`exact_fallback_possible`]).
fn holds_fallback(geo: &Geometry, pieces: Option<&Pieces>) -> bool {
    pieces.is_some_and(|p| {
        p.split && exact_fallback_possible(&seq_chunks(geo), geo.hv, fallback_ratio(p.choice))
    })
}

/// [`FALLBACK_COST_RATIO`] or, on the Hopper kernel, [`WG_FALLBACK_COST_RATIO`].
fn fallback_ratio(choice: FusedChoice) -> usize {
    if choice.wg {
        WG_FALLBACK_COST_RATIO
    } else {
        FALLBACK_COST_RATIO
    }
}

/// The exact fallback's rule ([`DeltaFwdPlan::needs_exact_fallback`]) on host copies: sequences
/// of `seq_chunks` chunks, `hv` value heads, pieces of `piece_chunks` chunks (the pieces table's
/// order), the policy's `warm` (`[P · HV]`: a warm-up in chunks, `-1` for a piece run through by
/// the one before) and `verdict` (`[N · HV]`, `0`: the serial launch). A chain counts when it
/// reaches max([`EXACT_FALLBACK_CHUNKS`], chunk-heads / `ratio` + 1) chunks (`ratio`:
/// [`FALLBACK_COST_RATIO`] or [`WG_FALLBACK_COST_RATIO`] by the fused kernel).
fn exact_fallback_due(
    seq_chunks: &[usize],
    hv: usize,
    piece_chunks: &[usize],
    warm: &[i64],
    verdict: Option<&[i64]>,
    ratio: usize,
) -> bool {
    let long = fallback_chain(seq_chunks, hv, ratio);
    let serial_long = verdict.is_some_and(|v| {
        (v.iter().enumerate())
            .any(|(i, &x)| x == 0 && seq_chunks.get(i / hv.max(1)).copied().unwrap_or(0) >= long)
    });
    serial_long
        || (0..hv).any(|h| {
            // a CTA's chain: its warm-up, its piece, and the pieces after it marked -1 (run
            // through)
            let mut chain = 0;
            piece_chunks.iter().enumerate().any(|(p, &chunks)| {
                let w = warm.get(p * hv + h).copied().unwrap_or(0);
                chain = if w < 0 {
                    chain + chunks
                } else {
                    w as usize + chunks
                };
                chain >= long
            })
        })
}

/// The fused path's launches (either kernel): the pieces of the (split) launch and, when the
/// split runs at a wider column block than the serial run, the serial launch it falls back to
/// per (sequence, value head) where the warm-ups do not shorten the chains (`warm_walk`'s verdict,
/// gate-agnostic).
#[derive(Debug)]
struct Pieces {
    /// `[P, 5]` rows (`piece_table`) and their count `P`.
    table: DeviceTensor,
    n: usize,
    /// More than one piece for some sequence.
    split: bool,
    /// The launch's tiles (the plan's `fused` unless a wider width splits better).
    choice: FusedChoice,
    /// With a wider split: the serial table (one piece per sequence) and the longest chain of
    /// chunks a CTA of the split may run and still finish before the serial run would.
    serial: Option<(DeviceTensor, i64)>,
    /// `table`'s rows on the host (the exact fallback's decision reads them).
    rows: Vec<i64>,
}

/// Intermediate tensors of a forward (allocated once per plan).
#[derive(Debug)]
pub struct DeltaFwdWorkspace {
    aqk: DeviceTensor,
    tiles: Tiles,
    /// The split's policy, when the plan splits.
    policy: Option<PolicyTensors>,
    /// With a wider split: its verdict per (sequence, value head) (`[N · HV]` i64, 1: split).
    verdict: Option<DeviceTensor>,
    /// The exact fallback's workspace: allocated by the first run that takes the fallback
    /// (a call whose gates never need it, e.g. strong decay, never holds the staged path's
    /// `w, u, kg, qg, h, v_new`).
    fallback: Option<Box<DeltaFwdWorkspace>>,
    /// Whether the last run took the exact fallback.
    fell_back: bool,
    /// The warm-up policy of the next run is already queued ([`DeltaFwdPlan::queue_policy`]).
    policy_queued: bool,
    /// The first half of the next run is already queued ([`DeltaFwdPlan::run_head`]).
    head: Option<Head>,
}

/// The intra stage's outputs in a workspace of the fused KDA path
/// ([`DeltaFwdWorkspace::intra_tiles`]), in the layouts of `conformance/spec/ops-delta-rule.md`
/// §7.3 (`w, u, kg, qg`: `[B, T, HV, K]`; `aqk`: `[B, T, HV, BT]`; `qf`: `[B, T, HV]` f32;
/// `lam`: `exp2(G_ℓ)` per chunk, `[NT, HV, K]` f32; `rows_gate`: `G` per token, `[B, T, HV, K]`
/// f32, once an intra stage wrote it: [`DeltaFwdPlan::run_intra_rows_gate`]).
#[derive(Debug, Clone, Copy)]
pub struct IntraTiles<'a> {
    pub w: &'a DeviceTensor,
    pub u: &'a DeviceTensor,
    pub kg: &'a DeviceTensor,
    pub qg: &'a DeviceTensor,
    pub qf: &'a DeviceTensor,
    pub lam: &'a DeviceTensor,
    pub aqk: &'a DeviceTensor,
    pub rows_gate: Option<&'a DeviceTensor>,
}

impl DeltaFwdWorkspace {
    /// The intra stage's outputs of a fused KDA workspace (`None` for the staged path and the
    /// lean GDN tiles), as the last intra stage left them (tests compare intra kernels on them).
    pub fn intra_tiles(&self) -> Option<IntraTiles<'_>> {
        match &self.tiles {
            Tiles::Full(f) if f.staged.is_none() => Some(IntraTiles {
                w: &f.w,
                u: &f.u,
                kg: &f.kg,
                qg: &f.qg,
                qf: &f.qf,
                lam: &f.gate,
                aqk: &self.aqk,
                rows_gate: f.rows_gate.as_ref(),
            }),
            _ => None,
        }
    }

    /// Fills the tensors of [`Self::intra_tiles`] with NaN (tests: every element an intra stage
    /// leaves unwritten shows).
    pub fn poison_intra_tiles(&mut self, gpu: &Gpu) -> GpuResult<()> {
        if let Tiles::Full(f) = &mut self.tiles {
            for t in [
                &mut f.w,
                &mut f.u,
                &mut f.kg,
                &mut f.qg,
                &mut f.qf,
                &mut f.gate,
            ] {
                t.poison(gpu)?;
            }
            if let Some(g) = f.rows_gate.as_mut() {
                g.poison(gpu)?;
            }
        }
        self.aqk.poison(gpu)
    }
}

/// The path a run's first half ([`DeltaFwdPlan::run_head`]) queued the intra stage of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Head {
    /// The plan's own path (fused, or staged for a staged plan).
    Own,
    /// The exact fallback's staged path; `shared`: its tiles expanded from the lean intra
    /// stage's (GDN), whose Aqk it uses; `prescanned`: its `fwd_h` split's pre-scan queued too.
    Fallback { shared: bool, prescanned: bool },
}

/// The warm-up policy's tensors (§5.10; [`DeltaFwdPlan::run_warm_policy`]).
#[derive(Debug)]
pub(crate) struct PolicyTensors {
    /// The bound of each chunk of each piece's window and value head
    /// (`[P · min(wmax, 64) · HV]` f64; the chunks the window does not reach are not written).
    pub(crate) lam: DeviceTensor,
    /// The warm-ups per (piece, value head) (`[P · HV]` i64).
    pub(crate) warm: DeviceTensor,
}

impl PolicyTensors {
    /// The tensors for `npieces` pieces of warm-ups up to `wmax` chunks and `hv` value heads.
    pub(crate) fn alloc(gpu: &Gpu, npieces: usize, wmax: usize, hv: usize) -> GpuResult<Self> {
        let win = wmax.clamp(1, MAX_WARMUP_CHUNKS);
        Ok(PolicyTensors {
            lam: DeviceTensor::alloc(gpu, &[npieces * win * hv], Dtype::F64)?,
            warm: DeviceTensor::alloc(gpu, &[npieces * hv], Dtype::I64)?,
        })
    }
}

/// The split's device tensors of a workspace for one run: the policy's warm-ups and verdict.
struct SplitTensors<'a> {
    warm: Option<&'a DeviceTensor>,
    verdict: Option<&'a DeviceTensor>,
}

/// The intra stage's other outputs, by path.
#[derive(Debug)]
enum Tiles {
    /// The lean fused GDN path: `Akk diag(β)` as hi + lo (`[B, T, HV, BT]`), `G` (`[B, T, HV]`
    /// f32), and with l2norm the normalised `q, k` (`[B, T, HV, K]`).
    Lean(Box<LeanTiles>),
    /// `w, u, kg, qg` for the fused KDA kernel and the staged path.
    Full(Box<FullTiles>),
}

#[derive(Debug)]
struct LeanTiles {
    tbh: DeviceTensor,
    tbl: DeviceTensor,
    g: DeviceTensor,
    /// With l2norm: `q, k` normalised by the intra stage, `[B, T, H, K]` (per key head: the
    /// fused kernel maps value heads onto them as onto the raw ones), for `delta_fused_gdn` and
    /// the exact fallback's `gdn_expand`.
    qk: Option<(DeviceTensor, DeviceTensor)>,
    /// With l2norm on the Hopper kernel: `[B, T, H, 2]` f32, `1 / ‖q‖, 1 / ‖k‖` per token and
    /// key head (the kernel reads the raw `q, k`).
    rqk: Option<DeviceTensor>,
}

#[derive(Debug)]
struct FullTiles {
    w: DeviceTensor,
    u: DeviceTensor,
    kg: DeviceTensor,
    qg: DeviceTensor,
    /// Per-token fp32 row factors of the output (`[B, T, HV]`).
    qf: DeviceTensor,
    /// Fused: `exp2(G_ℓ)` per chunk `[NT, HV, K]` f32. Staged: `G` `[B, T, HV(, K)]`.
    gate: DeviceTensor,
    /// Fused: `G` per token too, in the staged layout, written by the intra stage of a first
    /// half that asks for it ([`DeltaFwdPlan::run_head`]'s `rows_gate`), so that `fwd_h`'s
    /// pre-scan can run over these tiles ([`DeltaFwdPlan::head_fwd_h_inputs`]); allocated by
    /// the first intra stage that writes it.
    rows_gate: Option<DeviceTensor>,
    /// Whether the next intra stage writes `rows_gate`.
    rows_gate_on: bool,
    /// Staged only: `fwd_h`'s plan, scratch and outputs.
    staged: Option<Box<Staged>>,
}

/// The staged path's `fwd_h` call: the split op of §5 (`chunk_gated_delta_rule_fwd_h_split`),
/// whose automatic mode cuts long sequences into pieces with exact summaries and a merge where
/// its policy estimates a gain (bf16 / f16; serial for fp32 and fp64, whose thresholds the
/// split's summaries would not keep: §5.7), else the serial recurrence.
#[derive(Debug)]
struct Staged {
    plan: FwdHSplitPlan,
    ws: FwdHSplitWorkspace,
    out: FwdHDeviceOutputs,
}

impl DeltaFwdPlan {
    /// A `kda_fwd` call (`conformance/spec/ops-delta-rule.md` §6): validated (1.5, 6.7 and the
    /// GPU's dtype rules), its tables uploaded.
    pub fn kda(
        gpu: &Gpu,
        t: &ForwardTensors<'_>,
        cu_seqlens: Option<&[i64]>,
        p: &KdaFwdParams,
        path: ForwardPath,
    ) -> GpuResult<DeltaFwdPlan> {
        Self::new(gpu, t, cu_seqlens, Call::Kda(*p), path)
    }

    /// A `gdn_fwd` call (`conformance/spec/ops-delta-rule.md` §8).
    pub fn gdn(
        gpu: &Gpu,
        t: &ForwardTensors<'_>,
        cu_seqlens: Option<&[i64]>,
        p: &GdnFwdParams,
        path: ForwardPath,
    ) -> GpuResult<DeltaFwdPlan> {
        Self::new(gpu, t, cu_seqlens, Call::Gdn(*p), path)
    }

    fn new(
        gpu: &Gpu,
        t: &ForwardTensors<'_>,
        cu_seqlens: Option<&[i64]>,
        call: Call,
        path: ForwardPath,
    ) -> GpuResult<DeltaFwdPlan> {
        let geo = call.validate(t, cu_seqlens)?;
        let dtype = t.q.dtype();
        let fusable = matches!(dtype, Dtype::BF16 | Dtype::F16) && geo.k <= 128;
        let fused = match path {
            ForwardPath::Staged => None,
            ForwardPath::Auto if !fusable => None,
            ForwardPath::Fused if !fusable => {
                return Err(Error::param(
                    "path",
                    "the fused path only for bfloat16/float16 inputs with K <= 128",
                    format!("{} inputs with K = {}", dtype.name(), geo.k),
                )
                .into())
            }
            _ => {
                let chunks = seq_chunks(&geo);
                let lean = matches!(call, Call::Gdn(_));
                Some(fused_choice(
                    geo.k,
                    geo.v,
                    &chunks,
                    geo.hv,
                    gpu.sm_count(),
                    lean,
                    wg::fits(gpu, dtype, &geo),
                ))
            }
        };
        let varlen = cu_seqlens.is_some();
        let (chunks, nchunks) = chunk_table(gpu, &geo, varlen)?;
        let seqs = fused
            .filter(|f| !f.lean)
            .map(|_| seq_table(gpu, &geo, varlen))
            .transpose()?;
        let (output_final_state, state_v_first) = call.state_flags();
        let split_rule = fused.map(|_| SplitRule::default());
        let pieces = Self::pieces(gpu, &geo, fused, split_rule)?;
        let fallback = if holds_fallback(&geo, pieces.as_ref()) {
            Some(Box::new(Self::new(
                gpu,
                t,
                cu_seqlens,
                call,
                ForwardPath::Staged,
            )?))
        } else {
            None
        };
        Ok(DeltaFwdPlan {
            prep: call.prep(geo.k),
            call,
            geo,
            varlen,
            dtype,
            output_final_state,
            state_v_first,
            fused,
            chunks,
            nchunks,
            seqs,
            pieces,
            split_rule,
            cu_seqlens: cu_seqlens.map(<[i64]>::to_vec),
            fallback,
            state_only: false,
            exit_summary: false,
            intra_pipe: None,
            g_f32: t.g.dtype() == Dtype::F32,
        }
        .with_intra_pipe(
            knobs::kda_intra_pipe()
                .then(|| intra_pipe::default_grid(gpu))
                .flatten(),
        ))
    }

    /// The KDA intra stage on `kda_intra_pipe` with `grid` CTAs (`None`: today's
    /// `kda_intra_mma*` kernels), for the plans whose every call fits it: bf16, `K = V = 128`,
    /// chunk 64, an fp32 `g` (the given per-step decay, or the in-kernel gate's input: with
    /// `safe_gate` its lower-bound form, without it either form), with or without `safe_gate`,
    /// on the fused path (not lean; a run whose intra stage also writes `G` per token, CP's
    /// first half, takes it too) or the staged path (a per-key gate: KDA, not GDN). Other plans
    /// are unchanged. The exact fallback's staged twin ([`Self::fallback_intra_pipe`]) takes the
    /// same `grid`, so `None` pins both plans to the old kernels.
    pub fn with_intra_pipe(mut self, grid: Option<usize>) -> DeltaFwdPlan {
        let fits = self.fused.map_or(!self.prep.scalar_gate, |f| !f.lean)
            && self.dtype == Dtype::BF16
            && (self.geo.k, self.geo.v, self.geo.bt) == (128, 128, 64)
            && match self.prep.gate {
                GateInput::Decay => true,
                GateInput::InKernel(lb) => lb.is_some() || !self.prep.safe_gate,
            }
            && self.g_f32;
        self.intra_pipe = grid.filter(|_| fits).map(|g| g.max(1));
        // the twin (built before the parent, and given its own default grid there) follows
        self.fallback = self
            .fallback
            .take()
            .map(|fb| Box::new(fb.with_intra_pipe(grid)));
        self
    }

    /// The grid of `kda_intra_pipe` when the plan's intra stage runs on it.
    pub fn intra_pipe(&self) -> Option<usize> {
        self.intra_pipe
    }

    /// The grid of `kda_intra_pipe` when the exact fallback's staged twin runs its intra stage on
    /// it (`None` also where the plan holds no fallback).
    pub fn fallback_intra_pipe(&self) -> Option<usize> {
        self.fallback.as_ref().and_then(|fb| fb.intra_pipe)
    }

    /// The fused path's pieces under `rule` (one per sequence at the serial width without a
    /// rule), at the width [`split_choice`] picks.
    fn pieces(
        gpu: &Gpu,
        geo: &Geometry,
        fused: Option<FusedChoice>,
        rule: Option<SplitRule>,
    ) -> GpuResult<Option<Pieces>> {
        let Some(serial) = fused else {
            return Ok(None);
        };
        let chunks = seq_chunks(geo);
        let table = |per_seq: &[usize]| {
            let mut rows = piece_table(geo, per_seq);
            let n = rows.len() / 5;
            if rows.is_empty() {
                rows.push(0);
            }
            Ok::<_, crate::error::GpuError>((DeviceTensor::from_slice(gpu, &rows)?, n, rows))
        };
        let ones = vec![1; chunks.len()];
        let (choice, per_seq) = match rule {
            Some(r) => split_choice(geo.v, &chunks, geo.hv, gpu.sm_count(), serial, &r),
            None => (serial, ones.clone()),
        };
        let (tab, n, rows) = table(&per_seq)?;
        let split = per_seq.iter().any(|&m| m > 1);
        let serial_run = if choice != serial {
            let est = fused_estimate(serial, geo.v, &chunks, &ones, geo.hv, gpu.sm_count());
            let max_chain = (est / step_cost(choice)).floor() as i64;
            Some((table(&ones)?.0, max_chain))
        } else {
            None
        };
        Ok(Some(Pieces {
            table: tab,
            n,
            split,
            choice,
            serial: serial_run,
            rows,
        }))
    }

    /// The plan with the fused path's automatic split under `rule`, or without a split
    /// (`None`: one serial run per sequence); other paths are unchanged. A rule's
    /// `max_warmup_chunks` must be 1..=64 and `min_piece_chunks` at least 1. The exact fallback
    /// (made with the plan) stays while the plan still splits.
    pub fn with_split(mut self, gpu: &Gpu, rule: Option<SplitRule>) -> GpuResult<DeltaFwdPlan> {
        if let Some(r) = rule {
            if !(1..=MAX_WARMUP_CHUNKS).contains(&r.max_warmup_chunks) || r.min_piece_chunks == 0 {
                return Err(Error::param(
                    "rule",
                    "max_warmup_chunks in 1..=64 and min_piece_chunks >= 1",
                    format!("{r:?}"),
                )
                .into());
            }
        }
        if self.fused.is_some() {
            self.split_rule = rule;
            self.pieces = Self::pieces(gpu, &self.geo, self.fused, rule)?;
            if !holds_fallback(&self.geo, self.pieces.as_ref()) {
                self.fallback = None;
            }
        }
        Ok(self)
    }

    /// Whether the plan splits a sequence into pieces (the fused path's automatic split).
    pub fn splits(&self) -> bool {
        self.pieces.as_ref().is_some_and(|p| p.split)
    }

    /// The warm-up chunks the last run chose per (piece, value head), `[P · HV]` (§5.10: `0` for
    /// a sequence's first piece, `-1` for a piece run through by the one before it), when the
    /// plan splits; the debug query of the automatic split.
    pub fn chosen_warmups(&self, gpu: &Gpu, ws: &DeltaFwdWorkspace) -> GpuResult<Option<Vec<i64>>> {
        ws.policy
            .as_ref()
            .map(|p| Ok(p.warm.to_array::<i64>(gpu)?.iter().copied().collect()))
            .transpose()
    }

    /// Where the split runs at a wider column block than the serial run: the verdict of the
    /// last run per (sequence, value head), `[N · HV]` (`true`: the split ran it, `false`: the
    /// serial kernel did, its pieces' warm-ups not shortening the chain); else `None`.
    pub fn chosen_split(&self, gpu: &Gpu, ws: &DeltaFwdWorkspace) -> GpuResult<Option<Vec<bool>>> {
        ws.verdict
            .as_ref()
            .map(|w| Ok(w.to_array::<i64>(gpu)?.iter().map(|&x| x != 0).collect()))
            .transpose()
    }

    /// The tiles of the split launch, when the plan splits (wider than [`Self::fused_choice`]
    /// where more pieces pay).
    pub fn split_choice(&self) -> Option<FusedChoice> {
        self.pieces.as_ref().filter(|p| p.split).map(|p| p.choice)
    }

    /// The path this plan runs.
    pub fn path(&self) -> ForwardPath {
        if self.fused.is_some() {
            ForwardPath::Fused
        } else {
            ForwardPath::Staged
        }
    }

    /// The fused kernel's tiles, when the plan runs the fused path.
    pub fn fused_choice(&self) -> Option<FusedChoice> {
        self.fused
    }

    /// The validated geometry.
    pub fn geometry(&self) -> &Geometry {
        &self.geo
    }

    /// The intermediate tensors of the plan's path.
    pub fn alloc_workspace(&self, gpu: &Gpu) -> GpuResult<DeltaFwdWorkspace> {
        let g = &self.geo;
        let d = self.dtype;
        let tok = |w: usize| DeviceTensor::alloc(gpu, &[g.b, g.t, g.hv, w], d);
        let policy = match (&self.pieces, self.split_rule) {
            (Some(p), Some(rule)) if p.split => Some(PolicyTensors::alloc(
                gpu,
                p.n,
                rule.max_warmup_chunks,
                g.hv,
            )?),
            _ => None,
        };
        let verdict = match &self.pieces {
            Some(p) if p.serial.is_some() => {
                Some(DeviceTensor::alloc(gpu, &[g.n() * g.hv], Dtype::I64)?)
            }
            _ => None,
        };
        if self.fused.is_some_and(|f| f.lean) {
            let wg = self.fused.is_some_and(|f| f.wg);
            let l2 = self.prep.l2norm;
            return Ok(DeltaFwdWorkspace {
                fallback: None,
                fell_back: false,
                policy_queued: false,
                head: None,
                aqk: tok(g.bt)?,
                tiles: Tiles::Lean(Box::new(LeanTiles {
                    tbh: tok(g.bt)?,
                    tbl: tok(g.bt)?,
                    g: DeviceTensor::alloc(gpu, &[g.b, g.t, g.hv], Dtype::F32)?,
                    qk: (l2 && (!wg || self.fallback.is_some()))
                        .then(|| {
                            let qk = || DeviceTensor::alloc(gpu, &[g.b, g.t, g.h, g.k], d);
                            Ok::<_, crate::error::GpuError>((qk()?, qk()?))
                        })
                        .transpose()?,
                    rqk: (l2 && wg)
                        .then(|| DeviceTensor::alloc(gpu, &[g.b, g.t, g.h, 2], Dtype::F32))
                        .transpose()?,
                })),
                policy,
                verdict,
            });
        }
        let gate = match self.fused {
            Some(_) => DeviceTensor::alloc(gpu, &[g.nt(self.varlen) * g.b, g.hv, g.k], Dtype::F32)?,
            None => self.alloc_rows_gate(gpu)?,
        };
        let mut ws = FullTiles {
            w: tok(g.k)?,
            u: tok(g.v)?,
            kg: tok(g.k)?,
            qg: tok(g.k)?,
            qf: DeviceTensor::alloc(gpu, &[g.b, g.t, g.hv], Dtype::F32)?,
            gate,
            rows_gate: None,
            rows_gate_on: false,
            staged: None,
        };
        if self.fused.is_none() {
            let params = FwdHParams {
                chunk_size: g.bt as i64,
                output_final_state: self.output_final_state,
                save_new_value: true,
                state_v_first: self.state_v_first,
            };
            let mut fwd = FwdHTensors::new(&ws.kg, &ws.w, &ws.u);
            if self.prep.scalar_gate {
                fwd.g = Some(&ws.gate);
            } else {
                fwd.gk = Some(&ws.gate);
            }
            let mode = match d {
                Dtype::BF16 | Dtype::F16 => SplitMode::Auto,
                _ => SplitMode::Serial,
            };
            let cu = self.cu_seqlens.as_deref();
            let mut plan = FwdHSplitPlan::new(gpu, &fwd, cu, mode, &params)?;
            if self.exit_summary {
                plan = plan.with_exit_summary(gpu)?;
            }
            ws.staged = Some(Box::new(Staged {
                ws: plan.alloc_workspace(gpu)?,
                out: plan.alloc_outputs(gpu)?,
                plan,
            }));
        }
        Ok(DeltaFwdWorkspace {
            aqk: tok(g.bt)?,
            tiles: Tiles::Full(Box::new(ws)),
            policy,
            verdict,
            fallback: None,
            fell_back: false,
            policy_queued: false,
            head: None,
        })
    }

    /// Fresh (unwritten) outputs of the plan's shapes and dtypes.
    pub fn alloc_outputs(&self, gpu: &Gpu) -> GpuResult<DeltaFwdDeviceOutputs> {
        let g = &self.geo;
        Ok(DeltaFwdDeviceOutputs {
            o: DeviceTensor::alloc(gpu, &[g.b, g.t, g.hv, g.v], self.dtype)?,
            final_state: self
                .output_final_state
                .then(|| {
                    DeviceTensor::alloc(
                        gpu,
                        &g.state_shape(self.state_v_first),
                        acc_dtype(self.dtype),
                    )
                })
                .transpose()?,
        })
    }

    /// Re-validates `t` and checks it and `out` against the plan's shapes and dtypes (what
    /// [`DeltaFwdPlan::run`] checks before its first launch; the context-parallel plan checks
    /// every rank's call with it before any rank launches).
    pub(crate) fn check_call(
        &self,
        t: &ForwardTensors<'_>,
        out: &DeltaFwdDeviceOutputs,
    ) -> attn_reference::Result<()> {
        let g = &self.geo;
        let geo = self.call.validate(t, self.cu_seqlens.as_deref())?;
        if geo != *g || t.q.dtype() != self.dtype {
            return Err(Error::shape(
                "q",
                "the shapes and dtype the plan was made for",
                t.q.shape(),
            ));
        }
        let o_shape = [g.b, g.t, g.hv, g.v];
        if out.o.shape() != o_shape || out.o.dtype() != self.dtype {
            return Err(Error::shape(
                "o",
                format!("{o_shape:?} {}", self.dtype),
                out.o.shape(),
            ));
        }
        let state = g.state_shape(self.state_v_first);
        match (&out.final_state, self.output_final_state) {
            (None, false) => Ok(()),
            (Some(f), true) if f.shape() == state && f.dtype() == acc_dtype(self.dtype) => Ok(()),
            (Some(f), _) => Err(Error::shape(
                "final_state",
                format!("{state:?} {}", acc_dtype(self.dtype)),
                f.shape(),
            )),
            (None, true) => Err(Error::missing("final_state", "an output tensor", "none")),
        }
    }

    /// The intra stage alone into `ws` (benchmarks time the stages apart; [`DeltaFwdPlan::run`]
    /// runs it first).
    pub fn run_intra(
        &self,
        gpu: &Gpu,
        t: &ForwardTensors<'_>,
        ws: &mut DeltaFwdWorkspace,
    ) -> GpuResult<()> {
        self.check_inputs(t)?;
        self.intra(gpu, t, &mut ws.aqk, &mut ws.tiles)
    }

    /// [`Self::run_intra`] that also writes `G` per token, as the first half of a
    /// context-parallel run asks (`run_head`'s `rows_gate`; the fused path with full
    /// tiles, else as [`Self::run_intra`]), into [`IntraTiles::rows_gate`] (tests compare the
    /// intra kernels on it). Later runs of `ws` write it only where they ask again.
    pub fn run_intra_rows_gate(
        &self,
        gpu: &Gpu,
        t: &ForwardTensors<'_>,
        ws: &mut DeltaFwdWorkspace,
    ) -> GpuResult<()> {
        self.set_rows_gate(ws, true);
        let r = self.run_intra(gpu, t, ws);
        self.set_rows_gate(ws, false);
        r
    }

    /// Re-validates `t` and checks it against the plan's shapes and dtypes.
    fn check_inputs(&self, t: &ForwardTensors<'_>) -> attn_reference::Result<()> {
        let geo = self.call.validate(t, self.cu_seqlens.as_deref())?;
        if geo != self.geo || t.q.dtype() != self.dtype {
            return Err(Error::shape(
                "q",
                "the shapes and dtype the plan was made for",
                t.q.shape(),
            ));
        }
        Ok(())
    }

    /// The intra stage of `t` into `aqk` and `tiles` (a workspace's).
    fn intra(
        &self,
        gpu: &Gpu,
        t: &ForwardTensors<'_>,
        aqk: &mut DeviceTensor,
        tiles: &mut Tiles,
    ) -> GpuResult<()> {
        let mut args = self.intra_args(gpu, t)?;
        args.aqk = aqk.ptr_mut(gpu);
        match tiles {
            Tiles::Lean(l) => {
                args.tbh = l.tbh.ptr_mut(gpu);
                args.tbl = l.tbl.ptr_mut(gpu);
                args.gout = l.g.ptr_mut(gpu);
                if let Some((qn, kn)) = l.qk.as_mut() {
                    args.qg = qn.ptr_mut(gpu);
                    args.kg = kn.ptr_mut(gpu);
                }
                if let Some(r) = l.rqk.as_mut() {
                    args.rqk = r.ptr_mut(gpu);
                }
                let g = &self.geo;
                return launch_gdn_intra(gpu, self.dtype, self.nchunks, g.hv, g.k, &args);
            }
            Tiles::Full(f) => {
                args.w = f.w.ptr_mut(gpu);
                args.u = f.u.ptr_mut(gpu);
                args.kg = f.kg.ptr_mut(gpu);
                args.qg = f.qg.ptr_mut(gpu);
                args.qf = f.qf.ptr_mut(gpu);
                args.kg_gated = (self.fused.is_some() || !self.prep.scalar_gate) as i64;
                if self.fused.is_some() {
                    args.lam = f.gate.ptr_mut(gpu);
                    if f.rows_gate_on {
                        let g = match &mut f.rows_gate {
                            Some(g) => g,
                            None => f.rows_gate.insert(self.alloc_rows_gate(gpu)?),
                        };
                        args.gout = g.ptr_mut(gpu);
                    }
                } else {
                    args.gout = f.gate.ptr_mut(gpu);
                }
            }
        }
        // `with_intra_pipe` promises the calls `accepts` takes: a disagreement is an error in
        // every build rather than the old kernel run silently where the plan reports the pipe
        match self.intra_pipe {
            Some(_) if !intra_pipe::accepts(self.dtype, &args) => Err(Error::param(
                "intra_pipe",
                "a call kda_intra_pipe accepts (the plan promised its intra stage to it)",
                "a call it does not accept (with_intra_pipe and intra_pipe::accepts disagree)",
            )
            .into()),
            Some(grid) => intra_pipe::launch(gpu, self.nchunks, self.geo.hv, grid, &args),
            None => launch_intra(gpu, self.dtype, self.nchunks, self.geo.hv, &args),
        }
    }

    /// Runs the forward of `t` (the tensors the plan was validated on, or others of the same
    /// shapes and dtypes) into `out`, with `ws` from [`DeltaFwdPlan::alloc_workspace`].
    pub fn run(
        &self,
        gpu: &Gpu,
        t: &ForwardTensors<'_>,
        ws: &mut DeltaFwdWorkspace,
        out: &mut DeltaFwdDeviceOutputs,
    ) -> GpuResult<()> {
        self.check_call(t, out)?;
        let head = match ws.head.take() {
            Some(h) => h,
            None => {
                self.set_rows_gate(ws, false);
                self.head(gpu, t, ws)?
            }
        };
        self.finish(gpu, t, ws, head, out)
    }

    /// Queues the first half of the next [`Self::run`] of `t` with `ws` now: the warm-up
    /// policy's choice (read on the host where the plan holds the exact fallback) and the intra
    /// stage of the path it chose (for the fallback, also its `fwd_h` pre-scan), none of which
    /// reads `initial_state`. That run (on the same tensors but `initial_state`) then queues
    /// only the rest: the recurrence and the output. The context-parallel plans queue every
    /// rank's first half before the all-gather: it overlaps the other ranks' summaries, and
    /// the fallback's pre-scan or tiles serve the rank's own whole-piece summary
    /// ([`Self::fallback_exit_summaries`], [`Self::head_fwd_h_inputs`]). `rows_gate`: a
    /// fused intra stage with full tiles (KDA) also writes `G` per token (the staged layout:
    /// one more `[B, T, HV, K]` f32 write), so that such a summary pre-scans the fused path's
    /// own tiles instead of running an intra stage of its own.
    pub(crate) fn run_head(
        &self,
        gpu: &Gpu,
        t: &ForwardTensors<'_>,
        ws: &mut DeltaFwdWorkspace,
        rows_gate: bool,
    ) -> GpuResult<()> {
        self.check_inputs(t)?;
        ws.head = None;
        self.set_rows_gate(ws, rows_gate);
        let head = self.head(gpu, t, ws)?;
        ws.head = Some(head);
        Ok(())
    }

    /// The `fwd_h` inputs (`kg, w, u` and the gate, `[B, T, HV, ·]`) that the last
    /// [`Self::run_head`] with `ws` queued: the exact fallback's, where it took the fallback;
    /// the fused path's own, where its tiles are full and that first half asked for the gate
    /// per token (`rows_gate`); else `None` (GDN's lean fused tiles hold no `w, u`).
    pub(crate) fn head_fwd_h_inputs<'a>(
        &self,
        ws: &'a DeltaFwdWorkspace,
    ) -> Option<FwdHTensors<'a>> {
        if let Some((fb, f)) = self.fallen_back(ws) {
            return Some(fb.fwd_h_inputs([&f.kg, &f.w, &f.u, &f.gate]));
        }
        match (ws.head, &ws.tiles) {
            (Some(Head::Own), Tiles::Full(f)) if f.rows_gate_on => {
                Some(self.fwd_h_inputs([&f.kg, &f.w, &f.u, f.rows_gate.as_ref()?]))
            }
            _ => None,
        }
    }

    /// The exact fallback's plan and tiles, where the last [`Self::run_head`] with `ws` took
    /// the fallback.
    fn fallen_back<'p, 'a>(
        &'p self,
        ws: &'a DeltaFwdWorkspace,
    ) -> Option<(&'p DeltaFwdPlan, &'a FullTiles)> {
        let (Some(fb), Some(Head::Fallback { .. }), Some(fws)) =
            (self.fallback.as_deref(), ws.head, ws.fallback.as_deref())
        else {
            return None;
        };
        match &fws.tiles {
            Tiles::Full(f) => Some((fb, f)),
            Tiles::Lean(_) => None,
        }
    }

    /// The plan whose exact fallback's split `fwd_h` also summarises the last sequence's last
    /// piece ([`FwdHSplitPlan::with_exit_summary`]): where a run takes the fallback, its first
    /// half leaves the summaries of all the last sequence's pieces
    /// ([`Self::fallback_exit_summaries`]), the context-parallel summary of a shard's
    /// continuing piece at the cost of one piece's pre-scan.
    pub(crate) fn with_exit_summary(mut self) -> DeltaFwdPlan {
        if let Some(fb) = self.fallback.as_mut() {
            fb.exit_summary = true;
        }
        self
    }

    /// The staged layout's gate tensor: `G` per token, `[B, T, HV(, K)]` in the accumulator
    /// dtype.
    fn alloc_rows_gate(&self, gpu: &Gpu) -> GpuResult<DeviceTensor> {
        let g = &self.geo;
        let acc = acc_dtype(self.dtype);
        match self.prep.scalar_gate {
            true => DeviceTensor::alloc(gpu, &[g.b, g.t, g.hv], acc),
            false => DeviceTensor::alloc(gpu, &[g.b, g.t, g.hv, g.k], acc),
        }
    }

    /// Whether the next intra stage with `ws` also writes `G` per token, where the plan is
    /// fused with full tiles.
    fn set_rows_gate(&self, ws: &mut DeltaFwdWorkspace, on: bool) {
        if let Tiles::Full(f) = &mut ws.tiles {
            f.rows_gate_on = on && self.fused.is_some();
        }
    }

    /// Where the last [`Self::run_head`] with `ws` of a [`Self::with_exit_summary`] plan that
    /// took the fallback left the summaries of the last sequence's pieces: `hm` rows
    /// `[b | M]`, the first row and the number of pieces (`None` otherwise, or where that
    /// `fwd_h` leaves the last sequence whole).
    pub(crate) fn fallback_exit_summaries<'a>(
        &self,
        ws: &'a DeltaFwdWorkspace,
    ) -> Option<(&'a DeviceTensor, usize, usize)> {
        let (fb, full) = self.fallen_back(ws)?;
        if !fb.exit_summary {
            return None;
        }
        let st = full.staged.as_deref()?;
        st.plan.exit_summaries(&st.ws)
    }

    /// The first half of a run (see [`Self::run_head`]): the policy (unless queued), the
    /// choice, and the intra stage of the chosen path.
    fn head(
        &self,
        gpu: &Gpu,
        t: &ForwardTensors<'_>,
        ws: &mut DeltaFwdWorkspace,
    ) -> GpuResult<Head> {
        if self.splits() != ws.policy.is_some()
            || self.pieces.as_ref().is_some_and(|p| p.serial.is_some()) != ws.verdict.is_some()
            || (self.fallback.is_none() && ws.fallback.is_some())
        {
            return Err(Error::missing(
                "ws",
                "a workspace of this plan (allocated after with_split)",
                "one of another split",
            )
            .into());
        }
        let DeltaFwdWorkspace {
            aqk,
            tiles,
            policy,
            verdict,
            fallback,
            fell_back,
            policy_queued,
            head: _,
        } = ws;
        *fell_back = false;
        let queued = std::mem::take(policy_queued);
        let (Some(pc), Some(rule), Some(pt)) = (&self.pieces, self.split_rule, policy.as_mut())
        else {
            self.intra(gpu, t, aqk, tiles)?;
            return Ok(Head::Own);
        };
        let w = rule.max_warmup_chunks;
        let v = verdict.as_mut().zip(pc.serial.as_ref().map(|s| s.1));
        let Some(fb) = self.fallback.as_deref() else {
            // the policy reads only t's g, β and k: on the second stream, beside the intra
            // stage (the fused launches wait for both)
            gpu.beside(
                |side| self.run_warm_policy(side, t, &pc.table, pc.n, w, pt, v),
                |main| self.intra(main, t, aqk, tiles),
            )?;
            return Ok(Head::Own);
        };
        let shared = matches!(tiles, Tiles::Lean(_)) && fb.expands_lean();
        // Unqueued, GDN's lean intra stage (it serves both paths) runs beside the policy, and
        // the choice is read on the host while nothing else waits. Queued (the
        // context-parallel ranks, one host thread), the choice is read before anything of
        // this run is queued: a read behind this rank's intra stage would hold back the next
        // rank's launches.
        let intra_queued = shared && !queued;
        if intra_queued {
            gpu.beside(
                |side| self.run_warm_policy(side, t, &pc.table, pc.n, w, pt, v),
                |main| self.intra(main, t, aqk, tiles),
            )?;
        } else if !queued {
            self.run_warm_policy(gpu, t, &pc.table, pc.n, w, pt, v)?;
        }
        let due = self.needs_exact_fallback(gpu, pc, &pt.warm, verdict.as_ref())?;
        if !intra_queued && (!due || shared) {
            self.intra(gpu, t, aqk, tiles)?;
        }
        if !due {
            return Ok(Head::Own);
        }
        // the first run that takes the fallback allocates its workspace (and plans its split
        // `fwd_h`) here
        let fws = match fallback {
            Some(f) => f,
            None => fallback.insert(Box::new(fb.alloc_workspace(gpu)?)),
        };
        *fell_back = true;
        match (tiles, &mut fws.tiles) {
            (Tiles::Lean(l), Tiles::Full(full)) if shared => fb.expand(gpu, t, l, full)?,
            _ => fb.intra(gpu, t, &mut fws.aqk, &mut fws.tiles)?,
        }
        let Tiles::Full(full) = &mut fws.tiles else {
            return Err(Error::missing("ws", "a staged workspace", "a lean one").into());
        };
        let prescanned = fb.staged_prescan(gpu, full)?;
        Ok(Head::Fallback { shared, prescanned })
    }

    /// The second half of a run after `head`: the recurrence and the output, on this plan's
    /// path or on the exact fallback's.
    fn finish(
        &self,
        gpu: &Gpu,
        t: &ForwardTensors<'_>,
        ws: &mut DeltaFwdWorkspace,
        head: Head,
        out: &mut DeltaFwdDeviceOutputs,
    ) -> GpuResult<()> {
        let DeltaFwdWorkspace {
            aqk,
            tiles,
            policy,
            verdict,
            fallback,
            ..
        } = ws;
        if let Head::Fallback { shared, prescanned } = head {
            let (Some(fb), Some(fws)) = (self.fallback.as_deref(), fallback.as_deref_mut()) else {
                return Err(Error::missing("ws", "the exact fallback's workspace", "none").into());
            };
            let Tiles::Full(full) = &mut fws.tiles else {
                return Err(Error::missing("ws", "a staged workspace", "a lean one").into());
            };
            // GDN's expanded tiles go with the lean stage's Aqk
            let aqk = if shared { &*aqk } else { &fws.aqk };
            let rest: &[SplitStage] = if prescanned {
                &[SplitStage::Merge, SplitStage::Rerun]
            } else {
                &SplitStage::ALL
            };
            return fb.run_staged(gpu, t, full, aqk, rest, out);
        }
        let split = SplitTensors {
            warm: policy.as_ref().map(|p| &p.warm),
            verdict: verdict.as_ref(),
        };
        let full = match (self.fused, tiles) {
            (Some(choice), Tiles::Lean(l)) if choice.lean => {
                return self.run_lean(gpu, t, l, split, aqk, out);
            }
            (_, Tiles::Full(f)) => f,
            (_, Tiles::Lean(_)) => {
                return Err(Error::missing("ws", "a workspace of this plan", "a lean one").into())
            }
        };
        match self.fused {
            Some(_) => self.run_fused(gpu, t, full, split, aqk, out),
            None => self.run_staged(gpu, t, full, aqk, &SplitStage::ALL, out),
        }
    }

    /// `fwd_h`'s inputs on a staged workspace's tiles `[kg, w, u, gate]` (the gate as `g` for a
    /// scalar gate, else as `gk`).
    fn fwd_h_inputs<'a>(&self, [kg, w, u, gate]: [&'a DeviceTensor; 4]) -> FwdHTensors<'a> {
        let mut fwd = FwdHTensors::new(kg, w, u);
        if self.prep.scalar_gate {
            fwd.g = Some(gate);
        } else {
            fwd.gk = Some(gate);
        }
        fwd
    }

    /// The pre-scan of the staged path's split `fwd_h` on `full` (it reads no `initial_state`),
    /// queued by the exact fallback's first half: whether there is one (`false` for a serial
    /// `fwd_h`); [`Self::run_staged`] then queues the split's other stages.
    fn staged_prescan(&self, gpu: &Gpu, full: &mut FullTiles) -> GpuResult<bool> {
        let Some(st) = full.staged.as_deref_mut() else {
            return Err(Error::missing("ws", "a workspace of this plan", "a fused one").into());
        };
        if st.plan.pieces().is_none() {
            return Ok(false);
        }
        let fwd = self.fwd_h_inputs([&full.kg, &full.w, &full.u, &full.gate]);
        let pre = [SplitStage::PreScan];
        st.plan
            .run_stages(gpu, &fwd, &mut st.ws, &mut st.out, &pre)?;
        Ok(true)
    }

    /// The staged path after its intra stage (`full`'s `w, u, kg, qg, qf, G` and `aqk`):
    /// `fwd_h`'s `stages` (all of them, or those after a [`Self::staged_prescan`]) write `h`,
    /// `v_new` and the final state, then the output.
    fn run_staged(
        &self,
        gpu: &Gpu,
        t: &ForwardTensors<'_>,
        full: &mut FullTiles,
        aqk: &DeviceTensor,
        stages: &[SplitStage],
        out: &mut DeltaFwdDeviceOutputs,
    ) -> GpuResult<()> {
        let Some(st) = full.staged.as_deref_mut() else {
            return Err(Error::missing("ws", "a workspace of this plan", "a fused one").into());
        };
        let mut fwd = self.fwd_h_inputs([&full.kg, &full.w, &full.u, &full.gate]);
        fwd.initial_state = t.initial_state;
        // fwd_h writes the final state straight into the caller's tensor (same shape and
        // dtype: checked by the caller)
        let fo = &mut st.out;
        std::mem::swap(&mut fo.final_state, &mut out.final_state);
        let ran = st.plan.run_stages(gpu, &fwd, &mut st.ws, fo, stages);
        std::mem::swap(&mut fo.final_state, &mut out.final_state);
        ran?;
        let v_new = fo
            .v_new
            .as_ref()
            .ok_or_else(|| Error::missing("v_new", "the staged plan's v_new", "none"))?;
        self.run_output(gpu, [&full.qg, &full.qf, aqk], &fo.h, v_new, &mut out.o)
    }

    /// Whether this (staged) plan can take its intra stage's results from a lean fused plan's
    /// (`gdn_intra`: Tb, G, Aqk) through `gdn_expand`: a scalar gate, bf16 / f16, `K` and `V`
    /// multiples of 8.
    fn expands_lean(&self) -> bool {
        self.fused.is_none()
            && self.prep.scalar_gate
            && matches!(self.dtype, Dtype::BF16 | Dtype::F16)
            && self.geo.k % 8 == 0
            && self.geo.v % 8 == 0
    }

    /// The intra stage of the exact fallback of a lean fused plan (this plan: its staged twin)
    /// from the lean intra stage's `lean` tiles: `gdn_expand` forms `w, u, kg, qg, qf, G` into
    /// `full`; the staged path ([`Self::run_staged`]) then runs on them with the lean stage's
    /// Aqk.
    fn expand(
        &self,
        gpu: &Gpu,
        t: &ForwardTensors<'_>,
        lean: &LeanTiles,
        full: &mut FullTiles,
    ) -> GpuResult<()> {
        let g = &self.geo;
        if self.nchunks > 0 && g.hv > 0 {
            let (q, k) = match &lean.qk {
                Some((qn, kn)) => (qn.ptr(gpu), kn.ptr(gpu)),
                None => (t.q.ptr(gpu), t.k.ptr(gpu)),
            };
            let args = ExpandArgs {
                q,
                k,
                v: t.v.ptr(gpu),
                tbh: lean.tbh.ptr(gpu),
                tbl: lean.tbl.ptr(gpu),
                g: lean.g.ptr(gpu),
                chunks: self.chunks.ptr(gpu),
                w: full.w.ptr_mut(gpu),
                u: full.u.ptr_mut(gpu),
                kg: full.kg.ptr_mut(gpu),
                qg: full.qg.ptr_mut(gpu),
                qf: full.qf.ptr_mut(gpu),
                gate: full.gate.ptr_mut(gpu),
                heads: g.h as i64,
                value_heads: g.hv as i64,
                k_dim: g.k as i64,
                v_dim: g.v as i64,
                bt: g.bt as i64,
                scale: self.prep.scale,
            };
            let blocks = g.k.div_ceil(OUT_MMA_BV) + g.v.div_ceil(OUT_MMA_BV);
            gpu.launch_3d(
                Module::KdaIntra,
                &format!("gdn_expand_{}", tag(self.dtype)),
                (
                    grid_x(self.nchunks, "q", "fewer than 2^31 chunks")?,
                    g.hv as u32,
                    blocks as u32,
                ),
                THREADS,
                0,
                &args,
            )?;
        }
        Ok(())
    }

    /// The in-kernel gate's side inputs of `t` (none for a decay `g`).
    fn gate_args(&self, gpu: &Gpu, t: &ForwardTensors<'_>) -> GateArgs {
        match self.prep.gate {
            GateInput::InKernel(lb) => GateArgs {
                a_log: t.a_log.map_or(0, |x| x.ptr(gpu)),
                dt_bias: t.dt_bias.map_or(0, |x| x.ptr(gpu)),
                a_log_dtype: t.a_log.map_or(-1, |x| dtype_code(x.dtype())),
                dt_bias_dtype: t.dt_bias.map_or(-1, |x| dtype_code(x.dtype())),
                has_lower_bound: lb.is_some() as i64,
                lower_bound: lb.unwrap_or(0.0),
                head_dim: self.geo.k as i64,
            },
            _ => GateArgs::none(),
        }
    }

    /// `gate_mode` of the intra kernel and of `kda_warm_bounds` (1: decay, 2: in-kernel gate).
    fn gate_mode(&self) -> i64 {
        match self.prep.gate {
            GateInput::Decay => 1,
            GateInput::InKernel(_) => 2,
        }
    }

    /// The intra kernel's arguments for `t` (outputs left 0).
    fn intra_args(&self, gpu: &Gpu, t: &ForwardTensors<'_>) -> GpuResult<IntraArgs> {
        let g = &self.geo;
        let gate = self.gate_args(gpu, t);
        Ok(IntraArgs {
            q: t.q.ptr(gpu),
            k: t.k.ptr(gpu),
            v: t.v.ptr(gpu),
            g: t.g.ptr(gpu),
            beta: t.beta.ptr(gpu),
            gate,
            chunks: self.chunks.ptr(gpu),
            heads: g.h as i64,
            value_heads: g.hv as i64,
            k_dim: g.k as i64,
            v_dim: g.v as i64,
            bt: g.bt as i64,
            g_dtype: dtype_code(t.g.dtype()),
            beta_dtype: dtype_code(t.beta.dtype()),
            gate_mode: self.gate_mode(),
            scalar_gate: self.prep.scalar_gate as i64,
            l2norm: self.prep.l2norm as i64,
            beta_mode: self.prep.beta_mode,
            safe_gate: self.prep.safe_gate as i64,
            scale: self.prep.scale,
            ..IntraArgs::default()
        })
    }

    /// The fused KDA path after the intra stage: the kernel (`delta_fused`) on the intra stage's
    /// `w, u, kg, qg, qf, Aqk` and `exp2(G_ℓ)` over the pieces ([`Self::launch_pieces`]).
    fn run_fused(
        &self,
        gpu: &Gpu,
        t: &ForwardTensors<'_>,
        ws: &FullTiles,
        split: SplitTensors<'_>,
        aqk: &DeviceTensor,
        out: &mut DeltaFwdDeviceOutputs,
    ) -> GpuResult<()> {
        let g = &self.geo;
        let Some(pc) = &self.pieces else {
            return Err(Error::missing("plan", "the fused path's pieces", "none").into());
        };
        if pc.n == 0 || g.hv == 0 || g.v == 0 {
            return Ok(());
        }
        let args = FusedArgs {
            kg: ws.kg.ptr(gpu),
            w: ws.w.ptr(gpu),
            qg: ws.qg.ptr(gpu),
            qf: ws.qf.ptr(gpu),
            u: ws.u.ptr(gpu),
            aqk: aqk.ptr(gpu),
            lam: ws.gate.ptr(gpu),
            h0: t.initial_state.map_or(0, |x| x.ptr(gpu)),
            seqs: self
                .seqs
                .as_ref()
                .ok_or_else(|| Error::missing("plan", "the fused kernel's sequence table", "none"))?
                .ptr(gpu),
            o: if self.state_only {
                0
            } else {
                out.o.ptr_mut(gpu)
            },
            ht: out.final_state.as_mut().map_or(0, |x| x.ptr_mut(gpu)),
            value_heads: g.hv as i64,
            k_dim: g.k as i64,
            v_dim: g.v as i64,
            bt: g.bt as i64,
            h0_dtype: t.initial_state.map_or(-1, |x| dtype_code(x.dtype())),
            v_first: self.state_v_first as i64,
            ..FusedArgs::default()
        };
        if pc.choice.wg {
            let args = KdaWgArgs::new(args, g.b * g.t)?;
            return self.launch_pieces(gpu, "mma", pc, split, args);
        }
        self.launch_pieces(gpu, "mma", pc, split, args)
    }

    /// One launch of the fused kernel `delta_fwd_{kind}_{dtype}_k{kp}_v{bv}` over `tasks`
    /// (sequence or piece, value head) pairs and the column blocks of `choice`, queued (the
    /// caller waits with `wait_if_checked`).
    fn launch_fused<A: DeviceRepr>(
        &self,
        gpu: &Gpu,
        kind: &str,
        choice: FusedChoice,
        tasks: usize,
        args: &A,
    ) -> GpuResult<()> {
        if choice.wg {
            // the Hopper kernel: the column blocks fastest in blockIdx.x
            let blocks = self.geo.v / choice.bv;
            let grid_x = grid_x(tasks * blocks, "v", "N * HV * V / 64 < 2^31")?;
            let name = if choice.lean {
                "delta_fwd_gdn_wg_bf16"
            } else {
                "delta_fwd_kda_wg_bf16"
            };
            return gpu.queue_with_smem(
                Module::DeltaFwdWg,
                name,
                (grid_x, 1),
                THREADS,
                choice.smem_bytes() as u32,
                args,
            );
        }
        let grid_x = grid_x(tasks, "v", "N * HV < 2^31")?;
        let name = format!(
            "delta_fwd_{kind}_{}_k{}_v{}",
            tag(self.dtype),
            choice.kp,
            choice.bv
        );
        gpu.queue_with_smem(
            Module::DeltaFwd,
            &name,
            (grid_x, self.geo.v.div_ceil(choice.bv) as u32),
            THREADS,
            choice.smem_bytes() as u32,
            args,
        )
    }

    /// The lean fused GDN path after the intra stage: the kernel (`delta_fused_gdn`) on `t`'s
    /// `q, k` (or the normalised ones), `v`, the intra stage's `Tb` hi + lo, `G` and `Aqk` over the
    /// pieces ([`Self::launch_pieces`]).
    fn run_lean(
        &self,
        gpu: &Gpu,
        t: &ForwardTensors<'_>,
        l: &LeanTiles,
        split: SplitTensors<'_>,
        aqk: &DeviceTensor,
        out: &mut DeltaFwdDeviceOutputs,
    ) -> GpuResult<()> {
        let g = &self.geo;
        let Some(pc) = &self.pieces else {
            return Err(Error::missing("plan", "the lean path's pieces", "none").into());
        };
        if pc.n == 0 || g.hv == 0 || g.v == 0 {
            return Ok(());
        }
        // the Hopper kernel reads the raw q, k (with l2norm, and the norms' reciprocals)
        let (q, k) = match &l.qk {
            Some((qn, kn)) if !pc.choice.wg => (qn.ptr(gpu), kn.ptr(gpu)),
            _ => (t.q.ptr(gpu), t.k.ptr(gpu)),
        };
        let args = GdnFusedArgs {
            q,
            k,
            v: t.v.ptr(gpu),
            tbh: l.tbh.ptr(gpu),
            tbl: l.tbl.ptr(gpu),
            aqk: aqk.ptr(gpu),
            g: l.g.ptr(gpu),
            h0: t.initial_state.map_or(0, |x| x.ptr(gpu)),
            o: if self.state_only {
                0
            } else {
                out.o.ptr_mut(gpu)
            },
            ht: out.final_state.as_mut().map_or(0, |x| x.ptr_mut(gpu)),
            rqk: l.rqk.as_ref().map_or(0, |r| r.ptr(gpu)),
            qk_heads: g.h as i64,
            value_heads: g.hv as i64,
            k_dim: g.k as i64,
            v_dim: g.v as i64,
            bt: g.bt as i64,
            h0_dtype: t.initial_state.map_or(-1, |x| dtype_code(x.dtype())),
            v_first: self.state_v_first as i64,
            scale: self.prep.scale,
            ..GdnFusedArgs::default()
        };
        if pc.choice.wg {
            let args = GdnWgArgs::new(args, g.b * g.t)?;
            return self.launch_pieces(gpu, "gdn", pc, split, args);
        }
        self.launch_pieces(gpu, "gdn", pc, split, args)
    }

    /// The fused kernel `kind` over the pieces `pc` with `args` (their piece fields set here),
    /// after the split's warm-up policy ([`Self::run`] queues it beside the intra stage): the
    /// kernel over the pieces, or, where the split is wider than the serial run, the split
    /// launch and the serial launch for the (sequence, head) pairs the verdict (`warm_walk`)
    /// leaves to it, the serial one on a second stream beside the split's.
    fn launch_pieces<A: PieceArgs>(
        &self,
        gpu: &Gpu,
        kind: &str,
        pc: &Pieces,
        split: SplitTensors<'_>,
        args: A,
    ) -> GpuResult<()> {
        let g = &self.geo;
        let check = format!("delta_fwd_{kind}");
        if pc.split != split.warm.is_some() {
            return Err(Error::missing("ws", "the split's warm-up tensor", "none").into());
        }
        let warm_ptr = split.warm.map_or(0, |w| w.ptr(gpu));
        let table = pc.table.ptr(gpu);
        let Some((serial_table, _)) = &pc.serial else {
            let all = args.with_pieces(table, pc.n, warm_ptr, 0, 0);
            self.launch_fused(gpu, kind, pc.choice, pc.n * g.hv, &all)?;
            return gpu.wait_if_checked(&check);
        };
        let (Some(serial), Some(gate)) = (self.fused, split.verdict) else {
            return Err(Error::missing("ws", "the split's verdict tensor", "none").into());
        };
        let gate = gate.ptr(gpu);
        let seqs = g.seqs.len();
        let wide = args.with_pieces(table, pc.n, warm_ptr, gate, 1);
        let rest = args.with_pieces(serial_table.ptr(gpu), seqs, 0, gate, 2);
        // the serial CTAs (long chains) on a second stream, beside the split's
        gpu.beside(
            |side| self.launch_fused(side, kind, serial, seqs * g.hv, &rest),
            |main| self.launch_fused(main, kind, pc.choice, pc.n * g.hv, &wide),
        )?;
        gpu.wait_if_checked(&check)
    }

    /// Whether the fused split would leave a serial chain longer than the staged path's cost:
    /// at least [`EXACT_FALLBACK_CHUNKS`] chunks and more than the call's (chunk, value head)
    /// pairs over [`FALLBACK_COST_RATIO`]. From the policy's `warm` (`[P · HV]`) and, with a
    /// wider split, its `verdict` (`[N · HV]`), read on the host (one synchronisation): a
    /// (sequence, head) the verdict gives to the serial launch runs its whole sequence as one
    /// chain; otherwise a CTA's chain is its warm-up (up to the sequence's start under long
    /// memory), its piece and the pieces after it marked `-1` (run through).
    fn needs_exact_fallback(
        &self,
        gpu: &Gpu,
        pc: &Pieces,
        warm: &DeviceTensor,
        verdict: Option<&DeviceTensor>,
    ) -> GpuResult<bool> {
        let (hv, bt) = (self.geo.hv, self.geo.bt);
        let seq_chunks = seq_chunks(&self.geo);
        let piece_chunks: Vec<usize> = (0..pc.n)
            .map(|p| (pc.rows[p * 5 + 1] as usize).div_ceil(bt))
            .collect();
        let verdict = verdict
            .map(|v| {
                v.to_array::<i64>(gpu)
                    .map(|a| a.iter().copied().collect::<Vec<_>>())
            })
            .transpose()?;
        let warm: Vec<i64> = warm.to_array::<i64>(gpu)?.iter().copied().collect();
        Ok(exact_fallback_due(
            &seq_chunks,
            hv,
            &piece_chunks,
            &warm,
            verdict.as_deref(),
            fallback_ratio(pc.choice),
        ))
    }

    /// The plan without the exact fallback (the fused split runs whatever its policy finds),
    /// for callers that must not wait on the host inside [`Self::run`] (the context-parallel
    /// summaries, queued rank after rank from one thread).
    pub fn without_exact_fallback(mut self) -> DeltaFwdPlan {
        self.fallback = None;
        self
    }

    /// The plan whose fused runs compute the final state alone and leave `o` unwritten (the
    /// output's products and stores skipped in every chunk, as in a warm-up; the state chain
    /// and its rounding unchanged): the context-parallel summaries, which read only the final
    /// state. Crate-internal, so that no caller gets an `o` that looks written. A staged plan
    /// (or its exact fallback) still writes `o`.
    pub(crate) fn final_state_only(mut self, gpu: &Gpu) -> GpuResult<DeltaFwdPlan> {
        self.state_only = self.fused.is_some();
        if let Some(f) = self.fused.filter(|f| f.wg) {
            // the summaries keep the mma.sync kernel (the Hopper kernel's state-only form is not
            // built yet): its tiles, and the pieces chosen for them
            let g = &self.geo;
            let chunks = seq_chunks(g);
            let sm = gpu.sm_count();
            self.fused = Some(fused_choice(g.k, g.v, &chunks, g.hv, sm, f.lean, false));
            self.pieces = Self::pieces(gpu, &self.geo, self.fused, self.split_rule)?;
        }
        Ok(self)
    }

    /// Queues the warm-up policy of the next [`Self::run`] of `t` with `ws` now, where the plan
    /// holds the exact fallback (else nothing): that run then reads its choice without waiting
    /// for the policy behind the work queued in between. The context-parallel plans queue every
    /// rank's policy first, so that each rank's read finds it done.
    pub fn queue_policy(
        &self,
        gpu: &Gpu,
        t: &ForwardTensors<'_>,
        ws: &mut DeltaFwdWorkspace,
    ) -> GpuResult<()> {
        let (Some(pc), Some(rule), Some(_), Some(pt)) = (
            &self.pieces,
            self.split_rule,
            &self.fallback,
            ws.policy.as_mut(),
        ) else {
            return Ok(());
        };
        let v = ws.verdict.as_mut().zip(pc.serial.as_ref().map(|s| s.1));
        self.run_warm_policy(gpu, t, &pc.table, pc.n, rule.max_warmup_chunks, pt, v)?;
        ws.policy_queued = true;
        Ok(())
    }

    /// Whether the last run of `ws` took the exact fallback (the debug query of the choice).
    pub fn ran_exact_fallback(&self, ws: &DeltaFwdWorkspace) -> bool {
        ws.fell_back
    }

    /// Whether [`Self::run_warm_policy`] has kernels for this plan's dtype (bf16, f16).
    pub(crate) fn has_warm_policy(&self) -> bool {
        matches!(self.dtype, Dtype::BF16 | Dtype::F16)
    }

    /// The warm-up chunks (at most `wmax`, 1..=64) per (piece, value head) of `pieces`
    /// (`npieces` rows of the `[P, 5]` table, rows of `t`) into `policy.warm` (`[P · HV]` i64),
    /// by §5.10's bound, in two launches: the bound of every chunk of every piece's window
    /// (`gdn_warm_bounds` for a scalar gate, `kda_warm_bounds` for per-key gates: one CTA per
    /// (piece, window chunk, value head), into `policy.lam`), then `warm_walk` (a warp per
    /// (sequence, value head), a lane per piece) sums each window in order up to `ln 2^-30`.
    /// With `verdict` (its tensor and the longest chain the wide split may run), the walk also
    /// writes the verdict per (sequence, value head) of a split wider than the serial run. The
    /// split's warm-ups; the context-parallel summaries use it for the tail of a shard.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run_warm_policy(
        &self,
        gpu: &Gpu,
        t: &ForwardTensors<'_>,
        pieces: &DeviceTensor,
        npieces: usize,
        wmax: usize,
        policy: &mut PolicyTensors,
        verdict: Option<(&mut DeviceTensor, i64)>,
    ) -> GpuResult<()> {
        if !self.has_warm_policy() {
            return Err(Error::dtype(
                "q",
                "bfloat16 or float16 (the bound's kernels)",
                self.dtype.name(),
            )
            .into());
        }
        let g = &self.geo;
        if !(1..=MAX_WARMUP_CHUNKS).contains(&wmax)
            || policy.lam.numel() < npieces * wmax * g.hv
            || policy.warm.numel() < npieces * g.hv
        {
            return Err(Error::missing(
                "policy",
                "bound and warm-up tensors for these pieces (wmax in 1..=64)",
                format!(
                    "{} bounds, {} warm-ups",
                    policy.lam.numel(),
                    policy.warm.numel()
                ),
            )
            .into());
        }
        if npieces == 0 || g.hv == 0 {
            return Ok(());
        }
        let grid = grid_x(
            npieces * wmax,
            "v",
            "fewer than 2^31 (piece, window chunk) pairs",
        )?;
        let w = WarmArgs {
            pieces: pieces.ptr(gpu),
            g: t.g.ptr(gpu),
            beta: t.beta.ptr(gpu),
            k: t.k.ptr(gpu),
            lam: policy.lam.ptr_mut(gpu),
            heads: g.h as i64,
            value_heads: g.hv as i64,
            k_dim: g.k as i64,
            bt: g.bt as i64,
            npieces: npieces as i64,
            wmax: wmax as i64,
            g_dtype: dtype_code(t.g.dtype()),
            beta_dtype: dtype_code(t.beta.dtype()),
            l2norm: self.prep.l2norm as i64,
        };
        if let Call::Kda(_) = self.call {
            let args = KdaWarmArgs {
                w,
                gate: self.gate_args(gpu, t),
                gate_mode: self.gate_mode(),
                beta_mode: self.prep.beta_mode,
            };
            gpu.launch_3d(
                Module::DeltaFwd,
                &format!("kda_warm_bounds_{}", tag(self.dtype)),
                (grid, g.hv as u32, 1),
                WARM_THREADS,
                0,
                &args,
            )?;
        } else {
            gpu.launch_3d(
                Module::DeltaFwd,
                &format!("gdn_warm_bounds_{}", tag(self.dtype)),
                (grid, g.hv as u32, 1),
                WARM_THREADS,
                0,
                &w,
            )?;
        }
        let (gate, max_chain) = match verdict {
            Some((v, m)) => (v.ptr_mut(gpu), m),
            None => (0, 0),
        };
        let walk = WalkArgs {
            pieces: pieces.ptr(gpu),
            lam: policy.lam.ptr(gpu),
            warm: policy.warm.ptr_mut(gpu),
            gate,
            value_heads: g.hv as i64,
            bt: g.bt as i64,
            npieces: npieces as i64,
            wmax: wmax as i64,
            max_chain,
            log_eps: LOG_EPS,
        };
        let warps_per_block = (WALK_THREADS / 32) as usize;
        let blocks = grid_x(
            (npieces * g.hv).div_ceil(warps_per_block),
            "v",
            "fewer than 2^33 (piece, head) pairs",
        )?;
        gpu.launch_3d(
            Module::DeltaFwd,
            "warm_walk",
            (blocks, 1, 1),
            WALK_THREADS,
            0,
            &walk,
        )
    }

    /// The staged path's output kernel on `[qg, qf, Aqk]` of the intra stage and `fwd_h`'s `h`
    /// and `v_new`.
    fn run_output(
        &self,
        gpu: &Gpu,
        [qg, qf, aqk]: [&DeviceTensor; 3],
        h: &DeviceTensor,
        v_new: &DeviceTensor,
        o: &mut DeviceTensor,
    ) -> GpuResult<()> {
        let g = &self.geo;
        if self.nchunks == 0 || g.hv == 0 || g.v == 0 {
            return Ok(());
        }
        let args = OutArgs {
            qg: qg.ptr(gpu),
            qf: qf.ptr(gpu),
            h: h.ptr(gpu),
            aqk: aqk.ptr(gpu),
            v_new: v_new.ptr(gpu),
            o: o.ptr_mut(gpu),
            chunks: self.chunks.ptr(gpu),
            value_heads: g.hv as i64,
            k_dim: g.k as i64,
            v_dim: g.v as i64,
            bt: g.bt as i64,
            v_first: self.state_v_first as i64,
        };
        let grid_x = grid_x(self.nchunks, "q", "fewer than 2^31 chunks")?;
        // tensor cores where the tiles travel as 16-byte copies (bf16/f16, K and V multiples
        // of 8); the FMA kernel otherwise (fp32/fp64 keep their IEEE products)
        let mma = matches!(self.dtype, Dtype::BF16 | Dtype::F16) && g.k % 8 == 0 && g.v % 8 == 0;
        let (kind, cols, smem) = if mma {
            ("mma", OUT_MMA_BV, 0)
        } else {
            ("fma", KT, out_smem(self.dtype))
        };
        gpu.launch_3d(
            Module::KdaIntra,
            &format!("delta_output_{kind}_{}", tag(self.dtype)),
            (grid_x, g.hv as u32, g.v.div_ceil(cols) as u32),
            THREADS,
            smem,
            &args,
        )
    }
}

/// `kda_fwd` into new outputs (`conformance/spec/ops-delta-rule.md` §6.3).
pub fn kda_fwd(
    gpu: &Gpu,
    t: &ForwardTensors<'_>,
    cu_seqlens: Option<&[i64]>,
    p: &KdaFwdParams,
    path: ForwardPath,
) -> GpuResult<DeltaFwdDeviceOutputs> {
    let plan = DeltaFwdPlan::kda(gpu, t, cu_seqlens, p, path)?;
    run_new(gpu, &plan, t)
}

/// `gdn_fwd` into new outputs (`conformance/spec/ops-delta-rule.md` §8.3).
pub fn gdn_fwd(
    gpu: &Gpu,
    t: &ForwardTensors<'_>,
    cu_seqlens: Option<&[i64]>,
    p: &GdnFwdParams,
    path: ForwardPath,
) -> GpuResult<DeltaFwdDeviceOutputs> {
    let plan = DeltaFwdPlan::gdn(gpu, t, cu_seqlens, p, path)?;
    run_new(gpu, &plan, t)
}

fn run_new(
    gpu: &Gpu,
    plan: &DeltaFwdPlan,
    t: &ForwardTensors<'_>,
) -> GpuResult<DeltaFwdDeviceOutputs> {
    let mut ws = plan.alloc_workspace(gpu)?;
    let mut out = plan.alloc_outputs(gpu)?;
    plan.run(gpu, t, &mut ws, &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use attn_reference::varlen::Seq;
    use proptest::prelude::*;

    /// [`exact_fallback_due`] under the `mma.sync` kernels' [`FALLBACK_COST_RATIO`].
    fn due(seq: &[usize], hv: usize, pc: &[usize], warm: &[i64], verdict: Option<&[i64]>) -> bool {
        exact_fallback_due(seq, hv, pc, warm, verdict, FALLBACK_COST_RATIO)
    }

    /// The chain length from which [`exact_fallback_due`] falls back, for `chunk_heads`.
    fn long(chunk_heads: usize) -> usize {
        fallback_chain(&[chunk_heads], 1, FALLBACK_COST_RATIO)
    }

    /// One sequence of `pieces` equal pieces of `len` chunks over `hv` heads, every warm-up `w`.
    fn even(pieces: usize, len: usize, hv: usize, w: i64) -> (Vec<usize>, Vec<usize>, Vec<i64>) {
        (vec![pieces * len], vec![len; pieces], vec![w; pieces * hv])
    }

    #[test]
    fn short_warm_ups_keep_the_fused_split() {
        let (seq, pc, mut warm) = even(16, 128, 4, 2);
        (0..4).for_each(|h| warm[h] = 0); // the first piece starts at the sequence start
        assert!(!due(&seq, 4, &pc, &warm, None));
        assert!(!due(&seq, 4, &pc, &warm, Some(&[1, 1, 1, 1])));
    }

    #[test]
    fn run_throughs_fall_back_once_their_chain_is_long() {
        let (hv, len) = (4, 128);
        let (seq, pc, mut warm) = even(16, len, hv, 2);
        let need = long(seq[0] * hv).div_ceil(len); // pieces in the shortest long chain
        assert!(need > 1 && need <= 16);
        // head 1: its first piece from the start, the next need - 2 run through: one short
        for p in 1..need - 1 {
            warm[p * hv + 1] = -1;
        }
        warm[1] = 0;
        assert!(!due(&seq, hv, &pc, &warm, None));
        warm[(need - 1) * hv + 1] = -1;
        assert!(due(&seq, hv, &pc, &warm, None));
    }

    #[test]
    fn a_serial_verdict_falls_back_on_long_sequences_only() {
        // a sequence of 16 pieces of 64 chunks and one of 40 chunks in one piece, no warm-ups
        // (short chains): only the verdict can make one long
        let hv = 2;
        let seq = vec![16 * 64, 40];
        let mut pc = vec![64; 16];
        pc.push(40);
        assert!(seq[0] >= long((seq[0] + seq[1]) * hv) && 64 < long((seq[0] + seq[1]) * hv));
        let warm = vec![0; pc.len() * hv];
        let with = |verdict: [i64; 4]| due(&seq, hv, &pc, &warm, Some(&verdict));
        assert!(with([1, 0, 1, 1]), "the long sequence's head 1 serial");
        assert!(!with([1, 1, 0, 0]), "the short sequence serial");
        assert!(!with([1, 1, 1, 1]), "everything split");
    }

    #[test]
    fn many_heads_raise_the_bar() {
        // one head run through its whole 512-chunk sequence: a fallback at 2 heads, not at 64
        // (the staged path's cost grows with the heads, the chain does not)
        for (hv, expected) in [(2, true), (64, false)] {
            let (seq, pc, mut warm) = even(8, 64, hv, 1);
            for p in 0..8 {
                warm[p * hv] = if p == 0 { 0 } else { -1 };
            }
            assert_eq!(due(&seq, hv, &pc, &warm, None), expected, "hv {hv}");
        }
    }

    #[test]
    fn the_hopper_rows_never_hold_a_fallback() {
        // S19/S20's split rows at the Hopper kernel's ratio: no chain can reach the bar
        // (a chain never leaves its sequence), so no host read; at one head it can
        let wg = WG_FALLBACK_COST_RATIO;
        for (seq, hv) in [(vec![2048], 4), (vec![1024], 8), (vec![512; 1], 32)] {
            assert!(!exact_fallback_possible(&seq, hv, wg), "{seq:?} x {hv}");
        }
        assert!(exact_fallback_possible(&[2048], 1, wg));
        assert!(exact_fallback_possible(&[2048], 4, FALLBACK_COST_RATIO));
        assert!(!exact_fallback_possible(&[255], 1, FALLBACK_COST_RATIO));
    }

    proptest! {
        /// Where no fallback is possible, no warm-ups or verdict make one due.
        #[test]
        fn an_impossible_fallback_is_never_due(
            hv in 1usize..6,
            lens in proptest::collection::vec(1usize..400, 1..6),
            ratio in 1usize..8,
            warm_seed in proptest::collection::vec(-1i64..64, 64 * 5),
            verdict_seed in proptest::collection::vec(0i64..2, 6 * 5),
        ) {
            prop_assume!(!exact_fallback_possible(&lens, hv, ratio));
            // each sequence in pieces of at most 64 chunks, in order
            let pc: Vec<usize> = lens
                .iter()
                .flat_map(|&c| (0..c.div_ceil(64)).map(move |j| (c - 64 * j).min(64)))
                .collect();
            let warm: Vec<i64> = warm_seed.iter().cycle().take(pc.len() * hv).copied().collect();
            let verdict = &verdict_seed[..lens.len() * hv];
            // warm-ups within the sequence: the first piece of each sequence from its start
            let mut warm = warm;
            let mut p = 0;
            for &c in &lens {
                let (mut before, n) = (0, c.div_ceil(64));
                for j in 0..n {
                    for h in 0..hv {
                        let w = &mut warm[(p + j) * hv + h];
                        *w = if j == 0 { 0 } else { (*w).min(before as i64) };
                    }
                    before += pc[p + j];
                }
                p += n;
            }
            prop_assert!(!exact_fallback_due(&lens, hv, &pc, &warm, Some(verdict), ratio));
            prop_assert!(!exact_fallback_due(&lens, hv, &pc, &warm, None, ratio));
        }

        /// Running one more piece through never turns a fallback into none (its chain only
        /// grows), and warm-ups are read per (piece, head).
        #[test]
        fn running_through_more_never_undoes_a_fallback(
            hv in 1usize..5,
            lens in proptest::collection::vec(1usize..200, 1..24),
            warm_seed in proptest::collection::vec(-1i64..40, 24 * 4),
            flip in 0usize..96,
        ) {
            let pc = lens.clone();
            let seq = vec![lens.iter().sum::<usize>()];
            let mut warm: Vec<i64> = warm_seed[..pc.len() * hv].to_vec();
            (0..hv).for_each(|h| warm[h] = warm[h].max(0));
            let before = due(&seq, hv, &pc, &warm, None);
            let i = flip % warm.len();
            if i >= hv {
                warm[i] = -1;
            }
            let after = due(&seq, hv, &pc, &warm, None);
            prop_assert!(!before || after);
        }
    }

    fn geo(lens: &[usize], bt: usize) -> Geometry {
        let mut bos = 0;
        let seqs = lens
            .iter()
            .enumerate()
            .map(|(n, &l)| {
                let s = Seq {
                    n,
                    batch: 0,
                    bos,
                    eos: bos + l,
                };
                bos += l;
                s
            })
            .collect();
        Geometry {
            b: 1,
            t: bos,
            h: 1,
            hv: 1,
            k: 64,
            v: 64,
            bt,
            seqs,
        }
    }

    /// A xorshift stream from `seed`: each call a number below its argument.
    fn below(mut seed: u64) -> impl FnMut(usize) -> usize {
        move |m| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % m as u64) as usize
        }
    }

    /// The pieces of any layout cover each sequence once, in order and contiguous in the table,
    /// at chunk boundaries, each at least `min_piece_chunks` long when a sequence is split; a
    /// layout whose sequences are at most `L = max(min_piece_chunks, ⌈Σ chunks / piece slots⌉)`
    /// chunks is not split, the longest pieces come first, and the split's makespan is never
    /// above the unsplit one's.
    #[test]
    fn pieces_cover_every_sequence_at_chunk_boundaries() {
        let rule = SplitRule {
            min_piece_chunks: 3,
            max_warmup_chunks: 8,
        };
        let mut next = below(0x9e37_79b9_u64);
        let mut splits = 0;
        for _ in 0..600 {
            let bt = [16, 32, 64][next(3)];
            let lens: Vec<usize> = (0..1 + next(6)).map(|_| next(60 * bt)).collect();
            let g = geo(&lens, bt);
            let chunks: Vec<usize> = g.seqs.iter().map(|s| s.num_chunks(bt)).collect();
            let (heads, blocks) = (1 + next(8), 1 + next(4));
            let resident = 1 + next(200);
            let per = split_pieces(&chunks, heads, blocks, resident, &rule);
            let slots = (resident / (heads * blocks)).max(1);
            let target = rule
                .min_piece_chunks
                .max(chunks.iter().sum::<usize>().div_ceil(slots));
            let ones = vec![1; chunks.len()];
            let span = |p: &[usize]| makespan(&piece_steps(&chunks, p), heads, blocks, resident);
            assert!(span(&per) <= span(&ones), "{lens:?} {per:?}");
            splits += usize::from(per.iter().any(|&m| m > 1));
            if chunks.iter().all(|&c| c <= target) {
                assert_eq!(per, ones, "{lens:?}: no sequence longer than L, no split");
            }
            let rows = piece_table(&g, &per);
            assert_eq!(rows.len() / 5, per.iter().sum::<usize>());
            let mut seen = vec![false; lens.len()];
            let mut i = 0;
            let mut last_len = usize::MAX;
            while i < rows.len() / 5 {
                let s = &g.seqs[rows[5 * i + 4] as usize];
                assert!(
                    !seen[s.n],
                    "{lens:?} {per:?}: a sequence's pieces are contiguous"
                );
                seen[s.n] = true;
                let m = per[s.n];
                assert!(
                    piece_len(chunks[s.n], m) <= last_len,
                    "longest pieces first"
                );
                last_len = piece_len(chunks[s.n], m);
                if m > 1 {
                    assert!(chunks[s.n] / m >= rule.min_piece_chunks, "{lens:?} {per:?}");
                }
                let mut at = s.bos;
                for _ in 0..m {
                    let r = &rows[5 * i..5 * i + 5];
                    assert_eq!(r[0] as usize, at, "pieces in order, no gap");
                    assert_eq!((r[0] as usize - s.bos) % bt, 0, "a chunk boundary");
                    assert_eq!(
                        (r[2] as usize, r[3] as usize, r[4] as usize),
                        (s.bos, s.eos, s.n)
                    );
                    at += r[1] as usize;
                    i += 1;
                }
                assert_eq!(at, s.eos, "the pieces end at the sequence's end");
            }
            assert!(seen.iter().all(|&x| x), "every sequence has its pieces");
        }
        assert!(splits > 100, "the layouts exercise the split: {splits}");
    }

    /// The makespan of list scheduling in grid order lies between the obvious lower bound
    /// (the longest row; all CTA-steps over the resident slots) and Graham's upper bound (that
    /// plus the longest row), and is exact on hand-checked grids.
    #[test]
    fn makespan_lies_between_the_bounds() {
        // one wave
        assert_eq!(makespan(&[129; 16], 4, 2, 132), 129);
        // the mixed row at 64 columns, 16 pieces of the long sequence: 64 + 40 CTAs of block 0,
        // 28 of the long ones of block 1 in the first wave, the other 36 after the short ones
        let mut mixed = vec![128];
        mixed.extend([129; 15]);
        mixed.extend([16; 10]);
        assert_eq!(makespan(&mixed, 4, 2, 132), 16 + 129);
        let mut next = below(0x2545_f491_u64);
        for _ in 0..300 {
            let steps: Vec<usize> = (0..1 + next(40)).map(|_| next(300)).collect();
            let (heads, blocks, resident) = (1 + next(8), 1 + next(4), 1 + next(150));
            let span = makespan(&steps, heads, blocks, resident);
            let longest = steps.iter().copied().max().unwrap();
            let work = steps.iter().sum::<usize>() * heads * blocks;
            assert!(span >= longest.max(work.div_ceil(resident)), "{steps:?}");
            assert!(span <= work / resident + longest, "{steps:?}");
        }
    }

    /// The split's width on an H100 (132 SMs), K = V = 128: few long sequences split at the
    /// widest block into many pieces (H4 × 131072: 16 pieces of 128 chunks at 64 columns, the
    /// serial run at 16; H32 × 32768: 2 pieces at 64 columns, serial at 32; H4 × 4·8192: 4
    /// pieces each; H2/HV8 × 65536: 8 pieces), a grid the serial run already fills (HV 64) does
    /// not split. The mixed row (131072 + 10·1024 tokens, H4) sizes its pieces for the makespan:
    /// 16 pieces of the long sequence at 64 columns (128 + 10·4·2 CTAs: 36 of the long ones
    /// start after the short sequences' 16 chunks, 145 steps), not 5 of one wave (411 steps).
    #[test]
    fn split_choice_widens_few_long_sequences() {
        let rule = SplitRule::default();
        let serial = |chunks: &[usize], hv| fused_choice(128, 128, chunks, hv, 132, true, false);
        let c4 = [2048];
        let s4 = serial(&c4, 4);
        assert_eq!(s4.bv, 16);
        assert_eq!(s4.resident_ctas(132), 132, "one CTA per SM");
        let (wide, per) = split_choice(128, &c4, 4, 132, s4, &rule);
        assert_eq!((wide.bv, per.as_slice()), (64, &[16][..]));
        assert!(
            fused_estimate(wide, 128, &c4, &per, 4, 132)
                < fused_estimate(s4, 128, &c4, &[1], 4, 132) / 3.0
        );
        let c32 = [512];
        let s32 = serial(&c32, 32);
        assert_eq!(s32.bv, 32);
        let (w32, per) = split_choice(128, &c32, 32, 132, s32, &rule);
        assert_eq!((w32.bv, per.as_slice()), (64, &[2][..]));
        let c4x4 = [128; 4];
        let (w4x4, per) = split_choice(128, &c4x4, 4, 132, serial(&c4x4, 4), &rule);
        assert_eq!((w4x4.bv, per.as_slice()), (64, &[4, 4, 4, 4][..]));
        // any layout: the serial width, or another one that splits
        let mut next = below(0x2545_f491_u64);
        for _ in 0..500 {
            let chunks: Vec<usize> = (0..1 + next(6)).map(|_| next(3000)).collect();
            let (hv, v) = (1 + next(64), [32, 64, 100, 128][next(4)]);
            let s = fused_choice(128, v, &chunks, hv, 132, true, false);
            let (c, per) = split_choice(v, &chunks, hv, 132, s, &rule);
            assert!(
                c == s || per.iter().any(|&m| m > 1),
                "{chunks:?} hv {hv} v {v}"
            );
        }
        let c64 = [1024];
        let s64 = serial(&c64, 64);
        let (same, per) = split_choice(128, &c64, 64, 132, s64, &rule);
        assert_eq!((same, per.as_slice()), (s64, &[1][..]));
        let hv8 = [1024];
        let (w8, per) = split_choice(128, &hv8, 8, 132, serial(&hv8, 8), &rule);
        assert_eq!((w8.bv, per.as_slice()), (64, &[8][..]));
        // the mixed row: the long sequence in 16 pieces, listed first; the short ones whole
        let mut mixed = vec![2048];
        mixed.extend([16; 10]);
        let sm = serial(&mixed, 4);
        let (wm, per) = split_choice(128, &mixed, 4, 132, sm, &rule);
        assert_eq!(wm.bv, 64);
        assert!(per[0] >= 14, "{per:?}");
        assert_eq!(per, [&[16][..], &[1; 10]].concat());
        let rows = piece_rows(&mixed, &per);
        assert!(rows[..16].iter().all(|&(s, _, _)| s == 0), "{rows:?}");
        let est = fused_estimate(wm, 128, &mixed, &per, 4, 132);
        assert_eq!(est, step_cost(wm) * 145.0);
        let one_wave = fused_estimate(wm, 128, &mixed, &[&[5][..], &[1; 10]].concat(), 4, 132);
        assert_eq!(one_wave, step_cost(wm) * 411.0);
        // the GPU test's case (gdn_auto_split: HV 2, 128 chunks, pieces of at least 4 chunks):
        // split at a wider block than the serial run
        let small = SplitRule {
            min_piece_chunks: 4,
            max_warmup_chunks: 8,
        };
        let c2 = [128];
        let s2 = serial(&c2, 2);
        let (w2, per) = split_choice(128, &c2, 2, 132, s2, &small);
        assert!(w2.bv > s2.bv && per[0] > 1, "{w2:?} {per:?}");
        let cv = [24, 1, 18];
        let (_, per) = split_choice(128, &cv, 2, 132, serial(&cv, 2), &small);
        assert!(per.iter().any(|&m| m > 1), "{per:?}");
    }

    #[test]
    fn split_choice_splits_kda_too() {
        // the KDA kernel's tiles (`lean: false`) and step costs
        let rule = SplitRule::default();
        let serial = |chunks: &[usize], hv| fused_choice(128, 128, chunks, hv, 132, false, false);
        let c4 = [2048];
        let s4 = serial(&c4, 4);
        assert!(!s4.lean);
        let (wide, per) = split_choice(128, &c4, 4, 132, s4, &rule);
        assert!(!wide.lean && per[0] >= 8, "{wide:?} {per:?}");
        let (est, est1) = (
            fused_estimate(wide, 128, &c4, &per, 4, 132),
            fused_estimate(s4, 128, &c4, &[1], 4, 132),
        );
        assert!(est < est1 / 3.0, "{est} {est1}");
        // the GPU test's cases (kda_auto_split)
        let small = SplitRule {
            min_piece_chunks: 4,
            max_warmup_chunks: 8,
        };
        let c2 = [128];
        let (_, per) = split_choice(128, &c2, 2, 132, serial(&c2, 2), &small);
        assert!(per[0] > 1, "{per:?}");
        let cv = [24, 1, 18];
        let (_, per) = split_choice(128, &cv, 2, 132, serial(&cv, 2), &small);
        assert!(per.iter().any(|&m| m > 1), "{per:?}");
        // many heads fill the GPU already: no split
        let c64 = [1024];
        let s64 = serial(&c64, 64);
        let (same, per) = split_choice(128, &c64, 64, 132, s64, &rule);
        assert_eq!((same, per.as_slice()), (s64, &[1][..]));
    }
}
