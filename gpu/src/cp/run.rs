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
//!    last `K` at `M`);
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
//! The boundary stage (1-3) is [`boundary_states`]: a warm-up variant
//! (`conformance/spec/ops-delta-rule.md` §5.9-5.10: the preceding rank's last chunks fetched
//! instead of summaries, where the decay bound allows) replaces it and nothing else.
//!
//! Every check (ranks against the group, each shard's token count against the partition, shapes
//! and dtypes by the single-GPU validation of every rank's local call) runs before any kernel
//! on any GPU.

use super::comm::CpGroup;
use super::partition::{Partition, Piece, Shard};
use super::shard::{pad_last_axis, select_rows, token_rows, zero, zero_identity};
use crate::delta::forward::{DeltaFwdDeviceOutputs, DeltaFwdPlan, ForwardPath, ForwardTensors};
use crate::delta::fwd_h::{FwdHDeviceOutputs, FwdHPlan, FwdHTensors};
use crate::delta::merge::FwdHMergePlan;
use crate::delta::prescan::fwd_h_pre_scan;
use crate::device::Gpu;
use crate::error::GpuResult;
use crate::tensor::DeviceTensor;
use attn_reference::delta::{
    FwdHMergeParams, FwdHParams, FwdHPreScanParams, GdnFwdParams, KdaFwdParams,
};
use attn_reference::{Dtype, Error};
use std::ops::Deref;

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
}

/// A tensor borrowed whole or a copied part of it.
enum Part<'a> {
    Whole(&'a DeviceTensor),
    Copied(DeviceTensor),
}

impl Deref for Part<'_> {
    type Target = DeviceTensor;
    fn deref(&self) -> &DeviceTensor {
        match self {
            Part::Whole(t) => t,
            Part::Copied(t) => t,
        }
    }
}

/// The token rows of `piece` of `t` (the whole tensor when the piece is the whole shard).
fn piece_rows<'a>(gpu: &Gpu, t: &'a DeviceTensor, piece: &Piece) -> GpuResult<Part<'a>> {
    if piece.start == 0 && t.shape().get(1) == Some(&piece.len) {
        Ok(Part::Whole(t))
    } else {
        token_rows(gpu, t, piece.start, piece.len).map(Part::Copied)
    }
}

