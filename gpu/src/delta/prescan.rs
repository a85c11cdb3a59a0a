//! `fwd_h_pre_scan` on the GPU (`conformance/spec/ops-delta-rule.md` §3): `hm[s, hv] = [b | M]`
//! (`[S, HV, K, V + K]`, float32, or float64 for float64 inputs) for every (sub-)sequence `s` of
//! `cu_seqlens`.
//!
//! The chunk map `S ← A_c S + B_c` is affine, so the recurrence kernel of
//! `chunk_gated_delta_rule_fwd_h` run on the augmented state `X = [b | M]` from `[0 | I]`, with
//! values `[U | 0]`, yields `b` and `M = A_{m−1} ⋯ A_0` at once (state columns are independent:
//! a column block holds `b` columns or `M` columns). On tensor cores the `M` columns carry their
//! operands as hi + lo pairs of the input's half type (about fp32 accuracy, like FLA's
//! `tf32x3` chain); the `b` columns round as `fwd_h` does. `$ATTN_PRESCAN_SPLIT=0` turns the
//! pairs off (experiments only).

use super::fwd_h::{FwdHMeta, FwdHTensors};
use super::launch::{
    code, kernel_choice, launch, seq_table, state_dtype, FwdHArgs, KernelChoice, Workload,
};
use crate::device::Gpu;
use crate::error::GpuResult;
use crate::kernels::Module;
use crate::tensor::DeviceTensor;
use attn_reference::delta::{validate_fwd_h_pre_scan, FwdHPreScanParams, Geometry};
use attn_reference::{Dtype, Error};

/// Validates a pre-scan call from shapes and dtypes alone
/// (`conformance/spec/ops-delta-rule.md` §3.4 and the GPU's dtype rules; `initial_state` must be
/// absent).
pub fn check_fwd_h_pre_scan(
    meta: &FwdHMeta<'_>,
    cu_seqlens: Option<&[i64]>,
    params: &FwdHPreScanParams,
) -> attn_reference::Result<Geometry> {
    meta.check_dtypes()?;
    validate_fwd_h_pre_scan(&meta.shapes(), cu_seqlens, params)
}

/// A validated pre-scan call with its sequence table on the device.
#[derive(Debug)]
pub struct FwdHPreScanPlan {
    geo: Geometry,
    /// Summaries written: the sequences of `cu_seqlens`, or the rows of [`Self::over_rows`].
    n: usize,
    cu: Option<Vec<i64>>,
    params: FwdHPreScanParams,
    dtype: Dtype,
    choice: KernelChoice,
    seqs: DeviceTensor,
}

impl FwdHPreScanPlan {
    /// Validates the call and uploads its sequence table.
    pub fn new(
        gpu: &Gpu,
        inputs: &FwdHTensors<'_>,
        cu_seqlens: Option<&[i64]>,
        params: &FwdHPreScanParams,
    ) -> GpuResult<FwdHPreScanPlan> {
        let geo = check_fwd_h_pre_scan(&inputs.meta(), cu_seqlens, params)?;
        let dtype = inputs.k.dtype();
        let chunks: Vec<usize> = geo.seqs.iter().map(|s| s.num_chunks(geo.bt)).collect();
        let choice = Self::kernel(gpu, &geo, dtype, &chunks);
        let seqs = seq_table(gpu, &geo, cu_seqlens.is_some())?;
        Ok(FwdHPreScanPlan {
            n: geo.n(),
            geo,
            cu: cu_seqlens.map(<[i64]>::to_vec),
            params: *params,
            dtype,
            choice,
            seqs,
        })
    }

    /// A pre-scan of the row ranges `rows` (`(first token row, length)` over `inputs`' flattened
    /// `B · T` rows, one summary each, chunks counted from each range's first row) of inputs of
    /// one batch row without `cu_seqlens`: the context-parallel summary of a piece from tiles
    /// that cover its whole shard.
    pub(crate) fn over_rows(
        gpu: &Gpu,
        inputs: &FwdHTensors<'_>,
        rows: &[(usize, usize)],
        params: &FwdHPreScanParams,
    ) -> GpuResult<FwdHPreScanPlan> {
        let geo = check_fwd_h_pre_scan(&inputs.meta(), None, params)?;
        let total = geo.b * geo.t;
        if let Some(&(a, len)) = rows.iter().find(|&&(a, len)| a + len > total) {
            let want = format!("row ranges within the {total} rows");
            return Err(Error::shape("rows", want, [a, len]).into());
        }
        let dtype = inputs.k.dtype();
        let chunks: Vec<usize> = rows.iter().map(|&(_, len)| len.div_ceil(geo.bt)).collect();
        let choice = Self::kernel(gpu, &geo, dtype, &chunks);
        let mut table: Vec<i64> = rows
            .iter()
            .flat_map(|&(a, len)| [a as i64, len as i64, 0])
            .collect();
        if table.is_empty() {
            table.push(0);
        }
        Ok(FwdHPreScanPlan {
            n: rows.len(),
            geo,
            cu: None,
            params: *params,
            dtype,
            choice,
            seqs: DeviceTensor::from_slice(gpu, &table)?,
        })
    }

