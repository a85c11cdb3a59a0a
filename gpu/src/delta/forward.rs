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
//!   `kg, w, u, G` writes `h` and `v_new`, and an output kernel forms
//!   `o = diag(qf) qg h + Aqk v_new`: the checkable stages.
//!
//! GDN is the same with the scalar gate broadcast over `K` (§8.5); its staged path passes the
//! raw keys and `g = G` to `fwd_h`, as FLA does. Its fused path is leaner: with a scalar gate
//! `u − w S = Akk diag(β) (V − diag(exp2(G)) K S)`, so the intra stage writes only
//! `Tb = Akk diag(β)` (hi + lo halves), `Aqk` and `G`, and the fused kernel reads `q, k, v`
//! themselves (`delta_fused_gdn`; the normalised `q, k` with l2norm), and splits long sequences
//! into pieces with exact warm-ups when the GPU would otherwise idle ([`SplitRule`], §5.9–5.10).
//! Float32 runs IEEE fp32 FMAs throughout, float64 fp64.

use super::fwd_h::{FwdHDeviceOutputs, FwdHPlan, FwdHTensors};
use super::intra::{
    acc_dtype, chunk_table, launch_gdn_intra, launch_intra, tag, IntraArgs, KT, MAX_BT, THREADS,
};
use super::launch::{cheapest_width, grid_x, seq_table, SMEM_PER_SM};
use crate::device::Gpu;
use crate::error::GpuResult;
use crate::kernels::Module;
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

/// Mirror of `FusedArgs` (delta_fwd.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct FusedArgs {
    kg: u64,
    w: u64,
    qg: u64,
    qf: u64,
    u: u64,
    aqk: u64,
    lam: u64,
    h0: u64,
    seqs: u64,
    o: u64,
    ht: u64,
    value_heads: i64,
    k_dim: i64,
    v_dim: i64,
    bt: i64,
    h0_dtype: i64,
    v_first: i64,
}
// SAFETY: as above.
unsafe impl DeviceRepr for FusedArgs {}

/// Mirror of `GdnFusedArgs` (delta_fwd.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct GdnFusedArgs {
    q: u64,
    k: u64,
    v: u64,
    tbh: u64,
    tbl: u64,
    aqk: u64,
    g: u64,
    h0: u64,
    pieces: u64,
    warm: u64,
    gate: u64,
    o: u64,
    ht: u64,
    qk_heads: i64,
    value_heads: i64,
    k_dim: i64,
    v_dim: i64,
    bt: i64,
    h0_dtype: i64,
    v_first: i64,
    npieces: i64,
    gate_mode: i64,
    scale: f64,
}
// SAFETY: as above.
unsafe impl DeviceRepr for GdnFusedArgs {}

/// Mirror of `WarmArgs` (delta_fwd.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct WarmArgs {
    pieces: u64,
    g: u64,
    beta: u64,
    k: u64,
    warm: u64,
    heads: i64,
    value_heads: i64,
    k_dim: i64,
    bt: i64,
    npieces: i64,
    wmax: i64,
    g_dtype: i64,
    beta_dtype: i64,
    l2norm: i64,
    log_eps: f64,
}
// SAFETY: as above.
unsafe impl DeviceRepr for WarmArgs {}

/// Mirror of `DecideArgs` (delta_fwd.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct DecideArgs {
    pieces: u64,
    warm: u64,
    gate: u64,
    value_heads: i64,
    bt: i64,
    npieces: i64,
    max_chain: i64,
}
// SAFETY: as above.
unsafe impl DeviceRepr for DecideArgs {}

/// The automatic split of `gdn_fwd`'s fused path (`conformance/spec/ops-delta-rule.md` §5.9–5.10):
/// when a call's (sequence, head, column block) CTAs leave multiprocessors idle, its long
/// sequences are cut into pieces at chunk boundaries, each piece (after the first) starting from a
/// zero state `w` chunks early, the least `w ≤ max_warmup_chunks` whose bound `Λ` (§5.10,
/// computed on the device from `g`, `β` and the key norms) is at most `ln 2^-30`. A piece with no
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