/// Host checks of a call: the partition's ranks against the group, one input per local rank,
/// the chunk size, and every named token tensor of every rank against its shard.
fn check_call(
    group: &CpGroup,
    part: &Partition,
    chunk_size: i64,
    tokens: &[Vec<(&str, &DeviceTensor)>],
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
    if tokens.len() != local.len() {
        return Err(Error::shape(
            "shards",
            format!("one input per local rank ({})", local.len()),
            [tokens.len()],
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
    for (&r, named) in local.iter().zip(tokens) {
        let want = part.shard(r).tokens();
        for &(arg, t) in named {
            if t.shape().len() < 3 || t.shape()[0] != 1 || t.shape()[1] != want {
                return Err(Error::shape(
                    format!("{arg} (rank {r})"),
                    format!("[1, {want}, ...]: the tokens of the rank's shard"),
                    t.shape(),
                )
                .into());
            }
        }
    }
    Ok(())
}

/// Steps 2-3 of the module docs: all-gathers the summaries `hm[i]` (`[1, HV, K, V + K]` of local
/// rank `i`'s continuing piece, `None` where it has none) and merges, for every local rank whose
/// first piece continues, its pieces' initial states `[P_r, HV, K, V]` (`state_v_first`: `[..,
/// V, K]`) in the state dtype; `None` where the rank's own `initial_state` applies unchanged.
fn boundary_states(
    group: &CpGroup,
    part: &Partition,
    dims: Dims,
    hm: Vec<Option<DeviceTensor>>,
    initial: &[Option<&DeviceTensor>],
    state_v_first: bool,
) -> GpuResult<Vec<Option<DeviceTensor>>> {
    let local = group.local_ranks();
    let anyone_continues = part.shards().iter().any(|s| s.continuing().is_some());
    if !anyone_continues {
        return Ok(local.iter().map(|_| None).collect());
    }
    let slot = [1, dims.hv, dims.k, dims.v + dims.k];
    let send = group
        .ranks()
        .zip(hm)
        .map(|((_, gpu), s)| match s {
            Some(s) => Ok(s),
            None => {
                let mut t = DeviceTensor::alloc(gpu, &slot, dims.state)?;
                zero(gpu, &mut t)?;
                Ok(t)
            }
        })
        .collect::<GpuResult<Vec<_>>>()?;
    let mut recv = group
        .ranks()
        .map(|(_, gpu)| {
            DeviceTensor::alloc(gpu, &[part.ranks(), slot[1], slot[2], slot[3]], dims.state)
        })
        .collect::<GpuResult<Vec<_>>>()?;
    let send_refs: Vec<&DeviceTensor> = send.iter().collect();
    group.all_gather(&send_refs, &mut recv)?;
    let mut out = Vec::with_capacity(local.len());
    for (i, (r, gpu)) in group.ranks().enumerate() {
        let chain = part.chain(r);
        if chain.is_empty() {
            out.push(None);
            continue;
        }
        let summaries = select_rows(gpu, &recv[i], &chain)?;
        let pieces = part.shard(r).pieces.len() as i64;
        let mut offsets = vec![0, chain.len() as i64];
        offsets.extend(std::iter::repeat_n(chain.len() as i64, pieces as usize - 1));
        let params = FwdHMergeParams {
            state_v_first,
            output_final_state: true,
        };
        let plan = FwdHMergePlan::new(gpu, &summaries, initial[i], &offsets, &params)?;
        let mut merged = plan.alloc_outputs(gpu)?;
        plan.run(gpu, &summaries, initial[i], &mut merged)?;
        out.push(merged.final_state);
    }
    Ok(out)
}

/// Context-parallel `chunk_gated_delta_rule_fwd_h` (`conformance/spec/ops-delta-rule.md` §2):
/// `shards[i]` holds local rank `i`'s token rows of `k, w, u, g, gk` (`[1, T_r, ...]`) and, as
/// its `initial_state`, the rows `[P_r, HV, K, V]` of its pieces' sequences
/// ([`super::scatter_states`]). Returns per local rank `h` of its chunks, `v_new` of its tokens,
/// and the exit state of each piece (module docs).
pub fn cp_chunk_gated_delta_rule_fwd_h(
    group: &CpGroup,
    part: &Partition,
    shards: &[FwdHTensors<'_>],
    params: &FwdHParams,
) -> GpuResult<Vec<FwdHDeviceOutputs>> {
    let named: Vec<Vec<(&str, &DeviceTensor)>> = shards
        .iter()
        .map(|t| {
            let mut v = vec![("k", t.k), ("w", t.w), ("u", t.u)];
            v.extend(t.g.map(|g| ("g", g)));
            v.extend(t.gk.map(|g| ("gk", g)));
            v
        })
        .collect();
    check_call(group, part, params.chunk_size, &named)?;
    // every rank's local call validated before any launch
    let mut plans = Vec::new();
    for ((r, gpu), t) in group.ranks().zip(shards) {
        let s = part.shard(r);
        plans.push(match s.pieces.is_empty() {
            true => None,
            false => Some(FwdHPlan::new(gpu, t, Some(&s.cu_seqlens()), params)?),
        });
    }
    let dims = shards.first().map(|t| Dims::of(t.k, t.u));
    let Some(dims) = dims else {
        return Ok(Vec::new());
    };
    let mut hm = Vec::new();
    for ((r, gpu), t) in group.ranks().zip(shards) {
        hm.push(match part.shard(r).continuing() {
            Some(p) => Some(fwd_h_summary(gpu, t, p, params.chunk_size)?),
            None => None,
        });
    }
    let initial: Vec<Option<&DeviceTensor>> = shards.iter().map(|t| t.initial_state).collect();
    let entering = boundary_states(group, part, dims, hm, &initial, params.state_v_first)?;
    let mut outs = Vec::new();
    for (((_, gpu), t), (plan, h0)) in group.ranks().zip(shards).zip(plans.iter().zip(&entering)) {
        let mut t = *t;
        if let Some(h0) = h0 {
            t.initial_state = Some(h0);
        }
        outs.push(match plan {
            Some(plan) => {
                let mut out = plan.alloc_outputs(gpu)?;
                plan.run(gpu, &t, &mut out)?;
                out
            }
            None => empty_fwd_h(gpu, dims, t.k.dtype(), params)?,
        });
    }
    group.synchronize()?;
    Ok(outs)
}

/// `[b | M]` of `piece` by `fwd_h_pre_scan` on its rows.
fn fwd_h_summary(
    gpu: &Gpu,
    t: &FwdHTensors<'_>,
    piece: &Piece,
    chunk_size: i64,
) -> GpuResult<DeviceTensor> {
    let k = piece_rows(gpu, t.k, piece)?;
    let w = piece_rows(gpu, t.w, piece)?;
    let u = piece_rows(gpu, t.u, piece)?;
    let g = t.g.map(|g| piece_rows(gpu, g, piece)).transpose()?;
    let gk = t.gk.map(|g| piece_rows(gpu, g, piece)).transpose()?;
    let mut tail = FwdHTensors::new(&k, &w, &u);
    tail.g = g.as_deref();
    tail.gk = gk.as_deref();
    fwd_h_pre_scan(gpu, &tail, None, &FwdHPreScanParams { chunk_size })
}

/// The outputs of a rank without pieces.
fn empty_fwd_h(gpu: &Gpu, d: Dims, dtype: Dtype, p: &FwdHParams) -> GpuResult<FwdHDeviceOutputs> {
    let h = if p.state_v_first {
        [1, 0, d.hv, d.v, d.k]
    } else {
        [1, 0, d.hv, d.k, d.v]
    };
    Ok(FwdHDeviceOutputs {
        h: DeviceTensor::alloc(gpu, &h, dtype)?,
        v_new: p
            .save_new_value
            .then(|| DeviceTensor::alloc(gpu, &[1, 0, d.hv, d.v], dtype))
            .transpose()?,
        final_state: p
            .output_final_state
            .then(|| DeviceTensor::alloc(gpu, &d.state_shape(0, p.state_v_first), d.state))
            .transpose()?,
    })
}

/// Which forward, with its parameters.
#[derive(Debug, Clone, Copy)]
enum Op {
    Kda(KdaFwdParams),
    Gdn(GdnFwdParams),
}

impl Op {
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

/// `[b | M]` of `piece` by the forward itself on its rows, with values `[v | 0]` from `[0 | I]`:
/// the final state's first `V` columns are the exit state from zero (`b`), the last `K` the
/// product of the piece's transition maps (`M`).
fn forward_summary(
    gpu: &Gpu,
    op: Op,
    t: &ForwardTensors<'_>,
    piece: &Piece,
    dims: Dims,
    path: ForwardPath,
) -> GpuResult<DeviceTensor> {
    let q = piece_rows(gpu, t.q, piece)?;
    let k = piece_rows(gpu, t.k, piece)?;
    let g = piece_rows(gpu, t.g, piece)?;
    let beta = piece_rows(gpu, t.beta, piece)?;
    let v = piece_rows(gpu, t.v, piece)?;
    let v = pad_last_axis(gpu, &v, dims.k)?;
    let h0 = zero_identity(gpu, dims.hv, dims.k, dims.v, dims.state)?;
    let tail = ForwardTensors {
        initial_state: Some(&h0),
        a_log: t.a_log,
        dt_bias: t.dt_bias,
        ..ForwardTensors::new(&q, &k, &v, &g, &beta)
    };
    let op = op.summary();
    let plan = op.plan(gpu, &tail, None, path)?;
    let mut ws = plan.alloc_workspace(gpu)?;
    let mut out = plan.alloc_outputs(gpu)?;
    plan.run(gpu, &tail, &mut ws, &mut out)?;
    out.final_state.ok_or_else(|| {
        Error::missing("final_state", "the summary run's final state", "none").into()
    })
}

fn cp_forward(
    group: &CpGroup,
    part: &Partition,
    shards: &[ForwardTensors<'_>],
    op: Op,
    path: ForwardPath,
) -> GpuResult<Vec<DeltaFwdDeviceOutputs>> {
    let (chunk_size, output_final_state, state_v_first) = op.flags();
    let named: Vec<Vec<(&str, &DeviceTensor)>> = shards
        .iter()
        .map(|t| {
            vec![
                ("q", t.q),
                ("k", t.k),
                ("v", t.v),
                ("g", t.g),
                ("beta", t.beta),
            ]
        })
        .collect();
    check_call(group, part, chunk_size, &named)?;
    let mut plans = Vec::new();
    for ((r, gpu), t) in group.ranks().zip(shards) {
        let s: &Shard = part.shard(r);
        plans.push(match s.pieces.is_empty() {
            true => None,
            false => Some(op.plan(gpu, t, Some(&s.cu_seqlens()), path)?),
        });
    }
    let Some(dims) = shards.first().map(|t| Dims::of(t.k, t.v)) else {
        return Ok(Vec::new());
    };
    let mut hm = Vec::new();
    for ((r, gpu), t) in group.ranks().zip(shards) {
        hm.push(match part.shard(r).continuing() {
            Some(p) => Some(forward_summary(gpu, op, t, p, dims, path)?),
            None => None,
        });
    }
    let initial: Vec<Option<&DeviceTensor>> = shards.iter().map(|t| t.initial_state).collect();
    let entering = boundary_states(group, part, dims, hm, &initial, state_v_first)?;
    let mut outs = Vec::new();
    for (((_, gpu), t), (plan, h0)) in group.ranks().zip(shards).zip(plans.iter().zip(&entering)) {
        let mut t = *t;
        if let Some(h0) = h0 {
            t.initial_state = Some(h0);
        }
        outs.push(match plan {
            Some(plan) => {
                let mut ws = plan.alloc_workspace(gpu)?;
                let mut out = plan.alloc_outputs(gpu)?;
                plan.run(gpu, &t, &mut ws, &mut out)?;
                out
            }
            None => DeltaFwdDeviceOutputs {
                o: DeviceTensor::alloc(gpu, &[1, 0, dims.hv, dims.v], t.q.dtype())?,
                final_state: output_final_state
                    .then(|| {
                        DeviceTensor::alloc(gpu, &dims.state_shape(0, state_v_first), dims.state)
                    })
                    .transpose()?,
            },
        });
    }
    group.synchronize()?;
    Ok(outs)
}

/// Context-parallel `kda_fwd` (`conformance/spec/ops-delta-rule.md` §6): `shards[i]` holds local
/// rank `i`'s token rows of `q, k, v, g, beta` (`[1, T_r, ...]`), its pieces' rows of
/// `initial_state` ([`super::scatter_states`]) and `A_log`, `dt_bias` whole. Every option of the
/// single-GPU op applies. Returns per local rank `o` of its tokens and, with
/// `output_final_state`, the exit state of each of its pieces (module docs).
pub fn cp_kda_fwd(
    group: &CpGroup,
    part: &Partition,
    shards: &[ForwardTensors<'_>],
    p: &KdaFwdParams,
    path: ForwardPath,
) -> GpuResult<Vec<DeltaFwdDeviceOutputs>> {
    cp_forward(group, part, shards, Op::Kda(*p), path)
}

/// Context-parallel `gdn_fwd` (`conformance/spec/ops-delta-rule.md` §8), as [`cp_kda_fwd`].
pub fn cp_gdn_fwd(
    group: &CpGroup,
    part: &Partition,
    shards: &[ForwardTensors<'_>],
    p: &GdnFwdParams,
    path: ForwardPath,
) -> GpuResult<Vec<DeltaFwdDeviceOutputs>> {
    cp_forward(group, part, shards, Op::Gdn(*p), path)
}
