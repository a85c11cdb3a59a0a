//! The context-parallel ops: `chunk_gated_delta_rule_fwd_h`, `kda_fwd` and `gdn_fwd` over the
//! ranks of a [`CpGroup`], exact (`conformance/spec/ops-delta-rule.md` §3-§5, §6, §8).
//!
//! For one (sequence, value head) the state map of a token range is affine,
//! `S_out = M S_in + b` (§3.1). Rank `r` holds its shard's pieces ([`Partition`]); only its last
//! piece can continue on a later rank, only its first can continue from an earlier one. Then:
//!
//! 1. **summaries**: each rank whose last piece continues computes that piece's `[b | M]`
//!    (`[HV, K, V + K]`, fp32; fp64 for fp64 data): `fwd_h` by `fwd_h_pre_scan`; the forwards by
//!    running the rank's own forward on the piece with values `[v | 0]` from the state `[0 | I]`
//!    (the recurrence is linear in `(S, v)`, so the first `V` state columns end at `b` and the
//!    last `K` at `M`), over the piece's sub-pieces side by side and their summaries merged
//!    (`whole`), or over a tail (below). Where the rank's local forward takes its exact fallback
//!    (long memory at a long shard), the whole piece's summary comes from that staged path
//!    instead: its split `fwd_h`'s own pre-scan, which then also summarises the piece's last
//!    piece, chained (`whole::SplitRows`); or, where that `fwd_h` leaves the piece whole,
//!    `fwd_h_pre_scan` over its tiles (`kg, w, u`, the gate: `whole::PreScanned`). Where the
//!    local forward is fused with full tiles (KDA), its intra stage then also writes the gate
//!    per token, and the same pre-scan runs over the fused path's own tiles. No intra stage of
//!    its own, and no pre-scan twice. To that end every rank queues its
//!    local forward's first half (the warm-up choice, the intra stage of the chosen path, none
//!    of which reads the entering state: `DeltaFwdPlan::run_head`) here, before the
//!    all-gather, where it overlaps the other ranks' summaries;
//! 2. **one all-gather** of the `R` summary slots (NCCL);
//! 3. **merge**: a rank whose first piece continues sequence `n` chains the summaries of the
//!    earlier ranks holding `n` from `initial_state[n]`, `X ← M_q X + b_q` (`fwd_h_merge`), which
//!    also widens the other pieces' initial states; that is the exact state entering the piece;
//! 4. **the local op** on the shard (local `cu_seqlens`, one sequence per piece) from those
//!    states, on the single-GPU path (fused or staged, free to split further on its card).
//!
//! Outputs stay sharded: per rank, `o` (`v_new`, `h`) of its tokens (chunks) and the exit state
//! of each of its pieces (`final_state`, `[P_r, …]`); a piece ending its sequence holds that
//! sequence's final state ([`super::gather_final_states`], [`super::gather_tokens`]).
//!
//! **Tail summaries** (the forwards, bf16 and f16): where the gates forget, a summary need not
//! cover the whole continuing piece. Over its last `c` chunks ([`TAIL_CHUNKS`] by default,
//! [`CpFwdPlan::with_tail_chunks`]) the transition maps' product `M_t` has `‖M_t‖ ≤ exp Λ` with
//! §5.10's bound `Λ`; when `Λ ≤ ln 2^-30` for every value head (the split's warm-up policy, run
//! on the piece's end), the rank sends the tail's `[b_t | M_t]`, and the merge's
//! `M_t X + b_t` differs from the exact `M_t S + b_t` (S: the state entering the tail) by at
//! most `2^-30 (‖X‖ + ‖S‖)`: the split's own truncation. Under strong decay the summary then
//! costs `c` chunks, not the shard, and leaves the critical path; a rank holds runs over the
//! last [`tail_levels`] chunks (4, 16, 32, `c`) and sends the shortest one its bound allows (the
//! summary is a serial chain of its chunks). Otherwise (long memory, a slow head, fp32 / fp64)
//! the whole piece's summary is sent. The check is one host read of the tail's `c · HV` bounds
//! per rank per run.
//!
//! A [`CpFwdPlan`] / [`CpFwdHPlan`] is made once per call shape (group, partition, shards'
//! shapes and dtypes, parameters): it validates everything (ranks against the group, each
//! shard's token count against the partition, shapes and dtypes by the single-GPU validation of
//! every rank's local call) and builds per local rank the local op's plan and workspace, the
//! summary run's plan, workspace and input buffers (`[v | 0]`, `[0 | I]`, the piece's rows),
//! the all-gather buffers and the merge's plan. Its `run` checks the call against the plan
//! (every rank, before any launch), checks the tails' bounds, copies the continuing pieces'
//! rows into the summary buffers (device-to-device), queues the local heads and the summaries,
//! all-gathers, merges and queues the local finishes: no allocation and no plan, but what the
//! first run to need it makes (a rank's whole-piece summary, where a tail bound fails; a local
//! forward's exact fallback, its workspace and split `fwd_h` plan, where the warm-up choice
//! takes it, and the summary from it), and no host synchronisation but the tails' verdicts and
//! the local forwards' fallback choices (per rank, both before its launches): the all-gather is
//! queued on each rank's stream behind its head and summary and ahead of its merge and local
//! finish, so the GPUs run the phases back to back. The caller waits with
//! [`CpGroup::synchronize`] (timed: a failed or hung rank aborts the group, no rank waits
//! forever). [`cp_kda_fwd`], [`cp_gdn_fwd`] and [`cp_chunk_gated_delta_rule_fwd_h`] are a plan,
//! new outputs, one run and that wait.
//!
//! Not yet done: a rank's summary beside its local forward's second half (on a second stream).
//! Only a rank whose first piece starts its sequence (no merge) could start that half before
//! the all-gather; queued ahead of the collective on its stream it would hold the collective
//! every rank waits for, and on a second stream it would share the GPU with the summary the
//! later ranks wait for, lengthening the critical path (summary, all-gather, local forward of a
//! rank with a merge) rather than shortening it.

use super::comm::CpGroup;
use super::partition::{Partition, Piece};
use super::shard::{
    copy_columns, copy_padded_rows, copy_rows, copy_token_rows, zero, zero_identity,
};
use crate::delta::forward::{
    DeltaFwdDeviceOutputs, DeltaFwdPlan, DeltaFwdWorkspace, ForwardPath, ForwardTensors,
    PolicyTensors, LOG_EPS,
};
use crate::delta::fwd_h::{FwdHDeviceOutputs, FwdHPlan, FwdHTensors};
use crate::delta::merge::{FwdHMergeDeviceOutputs, FwdHMergePlan};
use crate::delta::prescan::FwdHPreScanPlan;
use crate::device::Gpu;
use crate::error::GpuResult;
use crate::tensor::DeviceTensor;
use attn_reference::delta::{
    FwdHMergeParams, FwdHParams, FwdHPreScanParams, GdnFwdParams, KdaFwdParams,
};
use attn_reference::{Dtype, Error};
use whole::{PreScanned, SplitRows, WholeSummary};

mod whole;

/// The state and summary layout of a call: heads, key and value widths, the dtype of states.
#[derive(Debug, Clone, Copy)]
struct Dims {
    hv: usize,
    k: usize,
    v: usize,
    state: Dtype,
}

impl Dims {
    fn of(k: &DeviceTensor, values: &DeviceTensor) -> Dims {
        let at = |t: &DeviceTensor, i: usize| t.shape().get(i).copied().unwrap_or(0);
        Dims {
            hv: at(values, 2),
            k: at(k, 3),
            v: at(values, 3),
            state: if k.dtype() == Dtype::F64 {
                Dtype::F64
            } else {
                Dtype::F32
            },
        }
    }

    fn state_shape(&self, rows: usize, v_first: bool) -> [usize; 4] {
        if v_first {
            [rows, self.hv, self.v, self.k]
        } else {
            [rows, self.hv, self.k, self.v]
        }
    }

    /// A rank without pieces: its zero-row final states (`[0, …]` in the state layout) when
    /// `wanted`.
    fn no_states(&self, gpu: &Gpu, wanted: bool, v_first: bool) -> GpuResult<Option<DeviceTensor>> {
        wanted
            .then(|| DeviceTensor::alloc(gpu, &self.state_shape(0, v_first), self.state))
            .transpose()
    }

    /// One summary slot `[1, HV, K, V + K]`.
    fn slot(&self) -> [usize; 4] {
        [1, self.hv, self.k, self.v + self.k]
    }
}

