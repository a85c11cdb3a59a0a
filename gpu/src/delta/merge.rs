//! `fwd_h_merge` on the GPU (`conformance/spec/ops-delta-rule.md` §4): for every sequence `n` and
//! value head, from `X = initial_state[n]` (or 0), `initial_states[j] = X` and `X ← M_j X + b_j`
//! over its sub-sequences `j` (`hm[j] = [b_j | M_j]`); `final_state[n] = X`. FMAs in `hm`'s
//! precision (IEEE fp32, or fp64) in a fixed order; one block per (sequence, head, 32 state
//! columns); the outputs have `hm`'s dtype.

use crate::device::Gpu;
use crate::error::GpuResult;
use crate::kernels::Module;
use crate::params::dtype_code;
use crate::tensor::DeviceTensor;
use attn_reference::delta::{
    validate_delta_dtypes, validate_fwd_h_merge, DeltaDtypes, FwdHMergeParams, FwdHMergeShapes,
    MergePlan,
};
use attn_reference::{Dtype, Error};
use cudarc::driver::DeviceRepr;

/// Mirror of `MergeArgs` (fwd_h_merge.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct MergeArgs {
    hm: u64,
    offsets: u64,
    h0: u64,
    out: u64,
    ht: u64,
    value_heads: i64,
    k_dim: i64,
    v_dim: i64,
    h0_dtype: i64,
    v_first: i64,
}
// SAFETY: plain `#[repr(C)]` data (every field 8 bytes) matching the kernel's struct.
unsafe impl DeviceRepr for MergeArgs {}

/// State columns per block (`MERGE_BV`).
const MERGE_BV: usize = 32;

/// Outputs of one merge (`conformance/spec/ops-delta-rule.md` §4.3).
#[derive(Debug)]
pub struct FwdHMergeDeviceOutputs {
    /// `[S, HV, K, V]` (`[S, HV, V, K]` with `state_v_first`), `hm`'s dtype.
    pub initial_states: DeviceTensor,
    /// `[N, HV, K, V]` (or `[N, HV, V, K]`) in `hm`'s dtype, when `output_final_state`.
    pub final_state: Option<DeviceTensor>,
}

/// Validates a merge from shapes and dtypes alone (`conformance/spec/ops-delta-rule.md` §4.6): `hm`
/// float32 or float64, `initial_state` any float dtype.
pub fn check_fwd_h_merge(
    hm: (&[usize], Dtype),
    initial_state: Option<(&[usize], Dtype)>,
    subseq_offsets: &[i64],
    params: &FwdHMergeParams,
) -> attn_reference::Result<MergePlan> {
    validate_delta_dtypes(&DeltaDtypes {
        state: vec![("hm", hm.1)],
        float: initial_state
            .map(|(_, d)| ("initial_state", d))
            .into_iter()
            .collect(),
        ..DeltaDtypes::default()
    })?;
    let shapes = FwdHMergeShapes {
        hm: hm.0,
        initial_state: initial_state.map(|(s, _)| s),
    };
    validate_fwd_h_merge(&shapes, subseq_offsets, params)
}

/// A validated merge with its offsets on the device.
#[derive(Debug)]
pub struct FwdHMergePlan {
    plan: MergePlan,
    dtype: Dtype,
    params: FwdHMergeParams,
    offsets_host: Vec<i64>,
    offsets: DeviceTensor,
}

impl FwdHMergePlan {
    /// Validates the call and uploads `subseq_offsets`.
    pub fn new(
        gpu: &Gpu,
        hm: &DeviceTensor,
        initial_state: Option<&DeviceTensor>,
        subseq_offsets: &[i64],
        params: &FwdHMergeParams,
    ) -> GpuResult<FwdHMergePlan> {
        let plan = check_fwd_h_merge(
            (hm.shape(), hm.dtype()),
            initial_state.map(|t| (t.shape(), t.dtype())),
            subseq_offsets,
            params,
        )?;
        Ok(FwdHMergePlan {
            plan,
            dtype: hm.dtype(),
            params: *params,
            offsets_host: subseq_offsets.to_vec(),
            offsets: DeviceTensor::from_slice(gpu, subseq_offsets)?,
        })
    }

