//! `#[repr(C)]` mirrors of the decode kernels' parameter structs (every field 8 bytes).

use cudarc::driver::DeviceRepr;

/// Mirror of `UpdateArgs` (kv_cache_update.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct UpdateArgs {
    pub k_cache: u64,
    pub v_cache: u64,
    pub k: u64,
    pub v: u64,
    pub seqlens: u64,
    pub batch_idx: u64,
    pub flag: u64,
    pub l_new: i64,
    pub h_kv: i64,
    pub d: i64,
    pub s: i64,
    pub b_cache: i64,
    pub stride_b: i64,
    pub stride_h: i64,
    pub stride_s: i64,
    pub esize: i64,
}
// SAFETY: plain `#[repr(C)]` data matching the kernel's struct.
unsafe impl DeviceRepr for UpdateArgs {}

/// Mirror of `DecodeArgs` (decode_attention.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct DecodeArgs {
    pub q: u64,
    pub k_cache: u64,
    pub v_cache: u64,
    pub k_new: u64,
    pub v_new: u64,
    pub seqlens: u64,
    pub batch_idx: u64,
    pub o: u64,
    pub lse: u64,
    pub part_o: u64,
    pub part_lse: u64,
    pub counters: u64,
    pub flag: u64,
    pub lq: i64,
    pub h: i64,
    pub h_kv: i64,
    pub d: i64,
    pub s: i64,
    pub b_cache: i64,
    pub l_new: i64,
    pub stride_b: i64,
    pub stride_h: i64,
    pub stride_s: i64,
    pub chunk: i64,
    pub nsplit: i64,
    pub causal: i64,
    pub scale_log2: f64,
}
// SAFETY: as above.
unsafe impl DeviceRepr for DecodeArgs {}