/// One argument of a rank's call: its name, the tensor (`None`: an optional one absent) and
/// whether it holds the shard's token rows (`[1, T_r, ...]`).
#[derive(Debug, Clone, Copy)]
struct Arg<'a> {
    name: &'static str,
    t: Option<&'a DeviceTensor>,
    tokens: bool,
}

/// The arguments of a forward's shard.
fn forward_args<'a>(t: &ForwardTensors<'a>) -> Vec<Arg<'a>> {
    let tok = |name, t| Arg {
        name,
        t: Some(t),
        tokens: true,
    };
    let opt = |name, t| Arg {
        name,
        t,
        tokens: false,
    };
    vec![
        tok("q", t.q),
        tok("k", t.k),
        tok("v", t.v),
        tok("g", t.g),
        tok("beta", t.beta),
        opt("initial_state", t.initial_state),
        opt("A_log", t.a_log),
        opt("dt_bias", t.dt_bias),
    ]
}

/// The arguments of a `fwd_h` shard.
fn fwd_h_args<'a>(t: &FwdHTensors<'a>) -> Vec<Arg<'a>> {
    let tok = |name, t| Arg {
        name,
        t,
        tokens: true,
    };
    vec![
        tok("k", Some(t.k)),
        tok("w", Some(t.w)),
        tok("u", Some(t.u)),
        tok("g", t.g),
        tok("gk", t.gk),
        Arg {
            name: "initial_state",
            t: t.initial_state,
            tokens: false,
        },
    ]
}

