//! The arguments of the fused kernels (`FusedArgs`, `GdnFusedArgs` of pieces.cuh), shared by
//! `delta_fused`, `delta_fused_gdn` (delta_fwd.cu) and the Hopper kernels (delta_fwd_wg.cu).

use cudarc::driver::DeviceRepr;

/// Mirror of `FusedArgs` (pieces.cuh).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct FusedArgs {
    pub(crate) kg: u64,
    pub(crate) w: u64,
    pub(crate) qg: u64,
    pub(crate) qf: u64,
    pub(crate) u: u64,
    pub(crate) aqk: u64,
    pub(crate) lam: u64,
    pub(crate) h0: u64,
    pub(crate) pieces: u64,
    pub(crate) warm: u64,
    pub(crate) gate: u64,
    pub(crate) seqs: u64,
    pub(crate) o: u64,
    pub(crate) ht: u64,
    pub(crate) value_heads: i64,
    pub(crate) k_dim: i64,
    pub(crate) v_dim: i64,
    pub(crate) bt: i64,
    pub(crate) h0_dtype: i64,
    pub(crate) v_first: i64,
    pub(crate) npieces: i64,
    pub(crate) gate_mode: i64,
}
// SAFETY: plain `#[repr(C)]` data (every field 8 bytes) matching the kernel's struct.
unsafe impl DeviceRepr for FusedArgs {}

/// Mirror of `GdnFusedArgs` (pieces.cuh).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct GdnFusedArgs {
    pub(crate) q: u64,
    pub(crate) k: u64,
    pub(crate) v: u64,
    pub(crate) tbh: u64,
    pub(crate) tbl: u64,
    pub(crate) aqk: u64,
    pub(crate) g: u64,
    pub(crate) h0: u64,
    pub(crate) pieces: u64,
    pub(crate) warm: u64,
    pub(crate) gate: u64,
    pub(crate) o: u64,
    pub(crate) ht: u64,
    pub(crate) rqk: u64,
    pub(crate) qk_heads: i64,
    pub(crate) value_heads: i64,
    pub(crate) k_dim: i64,
    pub(crate) v_dim: i64,
    pub(crate) bt: i64,
    pub(crate) h0_dtype: i64,
    pub(crate) v_first: i64,
    pub(crate) npieces: i64,
    pub(crate) gate_mode: i64,
    pub(crate) scale: f64,
}
// SAFETY: plain `#[repr(C)]` data (every field 8 bytes) matching the kernel's struct.
unsafe impl DeviceRepr for GdnFusedArgs {}
