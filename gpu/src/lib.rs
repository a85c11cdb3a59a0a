//! `attn-gpu`: CUDA kernels for the operations of `attn-reference`, compiled at run time with
//! NVRTC for the device's own architecture and cached per process. The crate builds, and its
//! callers test, on machines without CUDA: opening a GPU there returns
//! [`GpuError::Unavailable`].
//!
//! Every op validates its inputs with the reference's `validate_*` rules before any launch,
//! checks the launch, and (unless [`Gpu::set_checked`] turned it off) the kernel's completion.
//! Indexing is 64-bit throughout.

pub mod cp;
pub mod cumsum;
pub mod decode;
pub mod delta;
pub mod device;
pub mod error;
pub mod gate;
pub mod graph;
pub mod kernels;
mod knobs;
pub mod nsa;
mod params;
pub mod read_stream;
pub mod seq_scan;
mod strided;
pub mod tensor;
pub mod tile;

pub use cumsum::{cumsum, cumsum_into};
pub use decode::{
    decode_attention, decode_attention_into, decode_step, kv_cache_update, CacheLayout, CacheRows,
    DecodeFlag, DecodeOutputs, DecodeParams, DecodeWorkspace, KvCache, NewTokens,
};
pub use delta::{
    chunk_gated_delta_rule_fwd_h, chunk_gated_delta_rule_fwd_h_split, fwd_h_merge, fwd_h_pre_scan,
    gdn_fwd, kda_fwd, kda_intra, DeltaFwdDeviceOutputs, ForwardPath, ForwardTensors,
    FwdHDeviceOutputs, FwdHTensors, KdaIntraTensors, SplitMode,
};
pub use device::Gpu;
pub use error::{GpuError, GpuResult};
pub use gate::{
    kda_gate, kda_gate_chunk_cumsum, kda_gate_chunk_cumsum_into, kda_gate_into, GateInputs,
};
pub use graph::{capture, CapturedGraph};
pub use nsa::{
    nsa_compress_kv, nsa_compress_kv_into, nsa_compression_attention,
    nsa_compression_attention_into, nsa_fwd, nsa_gate_combine, nsa_gate_combine_into,
    nsa_select_blocks, nsa_select_blocks_into, nsa_selection_attention,
    nsa_selection_attention_into, CmpAttnInputs, CmpAttnParams, CombineInputs, CompressInputs,
    FwdInputs, FwdOut, GateForm, SelAttnInputs, SelectInputs,
};
pub use read_stream::{read_stream, READ_UNROLLS};
pub use seq_scan::{
    chunk_global_cumsum, chunk_global_cumsum_into, chunk_local_cumsum, chunk_local_cumsum_into,
};
pub use tensor::{DeviceTensor, HostElem};