/// Host checks of a call: the partition's ranks against the group, one input per local rank,
/// the chunk size, and every token argument of every rank against its shard.
fn check_call(
    group: &CpGroup,
    part: &Partition,
    chunk_size: i64,
    args: &[Vec<Arg<'_>>],
) -> GpuResult<()> {
    if part.ranks() != group.world() {
        return Err(Error::param(
            "partition",
            format!("{} ranks (the group's)", group.world()),
            part.ranks(),
        )
        .into());
    }
    let local = group.local_ranks();
    if args.len() != local.len() {
        return Err(Error::shape(
            "shards",
            format!("one input per local rank ({})", local.len()),
            [args.len()],
        )
        .into());
    }
    if chunk_size != part.chunk_size() as i64 {
        return Err(Error::param(
            "chunk_size",
            format!("the partition's chunk size {}", part.chunk_size()),
            chunk_size,
        )
        .into());
    }
    for (&r, named) in local.iter().zip(args) {
        let want = part.shard(r).tokens();
        for a in named.iter().filter(|a| a.tokens) {
            let Some(t) = a.t else { continue };
            if t.shape().len() < 3 || t.shape()[0] != 1 || t.shape()[1] != want {
                return Err(Error::shape(
                    format!("{} (rank {r})", a.name),
                    format!("[1, {want}, ...]: the tokens of the rank's shard"),
                    t.shape(),
                )
                .into());
            }
        }
    }
    Ok(())
}

/// The shape and dtype of a present argument.
type Kind = (Vec<usize>, Dtype);

/// The shapes and dtypes of one rank's arguments that a plan was made for (`None`: absent).
#[derive(Debug)]
struct Signature(Vec<(&'static str, Option<Kind>)>);

impl Signature {
    fn of(args: &[Arg<'_>]) -> Signature {
        Signature(
            args.iter()
                .map(|a| (a.name, a.t.map(|t| (t.shape().to_vec(), t.dtype()))))
                .collect(),
        )
    }

    /// Checks `args` (the same arguments, in the same order) of global rank `rank`: each present
    /// exactly where it was, with the same shape and dtype; errors name the argument and rank.
    fn check(&self, rank: usize, args: &[Arg<'_>]) -> attn_reference::Result<()> {
        for ((name, want), a) in self.0.iter().zip(args) {
            let arg = || format!("{name} (rank {rank})");
            match (want, a.t) {
                (None, None) => {}
                (Some(_), None) => {
                    return Err(Error::missing(
                        arg(),
                        "a tensor (the plan was made with one)",
                        "none",
                    ))
                }
                (None, Some(t)) => {
                    return Err(Error::missing(
                        arg(),
                        "no tensor (the plan was made without one)",
                        format!("a tensor of shape {:?}", t.shape()),
                    ))
                }
                (Some((shape, dtype)), Some(t)) => {
                    if t.shape() != shape.as_slice() {
                        return Err(Error::shape(
                            arg(),
                            format!("{shape:?}: the shape the plan was made for"),
                            t.shape(),
                        ));
                    }
                    if t.dtype() != *dtype {
                        return Err(Error::dtype(arg(), dtype.name(), t.dtype().name()));
                    }
                }
            }
        }
        Ok(())
    }
}

/// Buffers for the token rows of a rank's continuing piece of some of its arguments: none where
/// the piece is the whole shard (the summary then reads the shard's tensors in place).
#[derive(Debug)]
struct PieceRows {
    start: usize,
    copies: Vec<Option<DeviceTensor>>,
}

impl PieceRows {
    /// Buffers `[1, piece.len, ...]` for the present tensors of `ts` (the shard's, of
    /// `shard_tokens` rows).
    fn new(
        gpu: &Gpu,
        piece: &Piece,
        shard_tokens: usize,
        ts: &[Option<&DeviceTensor>],
    ) -> GpuResult<PieceRows> {
        let whole = piece.start == 0 && piece.len == shard_tokens;
        let copies = ts
            .iter()
            .map(|t| match t {
                Some(t) if !whole => {
                    let mut shape = t.shape().to_vec();
                    shape[1] = piece.len;
                    DeviceTensor::alloc(gpu, &shape, t.dtype()).map(Some)
                }
                _ => Ok(None),
            })
            .collect::<GpuResult<_>>()?;
        Ok(PieceRows {
            start: piece.start,
            copies,
        })
    }

    /// Copies the piece's rows of `ts` (the tensors [`PieceRows::new`] was given, or others of
    /// their shapes) into the buffers.
    fn fill(&mut self, gpu: &Gpu, ts: &[Option<&DeviceTensor>]) -> GpuResult<()> {
        for (c, t) in self.copies.iter_mut().zip(ts) {
            if let (Some(c), Some(t)) = (c, t) {
                copy_token_rows(gpu, t, self.start, c)?;
            }
        }
        Ok(())
    }

    /// The piece's rows of `ts`: the buffers, or `ts` themselves for the whole shard.
    fn rows<'a, const N: usize>(
        &'a self,
        ts: [Option<&'a DeviceTensor>; N],
    ) -> [Option<&'a DeviceTensor>; N] {
        std::array::from_fn(|i| self.copies.get(i).and_then(Option::as_ref).or(ts[i]))
    }
}

/// One rank's merge (step 3): the earlier ranks' summaries it chains, their copy out of the
/// gathered slots, and the merge's plan and outputs.
#[derive(Debug)]
struct Merge {
    chain: Vec<usize>,
    /// The summaries of `chain`, in order (`[chain.len(), HV, K, V + K]`).
    summaries: DeviceTensor,
    plan: FwdHMergePlan,
    /// `final_state`: the states entering the rank's pieces, `[P_r, ...]`.
    out: FwdHMergeDeviceOutputs,
}

/// The boundary stage's buffers (steps 2-3): the zero slots of the ranks that summarise
/// nothing, every local rank's gathered slots and the merges of the ranks whose first piece
/// continues.
#[derive(Debug)]
struct Boundary {
    /// Per local rank without a continuing piece: the zeros it sends (`[1, HV, K, V + K]`).
    zeros: Vec<Option<DeviceTensor>>,
    /// Per local rank: the `R` gathered slots `[R, HV, K, V + K]`.
    recv: Vec<DeviceTensor>,
    merges: Vec<Option<Merge>>,
}

impl Boundary {
    /// The stage of a call whose local rank `i` sends a summary where `summarises[i]` and
    /// starts from `initial[i]`; `None` when no rank's last piece continues (nothing to
    /// exchange).
    fn new(
        group: &CpGroup,
        part: &Partition,
        dims: Dims,
        summarises: &[bool],
        initial: &[Option<&DeviceTensor>],
        state_v_first: bool,
    ) -> GpuResult<Option<Boundary>> {
        if !part.shards().iter().any(|s| s.continuing().is_some()) {
            return Ok(None);
        }
        let slot = dims.slot();
        let params = FwdHMergeParams {
            state_v_first,
            output_final_state: true,
        };
        let mut b = Boundary {
            zeros: Vec::new(),
            recv: Vec::new(),
            merges: Vec::new(),
        };
        for (i, (r, gpu)) in group.ranks().enumerate() {
            b.zeros.push(if summarises[i] {
                None
            } else {
                let mut t = DeviceTensor::alloc(gpu, &slot, dims.state)?;
                zero(gpu, &mut t)?;
                Some(t)
            });
            let mut all = slot;
            all[0] = part.ranks();
            b.recv.push(DeviceTensor::alloc(gpu, &all, dims.state)?);
            let chain = part.chain(r);
            if chain.is_empty() {
                b.merges.push(None);
                continue;
            }
            let mut rows = slot;
            rows[0] = chain.len();
            let summaries = DeviceTensor::alloc(gpu, &rows, dims.state)?;
            // sequence 0 of the merge is the continued first piece, chaining every summary;
            // the rank's other pieces take their initial states unchanged
            let pieces = part.shard(r).pieces.len();
            let mut offsets = vec![0, chain.len() as i64];
            offsets.extend(std::iter::repeat_n(chain.len() as i64, pieces - 1));
            let plan = FwdHMergePlan::new(gpu, &summaries, initial[i], &offsets, &params)?;
            let out = plan.alloc_outputs(gpu)?;
            b.merges.push(Some(Merge {
                chain,
                summaries,
                plan,
                out,
            }));
        }
        Ok(Some(b))
    }

    /// All-gathers the local ranks' summaries (`sent[i]`; the zero slot where rank `i` sends
    /// none) and merges, for every rank whose first piece continues, the states entering its
    /// pieces from `initial[i]`.
    fn run(
        &mut self,
        group: &CpGroup,
        sent: &[Option<&DeviceTensor>],
        initial: &[Option<&DeviceTensor>],
    ) -> GpuResult<()> {
        let send = sent
            .iter()
            .zip(&self.zeros)
            .map(|(s, z)| {
                s.or(z.as_ref())
                    .ok_or_else(|| Error::missing("summary", "a summary or a zero slot", "none"))
            })
            .collect::<Result<Vec<&DeviceTensor>, _>>()?;
        group.all_gather(&send, &mut self.recv)?;
        for ((i, (_, gpu)), m) in group.ranks().enumerate().zip(&mut self.merges) {
            if let Some(m) = m {
                copy_rows(gpu, &self.recv[i], &m.chain, &mut m.summaries)?;
                m.plan.run(gpu, &m.summaries, initial[i], &mut m.out)?;
            }
        }
        Ok(())
    }

    /// The states entering local rank `i`'s pieces, where its first piece continues (after
    /// [`Boundary::run`]).
    fn entering(&self, i: usize) -> Option<&DeviceTensor> {
        self.merges[i]
            .as_ref()
            .and_then(|m| m.out.final_state.as_ref())
    }
}

/// What both plans share: the group, the partition, every local rank's signature and the
/// boundary stage.
#[derive(Debug)]
struct Frame<'g> {
    group: &'g CpGroup,
    part: Partition,
    dims: Dims,
    inputs: Vec<Signature>,
    boundary: Option<Boundary>,
}

impl<'g> Frame<'g> {
    /// The first local rank's state layout, from its key and value tensors (after
    /// [`check_call`]: one input per local rank, at least one).
    fn first_dims(args: &[Vec<Arg<'_>>], k: &str, values: &str) -> GpuResult<Dims> {
        let find = |name: &str| {
            args.first()
                .and_then(|a| a.iter().find(|a| a.name == name))
                .and_then(|a| a.t)
                .ok_or_else(|| Error::missing(name, "a tensor", "none"))
        };
        Ok(Dims::of(find(k)?, find(values)?))
    }

    /// Checks a run's `args` (one per local rank) against the signatures the plan was made
    /// for, and `outs` outputs (one per local rank).
    fn check(&self, args: &[Vec<Arg<'_>>], outs: usize) -> GpuResult<()> {
        let n = self.inputs.len();
        for (arg, got) in [("shards", args.len()), ("outs", outs)] {
            if got != n {
                return Err(Error::shape(arg, format!("one per local rank ({n})"), [got]).into());
            }
        }
        for ((r, sig), a) in self
            .group
            .local_ranks()
            .into_iter()
            .zip(&self.inputs)
            .zip(args)
        {
            sig.check(r, a)?;
        }
        Ok(())
    }

    /// Steps 2-3 (nothing where no piece continues).
    fn exchange(
        &mut self,
        sent: &[Option<&DeviceTensor>],
        initial: &[Option<&DeviceTensor>],
    ) -> GpuResult<()> {
        match &mut self.boundary {
            Some(b) => b.run(self.group, sent, initial),
            None => Ok(()),
        }
    }

    /// The initial state of local rank `i`'s local op: the merged states where its first piece
    /// continues, else its own `initial`.
    fn entering<'a>(
        &'a self,
        i: usize,
        initial: Option<&'a DeviceTensor>,
    ) -> Option<&'a DeviceTensor> {
        self.boundary
            .as_ref()
            .and_then(|b| b.entering(i))
            .or(initial)
    }
}

/// Which forward, with its parameters.
#[derive(Debug, Clone, Copy)]
enum Op {
    Kda(KdaFwdParams),
    Gdn(GdnFwdParams),
}

impl Op {
    /// The single-GPU plan of a rank's local op (with the exact fallback, whose policy
    /// [`CpFwdPlan`] queues first on every rank: [`DeltaFwdPlan::queue_policy`]).
    fn plan(
        &self,
        gpu: &Gpu,
        t: &ForwardTensors<'_>,
        cu: Option<&[i64]>,
        path: ForwardPath,
    ) -> GpuResult<DeltaFwdPlan> {
        match self {
            Op::Kda(p) => DeltaFwdPlan::kda(gpu, t, cu, p, path),
            Op::Gdn(p) => DeltaFwdPlan::gdn(gpu, t, cu, p, path),
        }
    }

    /// The same forward returning the key-first final state (the summary run).
    fn summary(&self) -> Op {
        match *self {
            Op::Kda(p) => Op::Kda(KdaFwdParams {
                output_final_state: true,
                state_v_first: false,
                ..p
            }),
            Op::Gdn(p) => Op::Gdn(GdnFwdParams {
                output_final_state: true,
                state_v_first: false,
                ..p
            }),
        }
    }

    /// `(chunk_size, output_final_state, state_v_first)`.
    fn flags(&self) -> (i64, bool, bool) {
        match self {
            Op::Kda(p) => (p.chunk_size, p.output_final_state, p.state_v_first),
            Op::Gdn(p) => (p.chunk_size, p.output_final_state, p.state_v_first),
        }
    }
}

/// Chunks of a summary's tail by default ([`CpFwdPlan::with_tail_chunks`]): the most the
/// bound's kernels take. S11-5: at 32 chunks a trained-like gate's slowest head failed the
/// bound on one rank of four, whose whole-piece summary (a serial chain over its 4096 chunks)
/// took 12 ms of a 24.5 ms run.
pub const TAIL_CHUNKS: usize = 64;

/// Chunks of the short tail a summary with a longer tail also holds: under strong decay the
/// bound of one or two chunks already reaches `ln 2^-30` (S10-4: every strong-decay split row
/// warmed up at most 1 chunk), and the summary run is a serial chain of its chunks (S10-6: the
/// 32-chunk tails took 0.3 ms of a 2.9 ms run on 4 GPUs).
pub const SHORT_TAIL_CHUNKS: usize = 4;

/// The tails a summary of a tail of `chunks` chunks holds, shortest first: [`SHORT_TAIL_CHUNKS`],
/// 16 and 32 where shorter than `chunks`, then `chunks` (a run costs its chunks in series, so
/// each run sends the shortest tail the bound allows).
pub fn tail_levels(chunks: usize) -> Vec<usize> {
    let mut v: Vec<usize> = [SHORT_TAIL_CHUNKS, 16, 32]
        .into_iter()
        .filter(|&n| n < chunks)
        .collect();
    v.push(chunks);
    v
}

/// What a rank's local forward chose in a [`CpFwdPlan`]'s last run (the automatic split).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalChoice {
    /// Per (piece, value head): the warm-up chunks (`0`: a sequence's first piece, `-1`: run
    /// through by the piece before it).
    pub warmups: Vec<i64>,
    /// Per (sequence, value head): whether the split ran it (`None`: the split runs at the
    /// serial width, no verdict).
    pub split: Option<Vec<bool>>,
    /// Whether the rank's forward took the exact fallback (the staged path with `fwd_h`'s
    /// exact split: [`DeltaFwdPlan::ran_exact_fallback`]).
    pub exact_fallback: bool,
}

/// Which summary a rank sent in a [`CpFwdPlan`]'s last run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SentSummary {
    /// The summary of the continuing piece's last `n` chunks (the bound allowed it).
    Tail(usize),
    /// The whole continuing piece's summary, by the rank's own forward over its sub-pieces.
    Whole,
    /// The whole continuing piece's summary from the tiles of the rank's local forward: the
    /// exact fallback's split `fwd_h`'s own pre-scan of the piece's pieces, chained
    /// (`whole::SplitRows`), or `fwd_h_pre_scan` over `fwd_h`'s inputs (`whole::PreScanned`):
    /// the fallback's, where its `fwd_h` leaves the piece whole, or the fused path's own
    /// (KDA).
    PreScanned,
}

/// One summary run (step 1 for the forwards) over rows of a rank's continuing piece: the
/// forward itself on those rows with values `[v | 0]` from `[0 | I]`; the final state's first
/// `V` columns are the exit state from zero (`b`), the last `K` the product of the rows'
/// transition maps (`M`).
#[derive(Debug)]
struct SummaryRun {
    /// The rows' `q, k, g, beta`.
    rows: PieceRows,
    /// `[v | 0]`: `[1, len, HV, V + K]`, its last `K` columns zeroed once.
    v: DeviceTensor,
    plan: DeltaFwdPlan,
    ws: DeltaFwdWorkspace,
    /// `final_state`: the rows' `[b | M]`, the slot the rank sends.
    out: DeltaFwdDeviceOutputs,
}

/// The summary's row sources: `q, k, g, beta` of the shard.
fn summary_sources<'a>(t: &ForwardTensors<'a>) -> [Option<&'a DeviceTensor>; 4] {
    [Some(t.q), Some(t.k), Some(t.g), Some(t.beta)]
}

impl SummaryRun {
    /// The run of `spec`'s op over the rows of `piece` (local to its shard `t`) from `h0`
    /// (`[0 | I]` per sequence): one sequence, or the sequences `cu` (offsets within the rows).
    fn new(
        gpu: &Gpu,
        spec: &SummarySpec,
        t: &ForwardTensors<'_>,
        piece: &Piece,
        h0: &DeviceTensor,
        cu: Option<&[i64]>,
    ) -> GpuResult<SummaryRun> {
        let d = spec.dims;
        let rows = PieceRows::new(gpu, piece, spec.shard_tokens, &summary_sources(t))?;
        let wide = [1, piece.len, d.hv, d.v + d.k];
        let mut v = DeviceTensor::alloc(gpu, &wide, t.v.dtype())?;
        zero(gpu, &mut v)?;
        // without the exact fallback (its host read would hold back the ranks' summaries), and
        // without `o` (a summary is the final state alone)
        let plan = (spec.op.summary())
            .plan(gpu, &Self::inputs(&rows, &v, h0, t)?, cu, spec.path)?
            .without_exact_fallback()
            .final_state_only(gpu)?;
        let ws = plan.alloc_workspace(gpu)?;
        let out = plan.alloc_outputs(gpu)?;
        Ok(SummaryRun {
            rows,
            v,
            plan,
            ws,
            out,
        })
    }

    /// The run's inputs.
    fn inputs<'a>(
        rows: &'a PieceRows,
        v: &'a DeviceTensor,
        h0: &'a DeviceTensor,
        t: &ForwardTensors<'a>,
    ) -> GpuResult<ForwardTensors<'a>> {
        let [Some(q), Some(k), Some(g), Some(beta)] = rows.rows(summary_sources(t)) else {
            return Err(Error::missing("rows", "the piece's q, k, g, beta", "none").into());
        };
        Ok(ForwardTensors {
            initial_state: Some(h0),
            a_log: t.a_log,
            dt_bias: t.dt_bias,
            ..ForwardTensors::new(q, k, v, g, beta)
        })
    }

    /// Copies the rows of `t` into the buffers and queues the run.
    fn run(&mut self, gpu: &Gpu, t: &ForwardTensors<'_>, h0: &DeviceTensor) -> GpuResult<()> {
        self.rows.fill(gpu, &summary_sources(t))?;
        copy_padded_rows(gpu, t.v, self.rows.start, &mut self.v)?;
        let inputs = Self::inputs(&self.rows, &self.v, h0, t)?;
        self.plan.run(gpu, &inputs, &mut self.ws, &mut self.out)
    }
}

