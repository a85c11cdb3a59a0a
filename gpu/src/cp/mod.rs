//! Context parallelism across the GPUs of a host (NCCL): the delta-rule forwards of
//! `conformance/spec/ops-delta-rule.md` (`chunk_gated_delta_rule_fwd_h` §2, `kda_fwd` §6,
//! `gdn_fwd` §8) on sequences longer than one GPU, cut over `R` ranks at chunk boundaries.
//!
//! - [`partition`]: how the packed tokens are cut (balanced by chunks, short sequences whole);
//! - [`comm`]: the group of ranks and its NCCL communicators (one process driving every GPU of
//!   the host, or one rank per process);
//! - [`run`]: the ops (exact summaries, one all-gather, the merge, the local single-GPU op),
//!   as persistent plans ([`CpFwdPlan`], [`CpFwdHPlan`]: made once, run many times) and
//!   one-call functions;
//! - [`shard`]: host arrays to shards and back;
//! - [`host`]: the whole host input through an op in one call (partition, scatter, run,
//!   gather), for callers that hold it on the host (`attn-conform verify --gpus N`).
//!
//! ```ignore
//! let group = CpGroup::open(4)?;                                  // GPUs 0..4, NCCL
//! let part = Partition::balanced(&cu_seqlens, 64, 4, DEFAULT_MIN_PIECE_CHUNKS)?;
//! let q = scatter_tokens(&group, &part, "q", q_host.view())?;     // ... k, v, g, beta
//! let h0 = scatter_states(&group, &part, "initial_state", h0_host.view())?;
//! let shards: Vec<ForwardTensors> = /* rank i: q[i], k[i], ..., initial_state: Some(&h0[i]) */;
//! let out = cp_kda_fwd(&group, &part, &shards, &params, ForwardPath::Auto)?;
//! // or, for repeated calls of the same shapes: plan once, run many times
//! let mut plan = CpFwdPlan::kda(&group, &part, &shards, &params, ForwardPath::Auto)?;
//! let mut out = plan.alloc_outputs()?;
//! plan.run(&shards, &mut out)?;                                   // queued
//! group.synchronize()?;
//! let o: ArrayD<bf16> = gather_tokens(&group, "o", &out.iter().map(|o| &o.o).collect::<Vec<_>>())?;
//! ```

pub mod comm;
pub mod host;
pub mod partition;
pub mod run;
pub mod shard;

pub use comm::{CpGroup, CpId};
pub use host::{
    cp_forward_host, cp_fwd_h_host, CpForward, HostForwardInputs, HostForwardOutputs,
    HostFwdHInputs, HostFwdHOutputs, HostTensor,
};
pub use partition::{Partition, Piece, Shard, DEFAULT_MIN_PIECE_CHUNKS};
pub use run::{
    cp_chunk_gated_delta_rule_fwd_h, cp_gdn_fwd, cp_kda_fwd, tail_levels, CpFwdHPlan, CpFwdPlan,
    CpPhaseTimes, LocalChoice, SentSummary, SHORT_TAIL_CHUNKS, TAIL_CHUNKS,
};
pub use shard::{gather_final_states, gather_tokens, scatter_states, scatter_tokens};