    fn state_shape(&self, rows: usize) -> [usize; 4] {
        let p = &self.plan;
        if self.params.state_v_first {
            [rows, p.hv, p.v, p.k]
        } else {
            [rows, p.hv, p.k, p.v]
        }
    }

    /// Fresh (unwritten) outputs.
    pub fn alloc_outputs(&self, gpu: &Gpu) -> GpuResult<FwdHMergeDeviceOutputs> {
        Ok(FwdHMergeDeviceOutputs {
            initial_states: DeviceTensor::alloc(gpu, &self.state_shape(self.plan.s), self.dtype)?,
            final_state: self
                .params
                .output_final_state
                .then(|| DeviceTensor::alloc(gpu, &self.state_shape(self.plan.n), self.dtype))
                .transpose()?,
        })
    }

    /// Runs the merge of `hm` (and `initial_state`) into `out`.
    pub fn run(
        &self,
        gpu: &Gpu,
        hm: &DeviceTensor,
        initial_state: Option<&DeviceTensor>,
        out: &mut FwdHMergeDeviceOutputs,
    ) -> GpuResult<()> {
        let plan = check_fwd_h_merge(
            (hm.shape(), hm.dtype()),
            initial_state.map(|t| (t.shape(), t.dtype())),
            &self.offsets_host,
            &self.params,
        )?;
        if plan != self.plan || hm.dtype() != self.dtype {
            return Err(Error::shape("hm", "the shape the plan was made for", hm.shape()).into());
        }
        for (arg, t, rows) in [
            ("initial_states", Some(&out.initial_states), plan.s),
            ("final_state", out.final_state.as_ref(), plan.n),
        ] {
            if let Some(t) = t {
                if t.dtype() != self.dtype {
                    return Err(Error::dtype(arg, self.dtype.name(), t.dtype().name()).into());
                }
                if t.shape() != self.state_shape(rows) {
                    let want = format!("{:?}", self.state_shape(rows));
                    return Err(Error::shape(arg, want, t.shape()).into());
                }
            }
        }
        if out.final_state.is_some() != self.params.output_final_state {
            return Err(Error::missing(
                "final_state",
                "present exactly when output_final_state",
                format!("{}", out.final_state.is_some()),
            )
            .into());
        }
        let args = MergeArgs {
            hm: hm.ptr(gpu),
            offsets: self.offsets.ptr(gpu),
            h0: initial_state.map_or(0, |t| t.ptr(gpu)),
            out: out.initial_states.ptr_mut(gpu),
            ht: out.final_state.as_mut().map_or(0, |t| t.ptr_mut(gpu)),
            value_heads: plan.hv as i64,
            k_dim: plan.k as i64,
            v_dim: plan.v as i64,
            h0_dtype: initial_state.map_or(-1, |t| dtype_code(t.dtype())),
            v_first: self.params.state_v_first as i64,
        };
        let tasks = plan.n * plan.hv;
        if tasks == 0 {
            return Ok(());
        }
        let grid_x = u32::try_from(tasks)
            .ok()
            .filter(|&x| x <= i32::MAX as u32)
            .ok_or_else(|| Error::shape("hm", "N * HV < 2^31", vec![tasks]))?;
        let (kernel, size) = if self.dtype == Dtype::F64 {
            ("fwd_h_merge_f64", 8)
        } else {
            ("fwd_h_merge_f32", 4)
        };
        gpu.launch_with_smem(
            Module::FwdHMerge,
            kernel,
            (grid_x, plan.v.div_ceil(MERGE_BV) as u32),
            256,
            (256 * (MERGE_BV + 1) * size) as u32,
            &args,
        )
    }
}

/// `fwd_h_merge` into new outputs (`conformance/spec/ops-delta-rule.md` §4.3).
pub fn fwd_h_merge(
    gpu: &Gpu,
    hm: &DeviceTensor,
    initial_state: Option<&DeviceTensor>,
    subseq_offsets: &[i64],
    params: &FwdHMergeParams,
) -> GpuResult<FwdHMergeDeviceOutputs> {
    let plan = FwdHMergePlan::new(gpu, hm, initial_state, subseq_offsets, params)?;
    let mut out = plan.alloc_outputs(gpu)?;
    plan.run(gpu, hm, initial_state, &mut out)?;
    Ok(out)
}