/// `ln 2^-30`: the truncation error the warm-ups allow, relative to the state's norm.
const LOG_EPS: f64 = -30.0 * std::f64::consts::LN_2;

/// Pieces per sequence: one each when `ctas_per_piece` CTAs per piece fill `sm_count`
/// multiprocessors with the sequences alone, else the spare pieces handed out in proportion to
/// the sequences' chunks, each piece at least `rule.min_piece_chunks` long.
pub fn split_pieces(
    seq_chunks: &[usize],
    ctas_per_piece: usize,
    sm_count: usize,
    rule: &SplitRule,
) -> Vec<usize> {
    let n = seq_chunks.len();
    let budget = sm_count / ctas_per_piece.max(1);
    let total: usize = seq_chunks.iter().sum();
    seq_chunks
        .iter()
        .map(|&c| {
            if budget <= n {
                return 1;
            }
            let want = 1 + (budget - n) * c / total.max(1);
            want.min(c / rule.min_piece_chunks.max(1)).max(1)
        })
        .collect()
}

/// Relative cost of one chunk step of the lean fused kernel by its column width (H100, K = 128,
/// S6 runs of NOTES.md: about 2.9, 3.4 and 4.6 µs per step for 16, 32 and 64 columns).
fn lean_step_cost(bv: usize) -> f64 {
    match bv {
        16 => 1.0,
        32 => 1.15,
        _ => 1.6,
    }
}

/// The estimated time (in 16-column steps) of the lean kernel at width `bv` over `per_seq`
/// pieces of the sequences' chunks: `lean_step_cost(bv) · max(longest piece, with one warm-up
/// chunk when split; all block-chunks / resident blocks)`.
fn lean_estimate(
    choice: FusedChoice,
    v: usize,
    seq_chunks: &[usize],
    per_seq: &[usize],
    hv: usize,
    sm_count: usize,
) -> f64 {
    let per_sm = (SMEM_PER_SM / choice.smem_bytes().max(1)).max(1);
    let (mut longest, mut work) = (0usize, 0usize);
    for (&c, &m) in seq_chunks.iter().zip(per_seq) {
        let warm = usize::from(m > 1);
        longest = longest.max(c.div_ceil(m.max(1)) + warm);
        work += c + (m - 1) * warm;
    }
    let spread = (work * hv * v.div_ceil(choice.bv)) as f64 / (sm_count.max(1) * per_sm) as f64;
    lean_step_cost(choice.bv) * (longest as f64).max(spread)
}

/// The split of the lean GDN path under `rule`: per allowed column width, the pieces of
/// [`split_pieces`] and their [`lean_estimate`]; the width with the least estimate (the serial
/// width on a tie) and its pieces per sequence. A wider width than `serial`'s runs fewer CTAs per
/// piece, so more pieces fill the GPU when the gates let them warm up.
pub fn split_choice(
    v: usize,
    seq_chunks: &[usize],
    hv: usize,
    sm_count: usize,
    serial: FusedChoice,
    rule: &SplitRule,
) -> (FusedChoice, Vec<usize>) {
    let pieces = |c: FusedChoice| {
        let per = split_pieces(seq_chunks, hv * v.div_ceil(c.bv), sm_count, rule);
        let est = lean_estimate(c, v, seq_chunks, &per, hv, sm_count);
        (c, per, est)
    };
    let forced = crate::knobs::fwd_bv().is_some();
    let mut best = pieces(serial);
    for bv in fused_widths(v).into_iter().filter(|_| !forced) {
        let cand = pieces(FusedChoice { bv, ..serial });
        if cand.2 < best.2 {
            best = cand;
        }
    }
    (best.0, best.1)
}

