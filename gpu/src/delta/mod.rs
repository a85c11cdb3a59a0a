//! The gated delta-rule state recurrence on the GPU (`conformance/spec/ops-delta-rule.md` §2-§5):
//! [`chunk_gated_delta_rule_fwd_h`](fwd_h), its affine summary [`fwd_h_pre_scan`](prescan), the
//! summary chain [`fwd_h_merge`](merge), and the intra-card split built from them
//! ([`chunk_gated_delta_rule_fwd_h_split`](split), with its [`policy`] and the device-side
//! [`truncation`] policy of warm-up pieces).
//!
//! The whole forwards [`kda_fwd`], [`gdn_fwd`] are in [`forward`], their intra stage and the
//! [`kda_intra`] op in [`intra`] (the fused KDA path's persistent intra kernel in `intra_pipe`).
//!
//! bf16/f16 inputs run on tensor cores (`mma.sync`, fp32 accumulation, the rounding points of
//! `conformance/spec/ops-delta-rule.md` §2.5); float32 inputs run an IEEE fp32 FMA kernel (spec
//! threshold 1e-5); float64 main data is refused with a typed error naming the argument and dtype
//! (`conformance/spec/ops-delta-rule.md` §1.4 allows it).

pub mod forward;
pub mod fwd_h;
pub mod intra;
mod intra_pipe;
mod launch;
mod lean;
pub mod merge;
mod pieces;
pub mod policy;
pub mod prescan;
pub mod split;
pub mod truncation;
mod wg;

pub use forward::{
    fused_choice, gdn_fwd, kda_fwd, piece_rows, split_pieces, DeltaFwdDeviceOutputs, DeltaFwdPlan,
    DeltaFwdWorkspace, ForwardPath, ForwardTensors, FusedChoice, IntraTiles, SplitRule,
    EXACT_FALLBACK_CHUNKS,
};
pub use fwd_h::{
    check_fwd_h, chunk_gated_delta_rule_fwd_h, FwdHDeviceOutputs, FwdHMeta, FwdHPlan, FwdHTensors,
};
pub use intra::{kda_intra, KdaIntraDeviceOutputs, KdaIntraTensors};
pub use launch::{kernel_choice, KernelChoice, Workload};
pub use merge::{check_fwd_h_merge, fwd_h_merge, FwdHMergeDeviceOutputs, FwdHMergePlan};
pub use policy::{split_policy, SplitDecision, SplitQuery};
pub use prescan::{check_fwd_h_pre_scan, fwd_h_pre_scan, FwdHPreScanPlan};
pub use split::{
    chunk_gated_delta_rule_fwd_h_split, FwdHSplitPlan, FwdHSplitWorkspace, SplitMode, SplitStage,
};
pub use truncation::{
    BoundGates, TruncationInputs, TruncationParams, TruncationPolicy, MAX_WARMUP_CHUNKS,
};
