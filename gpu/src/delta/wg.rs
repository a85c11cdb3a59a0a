//! The Hopper kernels of the fused paths (`delta_fwd_gdn_wg_bf16`, `delta_fwd_kda_wg_bf16`,
//! `delta_fwd_wg.cu`) and of `chunk_gated_delta_rule_fwd_h` (`chunk_gated_delta_rule_fwd_h_wg_bf16`):
//! which calls they take, their shared memory, and their parameters (TMA tensor maps of the tiles
//! they load and store, encoded on the host, then the arguments of the `mma.sync` kernel of the
//! same kind).

use super::launch::FwdHArgs;
use super::lean::{FusedArgs, GdnFusedArgs};
use crate::device::Gpu;
use crate::error::{GpuError, GpuResult};
use crate::kernels::Module;
use attn_reference::delta::Geometry;
use attn_reference::Dtype;
use cudarc::driver::{sys, DeviceRepr};

/// Dynamic shared memory of the Hopper kernels (`WgLayout`: two stages of eight 8 KiB tiles, two
/// o staging tiles, two stages' factors (3 · 64 + 4 + 128 floats), the mbarriers and 1 KiB of
/// alignment slack).
pub(crate) const WG_SMEM: usize =
    2 * 8 * 8192 + 2 * 8192 + 2 * (3 * 64 + 4 + 128) * 4 + 4 * 8 + 1024;

/// `$ATTN_GDN_WG=0`: the fused paths (GDN and KDA) on the `mma.sync` kernels even where the
/// Hopper kernels fit (plans made while it is set); for comparisons.
fn enabled() -> bool {
    std::env::var("ATTN_GDN_WG").as_deref() != Ok("0")
}

/// Whether a fused call (GDN or KDA) runs the Hopper kernels on this device ([`fits_on`] its
/// compute capability), unless `$ATTN_GDN_WG=0`.
pub(crate) fn fits(gpu: &Gpu, dtype: Dtype, geo: &Geometry) -> bool {
    enabled() && fits_on(gpu.arch(), dtype, geo)
}

/// Whether a fused call fits the Hopper kernels on a device of compute capability `arch`: their
/// module builds there (`Module::target`: sm_90a alone), bf16, `K = 128`, `V` a multiple of 64,
/// chunks of 64, at least one packed token (a tensor map has no empty dimension).
fn fits_on(arch: (i32, i32), dtype: Dtype, geo: &Geometry) -> bool {
    Module::DeltaFwdWg.target(arch).is_some()
        && dtype == Dtype::BF16
        && geo.k == 128
        && geo.v > 0
        && geo.v % 64 == 0
        && geo.bt == 64
        && geo.b * geo.t > 0
}

/// A `CUtensorMap` (128 opaque bytes, 64-byte aligned) as the kernel's `TMap`.
#[repr(C, align(64))]
#[derive(Debug, Clone, Copy)]
pub(crate) struct TensorMap([u64; 16]);

/// The bf16 tensor at `ptr` of `rows` rows of `cols` elements as 64 × 64 boxes with the 128-byte
/// swizzle (`name` for the error).
pub(crate) fn tile_map(ptr: u64, rows: usize, cols: usize, name: &str) -> GpuResult<TensorMap> {
    let mut map = sys::CUtensorMap { opaque: [0; 16] };
    let dims = [cols as u64, rows as u64];
    let strides = [(cols * 2) as u64];
    let boxes = [64u32, 64];
    let elem = [1u32, 1];
    // SAFETY: every pointer refers to a live local array of the rank the call states (2).
    let r = unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map,
            sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            2,
            ptr as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            elem.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    r.result()
        .map_err(GpuError::driver(format!("the tensor map of `{name}`")))?;
    Ok(TensorMap(map.opaque))
}

/// Mirror of `GdnWgArgs` (delta_fwd_wg.cu).
#[repr(C, align(64))]
#[derive(Debug, Clone, Copy)]
pub(crate) struct GdnWgArgs {
    pub q: TensorMap,
    pub k: TensorMap,
    pub v: TensorMap,
    pub tbh: TensorMap,
    pub tbl: TensorMap,
    pub aqk: TensorMap,
    pub o: TensorMap,
    pub a: GdnFusedArgs,
}
// SAFETY: plain `#[repr(C)]` data matching the kernel's struct (the maps 128 bytes, 64-aligned).
unsafe impl DeviceRepr for GdnWgArgs {}

impl GdnWgArgs {
    /// The maps of `a`'s tensors: `rows` packed tokens, `qk_heads` key heads and `HV` value heads
    /// of `K = 128`, `V` columns and chunks of 64.
    pub(crate) fn new(a: GdnFusedArgs, rows: usize) -> GpuResult<GdnWgArgs> {
        let (qk, hv, v) = (
            a.qk_heads as usize * 128,
            a.value_heads as usize,
            a.v_dim as usize,
        );
        Ok(GdnWgArgs {
            q: tile_map(a.q, rows, qk, "q")?,
            k: tile_map(a.k, rows, qk, "k")?,
            v: tile_map(a.v, rows, hv * v, "v")?,
            tbh: tile_map(a.tbh, rows, hv * 64, "Tb (hi)")?,
            tbl: tile_map(a.tbl, rows, hv * 64, "Tb (lo)")?,
            aqk: tile_map(a.aqk, rows, hv * 64, "Aqk")?,
            o: tile_map(a.o, rows, hv * v, "o")?,
            a,
        })
    }
}