    /// The kernel for summaries of `chunks` chunks each at `V + K` columns.
    fn kernel(gpu: &Gpu, geo: &Geometry, dtype: Dtype, chunks: &[usize]) -> KernelChoice {
        let work = Workload {
            dtype,
            k: geo.k,
            col_groups: &[geo.v, geo.k],
            seq_chunks: chunks,
            hv: geo.hv,
        };
        kernel_choice(&work, gpu.sm_count())
    }

    /// The kernel this plan launches.
    pub fn choice(&self) -> KernelChoice {
        self.choice
    }

    /// The shape of `hm`: `[S, HV, K, V + K]`.
    pub fn hm_shape(&self) -> [usize; 4] {
        let g = &self.geo;
        [self.n, g.hv, g.k, g.v + g.k]
    }

    /// The dtype of `hm`: float32 (float64 for float64 inputs).
    pub fn hm_dtype(&self) -> Dtype {
        state_dtype(self.dtype)
    }

    /// Runs the pre-scan of `inputs` (the shapes the plan was made for) into `hm`
    /// ([`FwdHPreScanPlan::hm_dtype`]).
    pub fn run(&self, gpu: &Gpu, inputs: &FwdHTensors<'_>, hm: &mut DeviceTensor) -> GpuResult<()> {
        let geo = check_fwd_h_pre_scan(&inputs.meta(), self.cu.as_deref(), &self.params)?;
        if geo != self.geo || inputs.k.dtype() != self.dtype {
            return Err(Error::shape(
                "k",
                "the shapes and dtype the plan was made for",
                inputs.k.shape(),
            )
            .into());
        }
        if hm.dtype() != self.hm_dtype() {
            return Err(Error::dtype("hm", self.hm_dtype().name(), hm.dtype().name()).into());
        }
        if hm.shape() != self.hm_shape() {
            return Err(Error::shape("hm", format!("{:?}", self.hm_shape()), hm.shape()).into());
        }
        let g = &self.geo;
        let bv = self.choice.bv();
        let split = crate::knobs::prescan_split();
        let args = FwdHArgs {
            k: inputs.k.ptr(gpu),
            w: inputs.w.ptr(gpu),
            u: inputs.u.ptr(gpu),
            g: inputs.g.map_or(0, |t| t.ptr(gpu)),
            gk: inputs.gk.map_or(0, |t| t.ptr(gpu)),
            h0: 0,
            seqs: self.seqs.ptr(gpu),
            h: 0,
            v_new: 0,
            ht: hm.ptr_mut(gpu),
            heads: g.h as i64,
            value_heads: g.hv as i64,
            k_dim: g.k as i64,
            v_dim: g.v as i64,
            cols: (g.v + g.k) as i64,
            bt: g.bt as i64,
            g_dtype: code(inputs.g),
            gk_dtype: code(inputs.gk),
            h0_dtype: -1,
            v_first: 0,
            nb_b: g.v.div_ceil(bv) as i64,
            split: split as i64,
            warm: 0,
        };
        launch(
            gpu,
            Module::FwdHPreScan,
            self.choice,
            self.dtype,
            self.n * g.hv,
            g.v.div_ceil(bv) + g.k.div_ceil(bv),
            &args,
        )
    }
}

/// `fwd_h_pre_scan` into a new `hm` (`[S, HV, K, V + K]`, float32; float64 for float64
/// inputs).
pub fn fwd_h_pre_scan(
    gpu: &Gpu,
    inputs: &FwdHTensors<'_>,
    cu_seqlens: Option<&[i64]>,
    params: &FwdHPreScanParams,
) -> GpuResult<DeviceTensor> {
    let plan = FwdHPreScanPlan::new(gpu, inputs, cu_seqlens, params)?;
    let mut hm = DeviceTensor::alloc(gpu, &plan.hm_shape(), plan.hm_dtype())?;
    plan.run(gpu, inputs, &mut hm)?;
    Ok(hm)
}