/// The bound check of a summary's tail (`conformance/spec/ops-delta-rule.md` §11): one row of
/// the split's pieces table placing a piece at the continuing piece's end, its sequence
/// starting at the piece's start, so that the warm-up policy of §5.10 bounds the last
/// `chunks` chunks; the bounds of those chunks and the warm-ups per value head land in
/// `policy`.
#[derive(Debug)]
struct TailCheck {
    table: DeviceTensor,
    policy: PolicyTensors,
    chunks: usize,
}

impl TailCheck {
    /// Reads the bounds (waiting for them) and returns the fewest chunks among `lens` (each at
    /// most `chunks`, ascending) whose summary the bound allows: every value head's bounds of
    /// the tail's last `n` chunks, summed nearest chunk first (as the warm-up walk sums them),
    /// at most `ln 2^-30`; `None` where none is. The whole window's sum is what bounds the
    /// tail's map `M_t` (spec §11): a prefix reaching the threshold does not, where a later
    /// chunk's bound is positive (`β ‖k‖² > 2`).
    fn allowed(&self, gpu: &Gpu, hv: usize, lens: &[usize]) -> GpuResult<Option<usize>> {
        let lam: Vec<f64> = self
            .policy
            .lam
            .to_array::<f64>(gpu)?
            .iter()
            .copied()
            .collect();
        if lam.len() < self.chunks * hv {
            let got = format!("{} bounds", lam.len());
            return Err(
                Error::missing("policy", "a bound per tail chunk and value head", got).into(),
            );
        }
        let fits = |n: usize| {
            (0..hv).all(|h| (0..n).map(|j| lam[j * hv + h]).fold(0.0, |acc, x| acc + x) <= LOG_EPS)
        };
        Ok(lens.iter().copied().find(|&n| n <= self.chunks && fits(n)))
    }
}

/// What a rank's summary runs are made of: the op, its continuing piece within a shard of
/// `shard_tokens` rows, the dimensions and the path.
#[derive(Debug, Clone, Copy)]
struct SummarySpec {
    op: Op,
    piece: Piece,
    shard_tokens: usize,
    dims: Dims,
    path: ForwardPath,
}

/// The summary of a rank's continuing piece: the whole piece's run and, where the piece is
/// longer than the tail, runs over the tail's last chunks at each of [`tail_levels`] with one
/// bound check over the tail. The shortest tail whose chunks' bounds reach `ln 2^-30` for every
/// value head (§5.10) is sent as `[b | M]`: the state entering that tail differs from the one the
/// merge applies `M` to by a state of norm at most the tail's `‖M‖ ≤ 2^-30` times the states'
/// norms, the split's own truncation; else the whole piece's. Decided per run (one host read of
/// the tail's `chunks · HV` bounds per rank).
#[derive(Debug)]
struct ForwardSummary {
    /// `[0 | I]`: `[1, HV, K, V + K]`.
    h0: DeviceTensor,
    /// The whole piece's summary (in parallel: [`whole`]): made with the plan where there is no
    /// tail, else by the first run whose tail bound fails. It holds the piece's inputs at
    /// `V + K` columns and a forward's workspace, about the local op's memory again: a rank
    /// whose tails always suffice never allocates it.
    full: Option<WholeSummary>,
    spec: SummarySpec,
    /// The whole piece's summary from the tiles of the local forward's exact fallback: made by
    /// the first run that sends it.
    prescanned: Option<PreScanned>,
    /// The whole piece's summary from the exact fallback's own split pre-scan (its rows of the
    /// piece chained): made by the first run that sends it.
    split_rows: Option<SplitRows>,
    /// The last [`SentSummary::PreScanned`] came from `split_rows`.
    from_rows: bool,
    /// The bound check over the longest tail, where the piece is longer.
    check: Option<TailCheck>,
    /// The tail runs, shortest first: `(chunks, run)`.
    tails: Vec<(usize, SummaryRun)>,
    /// What the last run sent (`None` before the first).
    sent: Option<SentSummary>,
}