/// The pieces table of the fused GDN kernel (`[P, 5]`: first row, length, the sequence's first
/// and end rows, the sequence), `pieces[s]` even pieces of sequence `s` at chunk boundaries.
fn piece_table(geo: &Geometry, pieces: &[usize]) -> Vec<i64> {
    let mut rows = Vec::new();
    for (s, &m) in geo.seqs.iter().zip(pieces) {
        let c = s.num_chunks(geo.bt);
        let base = s.batch * geo.t;
        for j in 0..m {
            let (a, e) = (j * c / m, (j + 1) * c / m);
            let first = s.bos + a * geo.bt;
            let last = (s.bos + e * geo.bt).min(s.eos);
            rows.extend(
                [base + first, last - first, base + s.bos, base + s.eos, s.n].map(|x| x as i64),
            );
        }
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
                scale: p.scale.unwrap_or(1.0 / (k as f64).sqrt()),
            },
            Call::Gdn(p) => Prep {
                gate: GateInput::Decay,
                scalar_gate: true,
                l2norm: p.use_qk_l2norm_in_kernel,
                beta_mode: 0,
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
/// the intra stage's `w, u, kg, qg` (`delta_fused`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FusedChoice {
    pub kp: usize,
    pub bv: usize,
    pub lean: bool,
}

impl FusedChoice {
    /// Dynamic shared memory of `GdnFusedSmem<T, kp, bv>` / `FusedSmem<T, kp, bv>`
    /// (half-precision elements).
    fn smem_bytes(self) -> usize {
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
/// (as `kernel_choice` of fwd_h). `$ATTN_FWD_BV` overrides the width (a tuning knob).
pub fn fused_choice(
    k: usize,
    v: usize,
    seq_chunks: &[usize],
    hv: usize,
    sm_count: usize,
    lean: bool,
) -> FusedChoice {
    let kp = if k <= 64 { 64 } else { 128 };
    let allowed = fused_widths(v);
    let forced = crate::knobs::fwd_bv().filter(|bv| allowed.contains(bv));
    let bv = forced.unwrap_or_else(|| {
        cheapest_width(&allowed, seq_chunks, hv, sm_count, |bv| {
            (FusedChoice { kp, bv, lean }.smem_bytes(), v.div_ceil(bv))
        })
    });
    FusedChoice { kp, bv, lean }
}

/// The fused kernels' column widths for `V` columns (16 always; 32 and 64 when `V` needs more
/// than half of them).
fn fused_widths(v: usize) -> Vec<usize> {
    [64, 32, 16]
        .into_iter()
        .filter(|&bv| bv == 16 || bv / 2 < v)
        .collect()
}

/// Smem bytes of the output kernel (`OutSmem<Acc>`).
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
    /// The sequence table of the KDA fused kernel (`seq_table`), when that kernel runs.
    seqs: Option<DeviceTensor>,
    /// The lean GDN path's pieces.
    pieces: Option<Pieces>,
    split_rule: Option<SplitRule>,
    /// The staged path's `fwd_h` call (its plan is made on the workspace's tensors).
    cu_seqlens: Option<Vec<i64>>,
}

/// The lean GDN path's launches: the pieces of the (split) launch and, when the split runs at a
/// wider column block than the serial run, the serial launch it falls back to per (sequence,
/// value head) where the warm-ups do not shorten the chains (`gdn_split_decide`).
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
}

/// Intermediate tensors of a forward (allocated once per plan).
#[derive(Debug)]
pub struct DeltaFwdWorkspace {
    aqk: DeviceTensor,
    tiles: Tiles,
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
    qk: Option<(DeviceTensor, DeviceTensor)>,
    /// The split's warm-up chunks per (piece, value head) (`[P · HV]` i64).
    warm: Option<DeviceTensor>,
    /// With a wider split: its verdict per (sequence, value head) (`[N · HV]` i64, 1: split).
    gate: Option<DeviceTensor>,
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
    /// Staged only: `fwd_h`'s plan and outputs.
    staged: Option<(FwdHPlan, FwdHDeviceOutputs)>,
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
                let chunks: Vec<usize> = geo.seqs.iter().map(|s| s.num_chunks(geo.bt)).collect();
                let lean = matches!(call, Call::Gdn(_));
                Some(fused_choice(
                    geo.k,
                    geo.v,
                    &chunks,
                    geo.hv,
                    gpu.sm_count(),
                    lean,
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
        let split_rule = fused.filter(|f| f.lean).map(|_| SplitRule::default());
        let pieces = Self::pieces(gpu, &geo, fused, split_rule)?;
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
        })
    }

    /// The lean path's pieces under `rule` (one per sequence at the serial width without a
    /// rule), at the width [`split_choice`] picks.
    fn pieces(
        gpu: &Gpu,
        geo: &Geometry,
        fused: Option<FusedChoice>,
        rule: Option<SplitRule>,
    ) -> GpuResult<Option<Pieces>> {
        let Some(serial) = fused.filter(|f| f.lean) else {
            return Ok(None);
        };
        let chunks: Vec<usize> = geo.seqs.iter().map(|s| s.num_chunks(geo.bt)).collect();
        let table = |per_seq: &[usize]| {
            let mut rows = piece_table(geo, per_seq);
            let n = rows.len() / 5;
            if rows.is_empty() {
                rows.push(0);
            }
            Ok::<_, crate::error::GpuError>((DeviceTensor::from_slice(gpu, &rows)?, n))
        };
        let ones = vec![1; chunks.len()];
        let (choice, per_seq) = match rule {
            Some(r) => split_choice(geo.v, &chunks, geo.hv, gpu.sm_count(), serial, &r),
            None => (serial, ones.clone()),
        };
        let (tab, n) = table(&per_seq)?;
        let split = per_seq.iter().any(|&m| m > 1);
        let serial_run = if choice != serial {
            let est = lean_estimate(serial, geo.v, &chunks, &ones, geo.hv, gpu.sm_count());
            let max_chain = (est / lean_step_cost(choice.bv)).floor() as i64;
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
        }))
    }

    /// The plan with the fused GDN path's automatic split under `rule`, or without a split
    /// (`None`: one serial run per sequence); other paths are unchanged. A rule's
    /// `max_warmup_chunks` must be 1..=64 and `min_piece_chunks` at least 1.
    pub fn with_split(mut self, gpu: &Gpu, rule: Option<SplitRule>) -> GpuResult<DeltaFwdPlan> {
        if let Some(r) = rule {
            if !(1..=64).contains(&r.max_warmup_chunks) || r.min_piece_chunks == 0 {
                return Err(Error::param(
                    "rule",
                    "max_warmup_chunks in 1..=64 and min_piece_chunks >= 1",
                    format!("{r:?}"),
                )
                .into());
            }
        }
        if self.fused.is_some_and(|f| f.lean) {
            self.split_rule = rule;
            self.pieces = Self::pieces(gpu, &self.geo, self.fused, rule)?;
        }
        Ok(self)
    }

    /// Whether the plan splits a sequence into pieces (the fused GDN path's automatic split).
    pub fn splits(&self) -> bool {
        self.pieces.as_ref().is_some_and(|p| p.split)
    }

    /// The warm-up chunks the last run chose per (piece, value head), `[P · HV]` (§5.10: `0` for
    /// a sequence's first piece, `-1` for a piece run through by the one before it), when the
    /// plan splits; the debug query of the automatic split.
    pub fn chosen_warmups(&self, gpu: &Gpu, ws: &DeltaFwdWorkspace) -> GpuResult<Option<Vec<i64>>> {
        match &ws.tiles {
            Tiles::Lean(l) => l
                .warm
                .as_ref()
                .map(|w| Ok(w.to_array::<i64>(gpu)?.iter().copied().collect()))
                .transpose(),
            _ => Ok(None),
        }
    }

    /// Where the split runs at a wider column block than the serial run: the verdict of the
    /// last run per (sequence, value head), `[N · HV]` (`true`: the split ran it, `false`: the
    /// serial kernel did, its pieces' warm-ups not shortening the chain); else `None`.
    pub fn chosen_split(&self, gpu: &Gpu, ws: &DeltaFwdWorkspace) -> GpuResult<Option<Vec<bool>>> {
        match &ws.tiles {
            Tiles::Lean(l) => l
                .gate
                .as_ref()
                .map(|w| Ok(w.to_array::<i64>(gpu)?.iter().map(|&x| x != 0).collect()))
                .transpose(),
            _ => Ok(None),
        }
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
        if self.fused.is_some_and(|f| f.lean) {
            return Ok(DeltaFwdWorkspace {
                aqk: tok(g.bt)?,
                tiles: Tiles::Lean(Box::new(LeanTiles {
                    tbh: tok(g.bt)?,
                    tbl: tok(g.bt)?,
                    g: DeviceTensor::alloc(gpu, &[g.b, g.t, g.hv], Dtype::F32)?,
                    qk: self
                        .prep
                        .l2norm
                        .then(|| Ok::<_, crate::error::GpuError>((tok(g.k)?, tok(g.k)?)))
                        .transpose()?,
                    warm: match &self.pieces {
                        Some(p) if p.split => {
                            Some(DeviceTensor::alloc(gpu, &[p.n * g.hv], Dtype::I64)?)
                        }
                        _ => None,
                    },
                    gate: match &self.pieces {
                        Some(p) if p.serial.is_some() => {
                            Some(DeviceTensor::alloc(gpu, &[g.n() * g.hv], Dtype::I64)?)
                        }
                        _ => None,
                    },
                })),
            });
        }
        let gate = if self.fused.is_some() {
            DeviceTensor::alloc(gpu, &[g.nt(self.varlen) * g.b, g.hv, g.k], Dtype::F32)?
        } else if self.prep.scalar_gate {
            DeviceTensor::alloc(gpu, &[g.b, g.t, g.hv], acc_dtype(d))?
        } else {
            DeviceTensor::alloc(gpu, &[g.b, g.t, g.hv, g.k], acc_dtype(d))?
        };
        let mut ws = FullTiles {
            w: tok(g.k)?,
            u: tok(g.v)?,
            kg: tok(g.k)?,
            qg: tok(g.k)?,
            qf: DeviceTensor::alloc(gpu, &[g.b, g.t, g.hv], Dtype::F32)?,
            gate,
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
            let plan = FwdHPlan::new(gpu, &fwd, self.cu_seqlens.as_deref(), &params)?;
            let out = plan.alloc_outputs(gpu)?;
            ws.staged = Some((plan, out));
        }
        Ok(DeltaFwdWorkspace {
            aqk: tok(g.bt)?,
            tiles: Tiles::Full(Box::new(ws)),
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
        let geo = self.call.validate(t, self.cu_seqlens.as_deref())?;
        if geo != self.geo || t.q.dtype() != self.dtype {
            return Err(Error::shape(
                "q",
                "the shapes and dtype the plan was made for",
                t.q.shape(),
            )
            .into());
        }
        self.intra(gpu, t, ws)
    }

    fn intra(
        &self,
        gpu: &Gpu,
        t: &ForwardTensors<'_>,
        ws: &mut DeltaFwdWorkspace,
    ) -> GpuResult<()> {
        let mut args = self.intra_args(gpu, t)?;
        args.aqk = ws.aqk.ptr_mut(gpu);
        match &mut ws.tiles {
            Tiles::Lean(l) => {
                args.tbh = l.tbh.ptr_mut(gpu);
                args.tbl = l.tbl.ptr_mut(gpu);
                args.gout = l.g.ptr_mut(gpu);
                if let Some((qn, kn)) = l.qk.as_mut() {
                    args.qg = qn.ptr_mut(gpu);
                    args.kg = kn.ptr_mut(gpu);
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
                } else {
                    args.gout = f.gate.ptr_mut(gpu);
                }
            }
        }
        launch_intra(gpu, self.dtype, self.nchunks, self.geo.hv, &args)
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
        self.intra(gpu, t, ws)?;
        let DeltaFwdWorkspace { aqk, tiles } = ws;
        let full = match (self.fused, tiles) {
            (Some(choice), Tiles::Lean(l)) if choice.lean => {
                if self.splits() != l.warm.is_some() {
                    return Err(Error::missing(
                        "ws",
                        "a workspace of this plan (allocated after with_split)",
                        "one of another split",
                    )
                    .into());
                }
                return self.run_lean(gpu, t, choice, l, aqk, out);
            }
            (_, Tiles::Full(f)) => f,
            (_, Tiles::Lean(_)) => {
                return Err(Error::missing("ws", "a workspace of this plan", "a lean one").into())
            }
        };
        match (self.fused, full.staged.as_mut()) {
            (Some(choice), _) => self.run_fused(gpu, t, choice, full, aqk, out),
            (None, Some((plan, fo))) => {
                let mut fwd = FwdHTensors::new(&full.kg, &full.w, &full.u);
                if self.prep.scalar_gate {
                    fwd.g = Some(&full.gate);
                } else {
                    fwd.gk = Some(&full.gate);
                }
                fwd.initial_state = t.initial_state;
                // fwd_h writes the final state straight into the caller's tensor (same shape
                // and dtype: checked above)
                std::mem::swap(&mut fo.final_state, &mut out.final_state);
                let ran = plan.run(gpu, &fwd, fo);
                std::mem::swap(&mut fo.final_state, &mut out.final_state);
                ran?;
                let v_new = fo
                    .v_new
                    .as_ref()
                    .ok_or_else(|| Error::missing("v_new", "the staged plan's v_new", "none"))?;
                self.run_output(gpu, [&full.qg, &full.qf, aqk], &fo.h, v_new, &mut out.o)
            }
            (None, None) => {
                Err(Error::missing("ws", "a workspace of this plan", "a fused one").into())
            }
        }
    }

    /// The intra kernel's arguments for `t` (outputs left 0).
    fn intra_args(&self, gpu: &Gpu, t: &ForwardTensors<'_>) -> GpuResult<IntraArgs> {
        let g = &self.geo;
        let gate = match self.prep.gate {
            GateInput::InKernel(lb) => GateArgs {
                a_log: t.a_log.map_or(0, |x| x.ptr(gpu)),
                dt_bias: t.dt_bias.map_or(0, |x| x.ptr(gpu)),
                a_log_dtype: t.a_log.map_or(-1, |x| dtype_code(x.dtype())),
                dt_bias_dtype: t.dt_bias.map_or(-1, |x| dtype_code(x.dtype())),
                has_lower_bound: lb.is_some() as i64,
                lower_bound: lb.unwrap_or(0.0),
                head_dim: g.k as i64,
            },
            _ => GateArgs::none(),
        };
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
            gate_mode: match self.prep.gate {
                GateInput::Decay => 1,
                GateInput::InKernel(_) => 2,
            },
            scalar_gate: self.prep.scalar_gate as i64,
            l2norm: self.prep.l2norm as i64,
            beta_mode: self.prep.beta_mode,
            scale: self.prep.scale,
            ..IntraArgs::default()
        })
    }

    fn run_fused(
        &self,
        gpu: &Gpu,
        t: &ForwardTensors<'_>,
        choice: FusedChoice,
        ws: &FullTiles,
        aqk: &DeviceTensor,
        out: &mut DeltaFwdDeviceOutputs,
    ) -> GpuResult<()> {
        let g = &self.geo;
        let tasks = g.n() * g.hv;
        let blocks = g.v.div_ceil(choice.bv);
        if tasks == 0 || blocks == 0 {
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
            o: out.o.ptr_mut(gpu),
            ht: out.final_state.as_mut().map_or(0, |x| x.ptr_mut(gpu)),
            value_heads: g.hv as i64,
            k_dim: g.k as i64,
            v_dim: g.v as i64,
            bt: g.bt as i64,
            h0_dtype: t.initial_state.map_or(-1, |x| dtype_code(x.dtype())),
            v_first: self.state_v_first as i64,
        };
        self.launch_fused(gpu, "mma", choice, tasks, &args)?;
        gpu.wait_if_checked("delta_fwd_mma")
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

    /// The lean fused GDN path after the intra stage: the split's warm-up policy, its verdict
    /// where the split is wider than the serial run, then the kernel (`delta_fused_gdn`) on
    /// `t`'s `q, k` (or the normalised ones), `v`, the intra stage's `Tb` hi + lo, `G` and `Aqk`:
    /// the split launch, and the serial launch for the (sequence, head) pairs the verdict leaves
    /// to it.
    fn run_lean(
        &self,
        gpu: &Gpu,
        t: &ForwardTensors<'_>,
        serial: FusedChoice,
        l: &mut LeanTiles,
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
        if let Some(w) = l.warm.as_mut() {
            self.run_warm_policy(gpu, t, &pc.table, pc.n, w)?;
        }
        let (q, k, qk_heads) = match &l.qk {
            Some((qn, kn)) => (qn.ptr(gpu), kn.ptr(gpu), g.hv),
            None => (t.q.ptr(gpu), t.k.ptr(gpu), g.h),
        };
        let mut args = GdnFusedArgs {
            q,
            k,
            v: t.v.ptr(gpu),
            tbh: l.tbh.ptr(gpu),
            tbl: l.tbl.ptr(gpu),
            aqk: aqk.ptr(gpu),
            g: l.g.ptr(gpu),
            h0: t.initial_state.map_or(0, |x| x.ptr(gpu)),
            pieces: pc.table.ptr(gpu),
            warm: l.warm.as_ref().map_or(0, |w| w.ptr(gpu)),
            gate: 0,
            o: out.o.ptr_mut(gpu),
            ht: out.final_state.as_mut().map_or(0, |x| x.ptr_mut(gpu)),
            qk_heads: qk_heads as i64,
            value_heads: g.hv as i64,
            k_dim: g.k as i64,
            v_dim: g.v as i64,
            bt: g.bt as i64,
            h0_dtype: t.initial_state.map_or(-1, |x| dtype_code(x.dtype())),
            v_first: self.state_v_first as i64,
            npieces: pc.n as i64,
            gate_mode: 0,
            scale: self.prep.scale,
        };
        let Some((serial_table, max_chain)) = &pc.serial else {
            self.launch_fused(gpu, "gdn", pc.choice, pc.n * g.hv, &args)?;
            return gpu.wait_if_checked("delta_fwd_gdn");
        };
        let (Some(warm), Some(gate)) = (l.warm.as_ref(), l.gate.as_mut()) else {
            return Err(
                Error::missing("ws", "the split's warm-up and verdict tensors", "none").into(),
            );
        };
        let decide = DecideArgs {
            pieces: pc.table.ptr(gpu),
            warm: warm.ptr(gpu),
            gate: gate.ptr_mut(gpu),
            value_heads: g.hv as i64,
            bt: g.bt as i64,
            npieces: pc.n as i64,
            max_chain: *max_chain,
        };
        let threads = pc.n * g.hv;
        let grid = grid_x(
            threads.div_ceil(128),
            "v",
            "fewer than 2^38 (piece, head) pairs",
        )?;
        gpu.launch_3d(
            Module::DeltaFwd,
            "gdn_split_decide",
            (grid, 1, 1),
            128,
            0,
            &decide,
        )?;
        args.gate = gate.ptr(gpu);
        let split = GdnFusedArgs {
            gate_mode: 1,
            ..args
        };
        let seqs = g.seqs.len();
        let rest = GdnFusedArgs {
            pieces: serial_table.ptr(gpu),
            npieces: seqs as i64,
            warm: 0,
            gate_mode: 2,
            ..args
        };
        // the serial CTAs (long chains) on a second stream, beside the split's
        gpu.beside(
            |side| self.launch_fused(side, "gdn", serial, seqs * g.hv, &rest),
            |main| self.launch_fused(main, "gdn", pc.choice, pc.n * g.hv, &split),
        )?;
        gpu.wait_if_checked("delta_fwd_gdn")
    }

    /// The split's warm-up chunks per (piece, value head) of `pieces` (`npieces` rows) into
    /// `warm` (`gdn_warm_policy`).
    fn run_warm_policy(
        &self,
        gpu: &Gpu,
        t: &ForwardTensors<'_>,
        pieces: &DeviceTensor,
        npieces: usize,
        warm: &mut DeviceTensor,
    ) -> GpuResult<()> {
        let Some(rule) = self.split_rule else {
            return Err(Error::missing("plan", "a split rule", "none").into());
        };
        let g = &self.geo;
        let args = WarmArgs {
            pieces: pieces.ptr(gpu),
            g: t.g.ptr(gpu),
            beta: t.beta.ptr(gpu),
            k: t.k.ptr(gpu),
            warm: warm.ptr_mut(gpu),
            heads: g.h as i64,
            value_heads: g.hv as i64,
            k_dim: g.k as i64,
            bt: g.bt as i64,
            npieces: npieces as i64,
            wmax: rule.max_warmup_chunks as i64,
            g_dtype: dtype_code(t.g.dtype()),
            beta_dtype: dtype_code(t.beta.dtype()),
            l2norm: self.prep.l2norm as i64,
            log_eps: LOG_EPS,
        };
        let grid = grid_x(npieces, "v", "fewer than 2^31 pieces")?;
        gpu.launch_3d(
            Module::DeltaFwd,
            &format!("gdn_warm_policy_{}", tag(self.dtype)),
            (grid, g.hv as u32, 1),
            64,
            0,
            &args,
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
        gpu.launch_3d(
            Module::KdaIntra,
            &format!("delta_output_fma_{}", tag(self.dtype)),
            (grid_x, g.hv as u32, g.v.div_ceil(KT) as u32),
            THREADS,
            out_smem(self.dtype),
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

    /// The pieces of any layout cover each sequence once, in order, at chunk boundaries, each
    /// at least `min_piece_chunks` long when a sequence is split, and split only with spare CTAs.
    #[test]
    fn pieces_cover_every_sequence_at_chunk_boundaries() {
        let rule = SplitRule {
            min_piece_chunks: 3,
            max_warmup_chunks: 8,
        };
        let mut seed = 0x9e37_79b9_u64;
        let mut next = |m: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % m as u64) as usize
        };
        for _ in 0..300 {
            let bt = [16, 32, 64][next(3)];
            let lens: Vec<usize> = (0..1 + next(5)).map(|_| next(40 * bt)).collect();
            let g = geo(&lens, bt);
            let chunks: Vec<usize> = g.seqs.iter().map(|s| s.num_chunks(bt)).collect();
            let ctas = 1 + next(40);
            let sms = 1 + next(200);
            let per = split_pieces(&chunks, ctas, sms, &rule);
            if sms / ctas <= lens.len() {
                assert!(per.iter().all(|&m| m == 1), "no spare CTAs, no split");
            }
            let rows = piece_table(&g, &per);
            assert_eq!(rows.len() / 5, per.iter().sum::<usize>());
            let mut i = 0;
            for (s, &m) in g.seqs.iter().zip(&per) {
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
        }
    }

    /// The split's width on an H100 (132 SMs), K = V = 128: few long sequences split at the
    /// widest block into many pieces (H4 × 131072: 16 pieces of 128 chunks at 64 columns, the
    /// serial run at 16; H32 × 32768: 2 pieces at 64 columns, serial at 32), a grid the serial
    /// run already fills (HV 64) does not split.
    #[test]
    fn split_choice_widens_few_long_sequences() {
        let rule = SplitRule::default();
        let serial = |chunks: &[usize], hv| fused_choice(128, 128, chunks, hv, 132, true);
        let c4 = [2048];
        let s4 = serial(&c4, 4);
        assert_eq!(s4.bv, 16);
        let (wide, per) = split_choice(128, &c4, 4, 132, s4, &rule);
        assert_eq!((wide.bv, per.as_slice()), (64, &[16][..]));
        assert!(
            lean_estimate(wide, 128, &c4, &per, 4, 132)
                < lean_estimate(s4, 128, &c4, &[1], 4, 132) / 3.0
        );
        let c32 = [512];
        let (w32, per) = split_choice(128, &c32, 32, 132, serial(&c32, 32), &rule);
        assert_eq!((w32.bv, per.as_slice()), (64, &[2][..]));
        let c4x4 = [128; 4];
        let (w4x4, per) = split_choice(128, &c4x4, 4, 132, serial(&c4x4, 4), &rule);
        assert_eq!((w4x4.bv, per.as_slice()), (64, &[4, 4, 4, 4][..]));
        let c64 = [1024];
        let s64 = serial(&c64, 64);
        let (same, per) = split_choice(128, &c64, 64, 132, s64, &rule);
        assert_eq!((same, per.as_slice()), (s64, &[1][..]));
        let hv8 = [1024];
        let (w8, per) = split_choice(128, &hv8, 8, 132, serial(&hv8, 8), &rule);
        assert_eq!((w8.bv, per.as_slice()), (64, &[8][..]));
    }
}
