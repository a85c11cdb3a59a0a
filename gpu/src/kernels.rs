//! The CUDA sources, embedded at build time and assembled per module: every module is the shared
//! headers followed by its op's `.cu` file (NVRTC gets no include files).

const COMMON: &str = include_str!("../kernels/common.cuh");
const GATE: &str = include_str!("../kernels/gate.cuh");
const STRIDED: &str = include_str!("../kernels/strided.cuh");
const ROWS: &str = include_str!("../kernels/rows.cuh");
const TILE: &str = include_str!("../kernels/tile.cuh");
const NSA: &str = include_str!("../kernels/nsa.cuh");
const NSA_ATTEND: &str = include_str!("../kernels/nsa_attend.cuh");
const DECODE: &str = include_str!("../kernels/decode.cuh");
const FWD_H: &str = include_str!("../kernels/fwd_h.cuh");
const INTRA_ARGS: &str = include_str!("../kernels/intra_args.cuh");
const INTRA_SOLVE: &str = include_str!("../kernels/intra_solve.cuh");
const PIECES: &str = include_str!("../kernels/pieces.cuh");

/// One NVRTC module: a name (the op id) and its `.cu` file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Module {
    Cumsum,
    ChunkLocalCumsum,
    ChunkGlobalCumsum,
    KdaGate,
    KdaGateChunkCumsum,
    NsaCompressKv,
    NsaGateCombine,
    NsaSelectBlocks,
    NsaCompressionAttention,
    NsaSelectionAttention,
    NsaFwd,
    KvCacheUpdate,
    DecodeAttention,
    ReadStream,
    ChunkGatedDeltaRuleFwdH,
    FwdHPreScan,
    FwdHMerge,
    FwdHSplit,
    FwdHTruncation,
    KdaIntra,
    KdaIntraPipe,
    DeltaFwd,
    DeltaFwdWg,
}