impl ForwardSummary {
    /// The summary of `spec`'s piece of the shard `t`, with a tail of `tail = (chunks, bt)`
    /// where the piece is longer.
    fn new(
        gpu: &Gpu,
        t: &ForwardTensors<'_>,
        spec: SummarySpec,
        tail: Option<(usize, usize)>,
    ) -> GpuResult<ForwardSummary> {
        let (piece, d) = (&spec.piece, spec.dims);
        let h0 = zero_identity(gpu, 1, (d.hv, d.k, d.v), d.state)?;
        let end = piece.start + piece.len;
        let last = |len: usize| Piece {
            start: end - len,
            len,
            ..*piece
        };
        let mut tails = Vec::new();
        let check = match tail {
            Some((chunks, bt)) if piece.len > chunks * bt => {
                for n in tail_levels(chunks) {
                    tails.push((n, spec.run_over(gpu, t, &last(n * bt), &h0)?));
                }
                // the sequence as the policy sees it starts a whole number of chunks before the
                // end, so that the chunks it bounds are the piece's last ones
                let seq0 = end - piece.len / bt * bt;
                let table = [end, 0, seq0, end, 0].map(|x| x as i64);
                Some(TailCheck {
                    table: DeviceTensor::from_slice(gpu, &table)?,
                    policy: PolicyTensors::alloc(gpu, 1, chunks, d.hv)?,
                    chunks,
                })
            }
            _ => None,
        };
        let full = match check {
            Some(_) => None,
            None => Some(WholeSummary::new(gpu, &spec, t, &h0)?),
        };
        Ok(ForwardSummary {
            h0,
            full,
            prescanned: None,
            split_rows: None,
            from_rows: false,
            spec,
            check,
            tails,
            sent: None,
        })
    }

    /// Queues the tail's bound check (where there is a tail) with `local`, the rank's plan.
    fn check_tail(
        &mut self,
        gpu: &Gpu,
        local: &DeltaFwdPlan,
        t: &ForwardTensors<'_>,
    ) -> GpuResult<()> {
        match &mut self.check {
            Some(c) => local.run_warm_policy(gpu, t, &c.table, 1, c.chunks, &mut c.policy, None),
            None => Ok(()),
        }
    }

    /// Reads the bound check's verdict (waiting for it: called before anything of this run but
    /// the policies and bound checks is queued on the rank) and records the summary the run
    /// sends: the shortest tail the bound allows, else the whole piece's.
    fn decide(&mut self, gpu: &Gpu) -> GpuResult<()> {
        let lens: Vec<usize> = self.tails.iter().map(|(n, _)| *n).collect();
        let allowed = match &self.check {
            Some(c) => c.allowed(gpu, self.spec.dims.hv, &lens)?,
            None => None,
        };
        self.sent = Some(allowed.map_or(SentSummary::Whole, SentSummary::Tail));
        Ok(())
    }

    /// Whether [`Self::decide`] chose the whole piece's summary.
    fn sends_whole(&self) -> bool {
        self.sent == Some(SentSummary::Whole)
    }

    /// Queues the summary [`Self::decide`] chose; `head`: what the rank's local forward's
    /// first half offers (its exact fallback's pre-scan or tiles, or the fused path's tiles):
    /// the whole piece's summary is then [`SentSummary::PreScanned`].
    fn run(
        &mut self,
        gpu: &Gpu,
        t: &ForwardTensors<'_>,
        head: Option<FromHead<'_>>,
    ) -> GpuResult<()> {
        if head.is_some() && self.sent == Some(SentSummary::Whole) {
            self.sent = Some(SentSummary::PreScanned);
        }
        match (self.sent, head) {
            (Some(SentSummary::Tail(n)), _) => match self.tails.iter_mut().find(|(c, _)| *c == n) {
                Some((_, run)) => run.run(gpu, t, &self.h0),
                None => Err(Error::missing("summary", "the tail's run", "none").into()),
            },
            (Some(SentSummary::PreScanned), Some(FromHead::Rows(hm, row0, m))) => {
                self.from_rows = true;
                if self.split_rows.is_none() {
                    self.split_rows = Some(SplitRows::new(gpu, &self.spec, m, &self.h0)?);
                }
                match &mut self.split_rows {
                    Some(c) => c.run(gpu, (hm, row0, m), &self.h0),
                    None => Err(Error::missing("summary", "the chain", "none").into()),
                }
            }
            (Some(SentSummary::PreScanned), Some(FromHead::Tiles(tiles))) => {
                self.from_rows = false;
                if self.prescanned.is_none() {
                    let p = PreScanned::new(gpu, &self.spec, &tiles, &self.h0)?;
                    self.prescanned = Some(p);
                }
                match &mut self.prescanned {
                    Some(p) => p.run(gpu, &tiles, &self.h0),
                    None => Err(Error::missing("summary", "the pre-scan", "none").into()),
                }
            }
            (Some(SentSummary::Whole), _) => {
                if self.full.is_none() {
                    self.full = Some(WholeSummary::new(gpu, &self.spec, t, &self.h0)?);
                }
                match &mut self.full {
                    Some(full) => full.run(gpu, t, &self.h0),
                    None => Err(Error::missing("summary", "the whole piece's run", "none").into()),
                }
            }
            _ => Err(Error::missing(
                "summary",
                "a decided summary (and the local forward's tiles for a pre-scan)",
                "none",
            )
            .into()),
        }
    }

    /// The slot the last run filled.
    fn sent(&self) -> Option<&DeviceTensor> {
        match self.sent {
            Some(SentSummary::Tail(c)) => (self.tails.iter().find(|(n, _)| *n == c))
                .and_then(|(_, run)| run.out.final_state.as_ref()),
            Some(SentSummary::PreScanned) => match (&self.split_rows, &self.prescanned) {
                (Some(c), _) if self.from_rows => c.slot(),
                (_, Some(p)) => p.slot(),
                _ => None,
            },
            _ => self.full.as_ref().and_then(WholeSummary::slot),
        }
    }
}

impl SummarySpec {
    /// A summary run over `rows` (the whole piece, or its tail) of the shard `t`, from `h0`.
    fn run_over(
        &self,
        gpu: &Gpu,
        t: &ForwardTensors<'_>,
        rows: &Piece,
        h0: &DeviceTensor,
    ) -> GpuResult<SummaryRun> {
        SummaryRun::new(gpu, self, t, rows, h0, None)
    }
}

/// What the first half of a rank's local forward offers the whole piece's summary.
enum FromHead<'a> {
    /// The exact fallback's split pre-scan's rows of the piece's pieces: `hm`, the first row,
    /// the pieces.
    Rows(&'a DeviceTensor, usize, usize),
    /// `fwd_h` inputs, pre-scanned by the summary: the exact fallback's, where its `fwd_h`
    /// leaves the piece whole, or the fused path's own tiles (KDA; the intra stage then also
    /// wrote the gate per token).
    Tiles(FwdHTensors<'a>),
}

/// One local rank of a [`CpFwdPlan`].
#[derive(Debug)]
struct ForwardRank {
    /// The local op on the shard (`None`: a rank without pieces).
    local: Option<(DeltaFwdPlan, DeltaFwdWorkspace)>,
    /// The summary of the rank's continuing piece, where it has one.
    summary: Option<ForwardSummary>,
}

/// The phases of a [`CpFwdPlan`] run, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CpPhase {
    /// The tails' bound checks (the warm-up policy over each continuing piece's tail).
    TailChecks,
    /// Each rank's local forward's first half (the warm-up choice, the intra stage) and the
    /// summary of its continuing piece (its tail's, or the whole piece's).
    Summaries,
    /// The all-gather of the summaries and each rank's merge into its entering states.
    Exchange,
    /// The local forward on every rank.
    Local,
}

/// Wall time of each phase of a [`CpFwdPlan::run_phases`] (ms, the group synchronised after
/// each: the slowest rank's).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CpPhaseTimes {
    /// The tails' bound checks.
    pub tail_checks_ms: f64,
    /// The ranks' local first halves and summaries (tails or whole pieces).
    pub summaries_ms: f64,
    /// The all-gather and the merges.
    pub exchange_ms: f64,
    /// The local forwards' second halves (the recurrence and the output).
    pub local_ms: f64,
}

/// A persistent context-parallel `kda_fwd` / `gdn_fwd` (module docs): made once for a group, a
/// partition, the shards' shapes and dtypes, the op's parameters and path; [`CpFwdPlan::run`]
/// then runs the forward on shards of those shapes into outputs of [`CpFwdPlan::alloc_outputs`]
/// with no allocation and no plan but what the first run to need it makes (a whole-piece
/// summary, a local forward's exact fallback: module docs).
#[derive(Debug)]
pub struct CpFwdPlan<'g> {
    frame: Frame<'g>,
    op: Op,
    /// `q`'s dtype (`o`'s).
    dtype: Dtype,
    ranks: Vec<ForwardRank>,
}

