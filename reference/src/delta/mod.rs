//! The gated delta rule family (`conformance/spec/ops-delta-rule.md`): the chunked state recurrence
//! `chunk_gated_delta_rule_fwd_h`, its affine summaries `fwd_h_pre_scan` / `fwd_h_merge` and the
//! intra-card split `chunk_gated_delta_rule_fwd_h_split`, the KDA intra stage `kda_intra`, and
//! the full forwards `kda_fwd` (Kimi Delta Attention) and `gdn_fwd` (Gated DeltaNet).
//!
//! Layout: sequence tensors `[B, T, H, D]`; value head `hv` reads key head
//! `kh(hv) = hv / (HV / H)`; a state `S` is `K × V` (key-first), stored `Sᵀ` with
//! `state_v_first`. Every op is computed independently per (sequence, value head), in parallel
//! with rayon.

pub mod bound;
mod check;
mod chunk;
pub mod fwd_h;
pub mod gdn;
pub mod intra;
pub mod kda;
pub mod merge;
mod prep;
pub mod prescan;
pub mod split;

pub use bound::{truncation_log_bound, LogGates};
pub use check::{validate_delta_dtypes, DeltaDtypes, Geometry};
pub use fwd_h::{
    chunk_gated_delta_rule_fwd_h, validate_chunk_gated_delta_rule_fwd_h, FwdHInputs, FwdHOutputs,
    FwdHParams, FwdHShapes,
};
pub use gdn::{
    gdn_fwd, gdn_fwd_chunked, validate_gdn_fwd, GdnFwdInputs, GdnFwdParams, GdnFwdShapes,
};
pub use intra::{
    kda_intra, validate_kda_intra, KdaIntraInputs, KdaIntraOutputs, KdaIntraParams, KdaIntraShapes,
};
pub use kda::{
    kda_fwd, kda_fwd_chunked, validate_kda_fwd, KdaFwdInputs, KdaFwdParams, KdaFwdShapes,
};
pub use merge::{
    fwd_h_merge, validate_fwd_h_merge, FwdHMergeInputs, FwdHMergeOutputs, FwdHMergeParams,
    FwdHMergeShapes, MergePlan,
};
pub use prep::DeltaFwdOutputs;
pub use prescan::{
    fwd_h_pre_scan, validate_fwd_h_pre_scan, FwdHPreScanInputs, FwdHPreScanOutputs,
    FwdHPreScanParams,
};
pub use split::{
    auto_subseq_cu_seqlens, chunk_gated_delta_rule_fwd_h_split, subseq_from_counts, subseq_offsets,
    validate_chunk_gated_delta_rule_fwd_h_split, validate_warmup_chunks, FwdHSplitInputs,
    SplitPlan, DEFAULT_NUM_SMS,
};

/// The largest key dimension of every op here (FLA holds the state as at most four 64-row
/// blocks).
pub const MAX_K: usize = 256;