impl Module {
    pub fn name(self) -> &'static str {
        match self {
            Module::Cumsum => "cumsum",
            Module::ChunkLocalCumsum => "chunk_local_cumsum",
            Module::ChunkGlobalCumsum => "chunk_global_cumsum",
            Module::KdaGate => "kda_gate",
            Module::KdaGateChunkCumsum => "kda_gate_chunk_cumsum",
            Module::NsaCompressKv => "nsa_compress_kv",
            Module::NsaGateCombine => "nsa_gate_combine",
            Module::NsaSelectBlocks => "nsa_select_blocks",
            Module::NsaCompressionAttention => "nsa_compression_attention",
            Module::NsaSelectionAttention => "nsa_selection_attention",
            Module::NsaFwd => "nsa_fwd",
            Module::KvCacheUpdate => "kv_cache_update",
            Module::DecodeAttention => "decode_attention",
            Module::ReadStream => "read_stream",
            Module::ChunkGatedDeltaRuleFwdH => "chunk_gated_delta_rule_fwd_h",
            Module::FwdHPreScan => "fwd_h_pre_scan",
            Module::FwdHMerge => "fwd_h_merge",
            Module::FwdHSplit => "chunk_gated_delta_rule_fwd_h_split",
            Module::FwdHTruncation => "fwd_h_truncation",
            Module::KdaIntra => "kda_intra",
            Module::KdaIntraPipe => "kda_intra_pipe",
            Module::DeltaFwd => "delta_fwd",
            Module::DeltaFwdWg => "delta_fwd_wg",
        }
    }

    fn op_source(self) -> &'static str {
        match self {
            Module::Cumsum => include_str!("../kernels/cumsum.cu"),
            Module::ChunkLocalCumsum => include_str!("../kernels/chunk_local_cumsum.cu"),
            Module::ChunkGlobalCumsum => include_str!("../kernels/chunk_global_cumsum.cu"),
            Module::KdaGate => include_str!("../kernels/kda_gate.cu"),
            Module::KdaGateChunkCumsum => include_str!("../kernels/kda_gate_chunk_cumsum.cu"),
            Module::NsaCompressKv => include_str!("../kernels/nsa_compress_kv.cu"),
            Module::NsaGateCombine => include_str!("../kernels/nsa_gate_combine.cu"),
            Module::NsaSelectBlocks => include_str!("../kernels/nsa_select_blocks.cu"),
            Module::NsaCompressionAttention => {
                include_str!("../kernels/nsa_compression_attention.cu")
            }
            Module::NsaSelectionAttention => include_str!("../kernels/nsa_selection_attention.cu"),
            Module::NsaFwd => include_str!("../kernels/nsa_fwd.cu"),
            Module::KvCacheUpdate => include_str!("../kernels/kv_cache_update.cu"),
            Module::DecodeAttention => include_str!("../kernels/decode_attention.cu"),
            Module::ReadStream => include_str!("../kernels/read_stream.cu"),
            Module::ChunkGatedDeltaRuleFwdH => {
                include_str!("../kernels/chunk_gated_delta_rule_fwd_h.cu")
            }
            Module::FwdHPreScan => include_str!("../kernels/fwd_h_pre_scan.cu"),
            Module::FwdHMerge => include_str!("../kernels/fwd_h_merge.cu"),
            Module::FwdHSplit => include_str!("../kernels/fwd_h_split.cu"),
            Module::FwdHTruncation => include_str!("../kernels/fwd_h_truncation.cu"),
            Module::KdaIntra => include_str!("../kernels/kda_intra.cu"),
            Module::KdaIntraPipe => include_str!("../kernels/kda_intra_pipe.cu"),
            Module::DeltaFwd => include_str!("../kernels/delta_fwd.cu"),
            Module::DeltaFwdWg => include_str!("../kernels/delta_fwd_wg.cu"),
        }
    }

    /// The NVRTC target of this module on a device of compute capability `arch`:
    /// `compute_90a` for the Hopper-only module (`wgmma`, TMA, `setmaxnreg`: sm_90a alone),
    /// `compute_XY` for the others; `None` where the module has no build for `arch`.
    pub fn target(self, arch: (i32, i32)) -> Option<String> {
        match self {
            Module::DeltaFwdWg => (arch == (9, 0)).then(|| "compute_90a".to_string()),
            _ => Some(format!("compute_{}{}", arch.0, arch.1)),
        }
    }

    /// The complete translation unit handed to NVRTC.
    pub fn source(self) -> String {
        let mut s = String::from(COMMON);
        match self {
            Module::ChunkGatedDeltaRuleFwdH
            | Module::FwdHPreScan
            | Module::FwdHMerge
            | Module::FwdHSplit
            | Module::FwdHTruncation => {
                s.push_str(FWD_H);
                s.push_str(self.op_source());
                return s;
            }
            Module::NsaCompressionAttention | Module::NsaSelectionAttention | Module::NsaFwd => {
                s.push_str(NSA_ATTEND);
                s.push_str(self.op_source());
                return s;
            }
            Module::KvCacheUpdate | Module::DecodeAttention => s.push_str(DECODE),
            Module::ReadStream => {}
            Module::KdaIntra | Module::KdaIntraPipe | Module::DeltaFwd | Module::DeltaFwdWg => {
                // the gate of gate.cuh (DeltaFwd: kda_warm_bounds) and the dtype-coded loads of
                // fwd_h.cuh; the intra kernels' shared arguments and solve; the fused kernels'
                // pieces
                s.push_str(GATE);
                s.push_str(FWD_H);
                if matches!(self, Module::DeltaFwd | Module::DeltaFwdWg) {
                    s.push_str(PIECES);
                } else {
                    s.push_str(INTRA_ARGS);
                    s.push_str(INTRA_SOLVE);
                }
            }
            _ => {
                s.push_str(GATE);
                s.push_str(STRIDED);
            }
        }
        match self {
            Module::Cumsum => s.push_str(ROWS),
            Module::ChunkLocalCumsum | Module::KdaGateChunkCumsum => s.push_str(TILE),
            Module::NsaCompressKv | Module::NsaGateCombine | Module::NsaSelectBlocks => {
                s.push_str(NSA)
            }
            _ => {}
        }
        s.push_str(self.op_source());
        s
    }

    pub const ALL: [Module; 23] = [
        Module::Cumsum,
        Module::ChunkLocalCumsum,
        Module::ChunkGlobalCumsum,
        Module::KdaGate,
        Module::KdaGateChunkCumsum,
        Module::NsaCompressKv,
        Module::NsaGateCombine,
        Module::NsaSelectBlocks,
        Module::NsaCompressionAttention,
        Module::NsaSelectionAttention,
        Module::NsaFwd,
        Module::KvCacheUpdate,
        Module::DecodeAttention,
        Module::ReadStream,
        Module::ChunkGatedDeltaRuleFwdH,
        Module::FwdHPreScan,
        Module::FwdHMerge,
        Module::FwdHSplit,
        Module::FwdHTruncation,
        Module::KdaIntra,
        Module::KdaIntraPipe,
        Module::DeltaFwd,
        Module::DeltaFwdWg,
    ];
}