impl<'g> CpFwdPlan<'g> {
    /// The plan of context-parallel `kda_fwd` (`conformance/spec/ops-delta-rule.md` §6):
    /// `shards[i]` holds local rank `i`'s token rows of `q, k, v, g, beta` (`[1, T_r, ...]`),
    /// its pieces' rows of `initial_state` ([`super::scatter_states`]) and `A_log`, `dt_bias`
    /// whole. Every option of the single-GPU op applies. Errors (typed, naming the argument and
    /// rank) before anything is allocated or launched.
    pub fn kda(
        group: &'g CpGroup,
        part: &Partition,
        shards: &[ForwardTensors<'_>],
        p: &KdaFwdParams,
        path: ForwardPath,
    ) -> GpuResult<CpFwdPlan<'g>> {
        Self::new(group, part, shards, Op::Kda(*p), path)
    }

    /// The plan of context-parallel `gdn_fwd` (`conformance/spec/ops-delta-rule.md` §8), as
    /// [`CpFwdPlan::kda`].
    pub fn gdn(
        group: &'g CpGroup,
        part: &Partition,
        shards: &[ForwardTensors<'_>],
        p: &GdnFwdParams,
        path: ForwardPath,
    ) -> GpuResult<CpFwdPlan<'g>> {
        Self::new(group, part, shards, Op::Gdn(*p), path)
    }

    fn new(
        group: &'g CpGroup,
        part: &Partition,
        shards: &[ForwardTensors<'_>],
        op: Op,
        path: ForwardPath,
    ) -> GpuResult<CpFwdPlan<'g>> {
        let (chunk_size, _, state_v_first) = op.flags();
        let args: Vec<Vec<Arg<'_>>> = shards.iter().map(forward_args).collect();
        check_call(group, part, chunk_size, &args)?;
        // every rank's local call validated before anything is allocated
        let mut locals = Vec::new();
        for ((r, gpu), t) in group.ranks().zip(shards) {
            let s = part.shard(r);
            locals.push(match s.pieces.is_empty() {
                true => None,
                false => Some(op.plan(gpu, t, Some(&s.cu_seqlens()), path)?),
            });
        }
        let dims = Frame::first_dims(&args, "k", "v")?;
        let mut ranks = Vec::new();
        for (((r, gpu), t), local) in group.ranks().zip(shards).zip(locals) {
            let s = part.shard(r);
            let tail = local
                .as_ref()
                .filter(|l| l.has_warm_policy())
                .map(|_| (TAIL_CHUNKS, part.chunk_size()));
            let summary = s
                .continuing()
                .map(|p| {
                    let spec = SummarySpec {
                        op,
                        piece: *p,
                        shard_tokens: s.tokens(),
                        dims,
                        path,
                    };
                    ForwardSummary::new(gpu, t, spec, tail)
                })
                .transpose()?;
            let local = match local {
                Some(plan) => {
                    // the exact fallback's own pre-scan serves a continuing piece's summary
                    let plan = match s.continuing() {
                        Some(_) => plan.with_exit_summary(),
                        None => plan,
                    };
                    let ws = plan.alloc_workspace(gpu)?;
                    Some((plan, ws))
                }
                None => None,
            };
            ranks.push(ForwardRank { local, summary });
        }
        let summarises: Vec<bool> = ranks.iter().map(|r| r.summary.is_some()).collect();
        let initial: Vec<Option<&DeviceTensor>> = shards.iter().map(|t| t.initial_state).collect();
        let boundary = Boundary::new(group, part, dims, &summarises, &initial, state_v_first)?;
        Ok(CpFwdPlan {
            frame: Frame {
                group,
                part: part.clone(),
                dims,
                inputs: args.iter().map(|a| Signature::of(a)).collect(),
                boundary,
            },
            op,
            dtype: shards[0].q.dtype(),
            ranks,
        })
    }

    /// The plan with its summaries' tail at `chunks` chunks (1 to 64; `None`: every summary
    /// over the whole continuing piece); [`TAIL_CHUNKS`] by default. A rank whose continuing
    /// piece is longer than the tail sends the tail's summary when the bound allows it (module
    /// docs); bf16 and f16 only (the bound's kernels). `shards`: as for the plan (their shapes
    /// are checked; nothing is read).
    pub fn with_tail_chunks(
        mut self,
        shards: &[ForwardTensors<'_>],
        chunks: Option<usize>,
    ) -> GpuResult<CpFwdPlan<'g>> {
        if let Some(c) = chunks.filter(|c| !(1..=64).contains(c)) {
            return Err(Error::param("tail_chunks", "1 to 64 chunks (the bound's most)", c).into());
        }
        let args: Vec<Vec<Arg<'_>>> = shards.iter().map(forward_args).collect();
        self.frame.check(&args, self.ranks.len())?;
        let (group, bt) = (self.frame.group, self.frame.part.chunk_size());
        for (((_, gpu), t), rank) in group.ranks().zip(shards).zip(&mut self.ranks) {
            if let Some(sum) = &mut rank.summary {
                let bound = rank
                    .local
                    .as_ref()
                    .is_some_and(|(l, _)| l.has_warm_policy());
                let tail = chunks.filter(|_| bound).map(|c| (c, bt));
                *sum = ForwardSummary::new(gpu, t, sum.spec, tail)?;
            }
        }
        Ok(self)
    }

    /// Per local rank: the summary its last run sent (`None` for a rank that sends none, or
    /// before the first run).
    pub fn tail_summaries(&self) -> Vec<Option<SentSummary>> {
        self.ranks
            .iter()
            .map(|r| r.summary.as_ref().and_then(|s| s.sent))
            .collect()
    }

    /// Per local rank: what its local forward's automatic split chose in the last run
    /// ([`DeltaFwdPlan::chosen_warmups`], [`DeltaFwdPlan::chosen_split`]); `None` for a rank
    /// without pieces or a local plan that does not split. A diagnostic: it reads the device.
    pub fn local_choices(&self) -> GpuResult<Vec<Option<LocalChoice>>> {
        self.ranks
            .iter()
            .zip(self.frame.group.ranks())
            .map(|(r, (_, gpu))| {
                let Some((plan, ws)) = &r.local else {
                    return Ok(None);
                };
                let Some(warmups) = plan.chosen_warmups(gpu, ws)? else {
                    return Ok(None);
                };
                Ok(Some(LocalChoice {
                    warmups,
                    split: plan.chosen_split(gpu, ws)?,
                    exact_fallback: plan.ran_exact_fallback(ws),
                }))
            })
            .collect()
    }

    /// Per local rank: the grid of the persistent `kda_intra_pipe` kernel when its local
    /// forward's intra stage runs on it ([`DeltaFwdPlan::intra_pipe`]); `None` for a rank
    /// without pieces, a GDN plan, or a call the kernel does not take.
    pub fn local_intra_pipes(&self) -> Vec<Option<usize>> {
        self.per_local_plan(DeltaFwdPlan::intra_pipe)
    }

    /// Per local rank: the grid of `kda_intra_pipe` when its local forward's exact fallback (the
    /// staged twin) runs its intra stage on it ([`DeltaFwdPlan::fallback_intra_pipe`]); `None`
    /// for a rank without pieces, a local plan without the fallback (no sequence long enough, or
    /// no split), a GDN plan, or a call the kernel does not take. Whether the twin ran is
    /// [`LocalChoice::exact_fallback`].
    pub fn local_fallback_intra_pipes(&self) -> Vec<Option<usize>> {
        self.per_local_plan(DeltaFwdPlan::fallback_intra_pipe)
    }

    /// `f` of each local rank's forward plan; `None` for a rank without pieces.
    fn per_local_plan(&self, f: impl Fn(&DeltaFwdPlan) -> Option<usize>) -> Vec<Option<usize>> {
        self.ranks
            .iter()
            .map(|r| r.local.as_ref().and_then(|(plan, _)| f(plan)))
            .collect()
    }

    /// The partition the plan runs.
    pub fn partition(&self) -> &Partition {
        &self.frame.part
    }