/// Mirror of `KdaWgArgs` (delta_fwd_wg.cu).
#[repr(C, align(64))]
#[derive(Debug, Clone, Copy)]
pub(crate) struct KdaWgArgs {
    pub w: TensorMap,
    pub qg: TensorMap,
    pub kg: TensorMap,
    pub u: TensorMap,
    pub aqk: TensorMap,
    pub o: TensorMap,
    pub a: FusedArgs,
}
// SAFETY: plain `#[repr(C)]` data matching the kernel's struct (the maps 128 bytes, 64-aligned).
unsafe impl DeviceRepr for KdaWgArgs {}

impl KdaWgArgs {
    /// The maps of `a`'s tensors (the intra stage's `w, qg, kg` `[rows][HV][128]`, `u`, `o`
    /// `[rows][HV][V]`, Aqk `[rows][HV][64]`): `rows` packed tokens.
    pub(crate) fn new(a: FusedArgs, rows: usize) -> GpuResult<KdaWgArgs> {
        let (hv, v) = (a.value_heads as usize, a.v_dim as usize);
        Ok(KdaWgArgs {
            w: tile_map(a.w, rows, hv * 128, "w")?,
            qg: tile_map(a.qg, rows, hv * 128, "qg")?,
            kg: tile_map(a.kg, rows, hv * 128, "kg")?,
            u: tile_map(a.u, rows, hv * v, "u")?,
            aqk: tile_map(a.aqk, rows, hv * 64, "Aqk")?,
            o: tile_map(a.o, rows, hv * v, "o")?,
            a,
        })
    }
}

/// Mirror of `FwdHWgArgs` (delta_fwd_wg.cu): `chunk_gated_delta_rule_fwd_h` on the Hopper
/// kernel `chunk_gated_delta_rule_fwd_h_wg_bf16`.
#[repr(C, align(64))]
#[derive(Debug, Clone, Copy)]
pub(crate) struct FwdHWgArgs {
    pub w: TensorMap,
    pub k: TensorMap,
    pub u: TensorMap,
    pub h: TensorMap,
    pub vn: TensorMap,
    pub a: FwdHArgs,
}
// SAFETY: plain `#[repr(C)]` data matching the kernel's struct (the maps 128 bytes, 64-aligned).
unsafe impl DeviceRepr for FwdHWgArgs {}

impl FwdHWgArgs {
    /// The maps of `a`'s tensors: `rows` packed tokens (`B · T`), `h_rows` state rows of `h`
    /// (`B · NT · HV · K`, or `· V` with `state_v_first`), `K = 128`. Without `v_new` its map is
    /// `u`'s (the kernel stores nothing through it).
    pub(crate) fn new(a: FwdHArgs, rows: usize, h_rows: usize) -> GpuResult<FwdHWgArgs> {
        let (h, hv, v) = (a.heads as usize, a.value_heads as usize, a.v_dim as usize);
        let u = tile_map(a.u, rows, hv * v, "u")?;
        let h_cols = if a.v_first != 0 { 128 } else { v };
        Ok(FwdHWgArgs {
            w: tile_map(a.w, rows, hv * 128, "w")?,
            k: tile_map(a.k, rows, h * 128, "k")?,
            u,
            h: tile_map(a.h, h_rows, h_cols, "h")?,
            vn: if a.v_new != 0 {
                tile_map(a.v_new, rows, hv * v, "v_new")?
            } else {
                u
            },
            a,
        })
    }
}

/// Whether `chunk_gated_delta_rule_fwd_h` runs its Hopper kernel on this device: the fused
/// paths' shape ([`fits_on`]), `h_rows` state rows within a TMA coordinate (below 2^31), and
/// neither `$ATTN_GDN_WG=0` nor `$ATTN_FWD_H_WG=0` (for comparisons).
pub(crate) fn fwd_h_fits(gpu: &Gpu, dtype: Dtype, geo: &Geometry, h_rows: usize) -> bool {
    std::env::var("ATTN_FWD_H_WG").as_deref() != Ok("0")
        && fits(gpu, dtype, geo)
        && h_rows > 0
        && h_rows <= i32::MAX as usize
        && geo.b * geo.t <= i32::MAX as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo(t: usize, k: usize, v: usize, bt: usize) -> Geometry {
        Geometry {
            b: 1,
            t,
            h: 2,
            hv: 4,
            k,
            v,
            bt,
            seqs: Vec::new(),
        }
    }

    #[test]
    fn the_hopper_kernels_take_their_one_shape_on_sm90_only() {
        let bf = Dtype::BF16;
        assert!(fits_on((9, 0), bf, &geo(300, 128, 128, 64)));
        assert!(fits_on((9, 0), bf, &geo(1, 128, 64, 64)));
        assert!(fits_on((9, 0), bf, &geo(300, 128, 256, 64)));
        for (arch, dtype, g) in [
            ((8, 0), bf, geo(300, 128, 128, 64)),
            ((10, 0), bf, geo(300, 128, 128, 64)),
            ((9, 0), Dtype::F16, geo(300, 128, 128, 64)),
            ((9, 0), Dtype::F32, geo(300, 128, 128, 64)),
            ((9, 0), bf, geo(300, 64, 128, 64)),
            ((9, 0), bf, geo(300, 256, 128, 64)),
            ((9, 0), bf, geo(300, 128, 200, 64)),
            ((9, 0), bf, geo(300, 128, 60, 64)),
            ((9, 0), bf, geo(300, 128, 128, 32)),
            ((9, 0), bf, geo(0, 128, 128, 64)),
        ] {
            assert!(!fits_on(arch, dtype, &g), "{arch:?} {dtype} {g:?}");
        }
    }
}