    /// Fresh (unwritten) outputs, per local rank: `o` of its tokens and, with
    /// `output_final_state`, the exit state of each of its pieces (module docs); a rank without
    /// pieces gets zero-row tensors, which [`CpFwdPlan::run`] neither reads nor writes.
    pub fn alloc_outputs(&self) -> GpuResult<Vec<DeltaFwdDeviceOutputs>> {
        let (_, output_final_state, state_v_first) = self.op.flags();
        let d = self.frame.dims;
        self.frame
            .group
            .ranks()
            .zip(&self.ranks)
            .map(|((_, gpu), rank)| match &rank.local {
                Some((plan, _)) => plan.alloc_outputs(gpu),
                None => Ok(DeltaFwdDeviceOutputs {
                    o: DeviceTensor::alloc(gpu, &[1, 0, d.hv, d.v], self.dtype)?,
                    final_state: d.no_states(gpu, output_final_state, state_v_first)?,
                }),
            })
            .collect()
    }

    /// Queues the forward of `shards` (one per local rank, the shapes and dtypes the plan was
    /// made for) into `outs` ([`CpFwdPlan::alloc_outputs`]): every rank's call is checked first
    /// (typed errors naming the argument and rank, before any launch on any GPU); then the
    /// summaries, the all-gather (queued behind them), the merges and the local ops.
    /// [`CpGroup::synchronize`] waits for the outputs.
    pub fn run(
        &mut self,
        shards: &[ForwardTensors<'_>],
        outs: &mut [DeltaFwdDeviceOutputs],
    ) -> GpuResult<()> {
        self.run_marked(shards, outs, |_| Ok(()))
    }

    /// [`CpFwdPlan::run`] with the group synchronised after each phase, and the wall time of
    /// each (the slowest rank's, launch included): where a run's time goes, communication
    /// against compute. A diagnostic (the waits serialise what `run` overlaps); the outputs are
    /// `run`'s.
    pub fn run_phases(
        &mut self,
        shards: &[ForwardTensors<'_>],
        outs: &mut [DeltaFwdDeviceOutputs],
    ) -> GpuResult<CpPhaseTimes> {
        let group = self.frame.group;
        group.synchronize()?;
        let mut last = std::time::Instant::now();
        let mut times = CpPhaseTimes::default();
        self.run_marked(shards, outs, |phase| {
            group.synchronize()?;
            let now = std::time::Instant::now();
            let ms = (now - last).as_secs_f64() * 1e3;
            last = now;
            match phase {
                CpPhase::TailChecks => times.tail_checks_ms = ms,
                CpPhase::Summaries => times.summaries_ms = ms,
                CpPhase::Exchange => times.exchange_ms = ms,
                CpPhase::Local => times.local_ms = ms,
            }
            Ok(())
        })?;
        Ok(times)
    }

    /// `run`, calling `mark` after queueing each phase.
    fn run_marked(
        &mut self,
        shards: &[ForwardTensors<'_>],
        outs: &mut [DeltaFwdDeviceOutputs],
        mut mark: impl FnMut(CpPhase) -> GpuResult<()>,
    ) -> GpuResult<()> {
        let group = self.frame.group;
        let args: Vec<Vec<Arg<'_>>> = shards.iter().map(forward_args).collect();
        self.frame.check(&args, outs.len())?;
        for (i, ((rank, t), out)) in self.ranks.iter().zip(shards).zip(outs.iter()).enumerate() {
            if let Some((plan, _)) = &rank.local {
                let call = ForwardTensors {
                    initial_state: self.frame.entering(i, t.initial_state),
                    ..*t
                };
                plan.check_call(&call, out)?;
            }
        }
        // every rank's local warm-up policy (read by its local run, where the plan holds the
        // exact fallback) and the tails' bound checks, then each rank's summary (tail or whole)
        for (((_, gpu), t), rank) in group.ranks().zip(shards).zip(&mut self.ranks) {
            if let Some((local, ws)) = &mut rank.local {
                local.queue_policy(gpu, t, ws)?;
            }
            if let (Some(s), Some((local, _))) = (&mut rank.summary, &rank.local) {
                s.check_tail(gpu, local, t)?;
            }
        }
        mark(CpPhase::TailChecks)?;
        // per rank, both host reads (the summary's tail verdict, the local forward's choice)
        // before its launches, so that neither waits behind this rank's intra stage
        let each = group.ranks().zip(shards).zip(&mut self.ranks);
        for (i, ((_, gpu), t), rank) in each.enumerate().map(|(i, (a, r))| (i, a, r)) {
            let Some((local, ws)) = &mut rank.local else {
                continue;
            };
            if let Some(s) = &mut rank.summary {
                s.decide(gpu)?;
            }
            let call = ForwardTensors {
                initial_state: self.frame.entering(i, t.initial_state),
                ..*t
            };
            let whole = rank
                .summary
                .as_ref()
                .is_some_and(ForwardSummary::sends_whole);
            local.run_head(gpu, &call, ws, whole)?;
            if let Some(s) = &mut rank.summary {
                let from = match local.fallback_exit_summaries(ws) {
                    Some((hm, row0, m)) => Some(FromHead::Rows(hm, row0, m)),
                    None => local.head_fwd_h_inputs(ws).map(FromHead::Tiles),
                };
                s.run(gpu, t, from)?;
            }
        }
        mark(CpPhase::Summaries)?;
        let sent: Vec<Option<&DeviceTensor>> = self
            .ranks
            .iter()
            .map(|r| r.summary.as_ref().and_then(ForwardSummary::sent))
            .collect();
        let initial: Vec<Option<&DeviceTensor>> = shards.iter().map(|t| t.initial_state).collect();
        self.frame.exchange(&sent, &initial)?;
        mark(CpPhase::Exchange)?;
        let each = group
            .ranks()
            .zip(shards)
            .zip(self.ranks.iter_mut().zip(outs));
        for (i, (((_, gpu), t), (rank, out))) in each.enumerate() {
            if let Some((plan, ws)) = &mut rank.local {
                let call = ForwardTensors {
                    initial_state: self.frame.entering(i, t.initial_state),
                    ..*t
                };
                plan.run(gpu, &call, ws, out)?;
            }
        }
        mark(CpPhase::Local)
    }

    /// New outputs, one run, the ranks synchronised: what [`cp_kda_fwd`] and [`cp_gdn_fwd`]
    /// return.
    fn run_new(&mut self, shards: &[ForwardTensors<'_>]) -> GpuResult<Vec<DeltaFwdDeviceOutputs>> {
        let mut outs = self.alloc_outputs()?;
        self.run(shards, &mut outs)?;
        self.frame.group.synchronize()?;
        Ok(outs)
    }
}

/// Context-parallel `kda_fwd` (`conformance/spec/ops-delta-rule.md` §6) in one call: the
/// [`CpFwdPlan::kda`] of the shards, new outputs, one run, the ranks synchronised. Returns per
/// local rank `o` of its tokens and, with `output_final_state`, the exit state of each of its
/// pieces (module docs).
pub fn cp_kda_fwd(
    group: &CpGroup,
    part: &Partition,
    shards: &[ForwardTensors<'_>],
    p: &KdaFwdParams,
    path: ForwardPath,
) -> GpuResult<Vec<DeltaFwdDeviceOutputs>> {
    CpFwdPlan::kda(group, part, shards, p, path)?.run_new(shards)
}

/// Context-parallel `gdn_fwd` (`conformance/spec/ops-delta-rule.md` §8), as [`cp_kda_fwd`].
pub fn cp_gdn_fwd(
    group: &CpGroup,
    part: &Partition,
    shards: &[ForwardTensors<'_>],
    p: &GdnFwdParams,
    path: ForwardPath,
) -> GpuResult<Vec<DeltaFwdDeviceOutputs>> {
    CpFwdPlan::gdn(group, part, shards, p, path)?.run_new(shards)
}

/// The summary of a rank's continuing piece for `fwd_h` (step 1): `fwd_h_pre_scan` on the
/// piece's rows into `hm` (`[1, HV, K, V + K]`, the slot the rank sends).
#[derive(Debug)]
struct FwdHSummary {
    /// The piece's rows of `k, w, u, g, gk`.
    rows: PieceRows,
    plan: FwdHPreScanPlan,
    hm: DeviceTensor,
}

/// The summary's row sources: `k, w, u, g, gk` of the shard.
fn prescan_sources<'a>(t: &FwdHTensors<'a>) -> [Option<&'a DeviceTensor>; 5] {
    [Some(t.k), Some(t.w), Some(t.u), t.g, t.gk]
}

impl FwdHSummary {
    fn new(
        gpu: &Gpu,
        t: &FwdHTensors<'_>,
        piece: &Piece,
        shard_tokens: usize,
        chunk_size: i64,
    ) -> GpuResult<FwdHSummary> {
        let rows = PieceRows::new(gpu, piece, shard_tokens, &prescan_sources(t))?;
        let params = FwdHPreScanParams { chunk_size };
        let plan = FwdHPreScanPlan::new(gpu, &Self::tail(&rows, t)?, None, &params)?;
        let hm = DeviceTensor::alloc(gpu, &plan.hm_shape(), plan.hm_dtype())?;
        Ok(FwdHSummary { rows, plan, hm })
    }

    /// The pre-scan's inputs.
    fn tail<'a>(rows: &'a PieceRows, t: &FwdHTensors<'a>) -> GpuResult<FwdHTensors<'a>> {
        let [Some(k), Some(w), Some(u), g, gk] = rows.rows(prescan_sources(t)) else {
            return Err(Error::missing("rows", "the piece's k, w, u", "none").into());
        };
        Ok(FwdHTensors {
            g,
            gk,
            ..FwdHTensors::new(k, w, u)
        })
    }

    /// Copies the piece's rows of `t` into the buffers and queues the pre-scan.
    fn run(&mut self, gpu: &Gpu, t: &FwdHTensors<'_>) -> GpuResult<()> {
        self.rows.fill(gpu, &prescan_sources(t))?;
        let tail = Self::tail(&self.rows, t)?;
        self.plan.run(gpu, &tail, &mut self.hm)
    }
}

/// One local rank of a [`CpFwdHPlan`].
#[derive(Debug)]
struct FwdHRank {
    /// The local op on the shard (`None`: a rank without pieces).
    local: Option<FwdHPlan>,
    summary: Option<FwdHSummary>,
}

/// A persistent context-parallel `chunk_gated_delta_rule_fwd_h`, as [`CpFwdPlan`].
#[derive(Debug)]
pub struct CpFwdHPlan<'g> {
    frame: Frame<'g>,
    params: FwdHParams,
    /// `k`'s dtype (`h`'s and `v_new`'s).
    dtype: Dtype,
    ranks: Vec<FwdHRank>,
}

impl<'g> CpFwdHPlan<'g> {
    /// The plan of context-parallel `chunk_gated_delta_rule_fwd_h`
    /// (`conformance/spec/ops-delta-rule.md` §2): `shards[i]` holds local rank `i`'s token rows
    /// of `k, w, u, g, gk` (`[1, T_r, ...]`) and, as its `initial_state`, the rows
    /// `[P_r, HV, K, V]` of its pieces' sequences ([`super::scatter_states`]). Errors (typed,
    /// naming the argument and rank) before anything is allocated or launched.
    pub fn new(
        group: &'g CpGroup,
        part: &Partition,
        shards: &[FwdHTensors<'_>],
        params: &FwdHParams,
    ) -> GpuResult<CpFwdHPlan<'g>> {
        let args: Vec<Vec<Arg<'_>>> = shards.iter().map(fwd_h_args).collect();
        check_call(group, part, params.chunk_size, &args)?;
        let mut locals = Vec::new();
        for ((r, gpu), t) in group.ranks().zip(shards) {
            let s = part.shard(r);
            locals.push(match s.pieces.is_empty() {
                true => None,
                false => Some(FwdHPlan::new(gpu, t, Some(&s.cu_seqlens()), params)?),
            });
        }
        let dims = Frame::first_dims(&args, "k", "u")?;
        let mut ranks = Vec::new();
        for (((r, gpu), t), local) in group.ranks().zip(shards).zip(locals) {
            let s = part.shard(r);
            let summary = s
                .continuing()
                .map(|p| FwdHSummary::new(gpu, t, p, s.tokens(), params.chunk_size))
                .transpose()?;
            ranks.push(FwdHRank { local, summary });
        }
        let summarises: Vec<bool> = ranks.iter().map(|r| r.summary.is_some()).collect();
        let initial: Vec<Option<&DeviceTensor>> = shards.iter().map(|t| t.initial_state).collect();
        let boundary = Boundary::new(
            group,
            part,
            dims,
            &summarises,
            &initial,
            params.state_v_first,
        )?;
        Ok(CpFwdHPlan {
            frame: Frame {
                group,
                part: part.clone(),
                dims,
                inputs: args.iter().map(|a| Signature::of(a)).collect(),
                boundary,
            },
            params: *params,
            dtype: shards[0].k.dtype(),
            ranks,
        })
    }

    /// The partition the plan runs.
    pub fn partition(&self) -> &Partition {
        &self.frame.part
    }

    /// Fresh (unwritten) outputs, per local rank: `h` of its chunks, `v_new` of its tokens (with
    /// `save_new_value`), the exit state of each piece (with `output_final_state`); a rank
    /// without pieces gets zero-row tensors, which [`CpFwdHPlan::run`] neither reads nor
    /// writes.
    pub fn alloc_outputs(&self) -> GpuResult<Vec<FwdHDeviceOutputs>> {
        let (d, p, dtype) = (self.frame.dims, &self.params, self.dtype);
        self.frame
            .group
            .ranks()
            .zip(&self.ranks)
            .map(|((_, gpu), rank)| match &rank.local {
                Some(plan) => plan.alloc_outputs(gpu),
                None => Ok(FwdHDeviceOutputs {
                    h: {
                        let [_, hv, a, b] = d.state_shape(0, p.state_v_first);
                        DeviceTensor::alloc(gpu, &[1, 0, hv, a, b], dtype)?
                    },
                    v_new: p
                        .save_new_value
                        .then(|| DeviceTensor::alloc(gpu, &[1, 0, d.hv, d.v], dtype))
                        .transpose()?,
                    final_state: d.no_states(gpu, p.output_final_state, p.state_v_first)?,
                }),
            })
            .collect()
    }

    /// Queues the recurrence of `shards` into `outs`, as [`CpFwdPlan::run`].
    pub fn run(
        &mut self,
        shards: &[FwdHTensors<'_>],
        outs: &mut [FwdHDeviceOutputs],
    ) -> GpuResult<()> {
        let group = self.frame.group;
        let args: Vec<Vec<Arg<'_>>> = shards.iter().map(fwd_h_args).collect();
        self.frame.check(&args, outs.len())?;
        for (rank, out) in self.ranks.iter().zip(outs.iter()) {
            if let Some(plan) = &rank.local {
                plan.check_outputs(out)?;
            }
        }
        for (((_, gpu), t), rank) in group.ranks().zip(shards).zip(&mut self.ranks) {
            if let Some(s) = &mut rank.summary {
                s.run(gpu, t)?;
            }
        }
        let sent: Vec<Option<&DeviceTensor>> = self
            .ranks
            .iter()
            .map(|r| r.summary.as_ref().map(|s| &s.hm))
            .collect();
        let initial: Vec<Option<&DeviceTensor>> = shards.iter().map(|t| t.initial_state).collect();
        self.frame.exchange(&sent, &initial)?;
        let each = group.ranks().zip(shards).zip(self.ranks.iter().zip(outs));
        for (i, (((_, gpu), t), (rank, out))) in each.enumerate() {
            if let Some(plan) = &rank.local {
                let call = FwdHTensors {
                    initial_state: self.frame.entering(i, t.initial_state),
                    ..*t
                };
                plan.run(gpu, &call, out)?;
            }
        }
        Ok(())
    }
}

/// Context-parallel `chunk_gated_delta_rule_fwd_h` (`conformance/spec/ops-delta-rule.md` §2) in
/// one call: the [`CpFwdHPlan`] of the shards, new outputs, one run, the ranks synchronised.
/// Returns per local rank `h` of its chunks, `v_new` of its tokens, and the exit state of each
/// piece (module docs).
pub fn cp_chunk_gated_delta_rule_fwd_h(
    group: &CpGroup,
    part: &Partition,
    shards: &[FwdHTensors<'_>],
    params: &FwdHParams,
) -> GpuResult<Vec<FwdHDeviceOutputs>> {
    let mut plan = CpFwdHPlan::new(group, part, shards, params)?;
    let mut outs = plan.alloc_outputs()?;
    plan.run(shards, &mut outs)?;
    group.synchronize()?;
    Ok(outs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_levels_ascend_to_the_tail() {
        assert_eq!(tail_levels(TAIL_CHUNKS), vec![4, 16, 32, 64]);
        assert_eq!(tail_levels(32), vec![4, 16, 32]);
        assert_eq!(tail_levels(8), vec![4, 8]);
        assert_eq!(tail_levels(4), vec![4]);
        assert_eq!(tail_levels(1), vec![1]);
        for c in 1..=64 {
            let l = tail_levels(c);
            assert!(
                l.windows(2).all(|w| w[0] < w[1]) && l.last() == Some(&c),
                "{c}: {l:?}"
            );
        }
    }
}
