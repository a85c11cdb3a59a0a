//! `chunk_gated_delta_rule_fwd_h` on the GPU (`conformance/spec/ops-delta-rule.md` §2).
//!
//! For every sequence `n` and value head `hv`, `S` (`K × V`, fp32 on chip) starts at
//! `initial_state[n, hv]` (or 0); for every chunk `c`: `h[c] = S` (rounded to `k`'s dtype),
//! `D = U_c − W_c S` (`v_new`, `u`'s dtype), `S ← exp2(G_ℓ) diag(exp2(Gk_ℓ)) S + K_cᵀ (a ⊙ D)`
//! with `a_r = exp2(G_ℓ − G_r)`; `final_state = S` (fp32). Half inputs round `S` to their dtype
//! for `W·S` and `a ⊙ D` before `Kᵀ·` (FLA 0.6.0's rounding points). Float64 inputs run in
//! fp64 and return a float64 `final_state`.

use super::launch::{
    code, grid_x, kernel_choice, launch, seq_table, state_dtype, FwdHArgs, KernelChoice, Workload,
};
use super::wg::{self, FwdHWgArgs};
use crate::device::Gpu;
use crate::error::GpuResult;
use crate::kernels::Module;
use crate::tensor::DeviceTensor;
use attn_reference::delta::{
    validate_chunk_gated_delta_rule_fwd_h, validate_delta_dtypes, DeltaDtypes, FwdHParams,
    FwdHShapes, Geometry,
};
use attn_reference::{Dtype, Error};

/// The device tensors of one call (`conformance/spec/ops-delta-rule.md` §2.1).
#[derive(Debug, Clone, Copy)]
pub struct FwdHTensors<'a> {
    pub k: &'a DeviceTensor,
    pub w: &'a DeviceTensor,
    pub u: &'a DeviceTensor,
    /// Scalar gate `[B, T, HV]` (chunk-local cumsum, log2 units), any float dtype.
    pub g: Option<&'a DeviceTensor>,
    /// Per-key gate `[B, T, HV, K]`, any float dtype.
    pub gk: Option<&'a DeviceTensor>,
    /// `[N, HV, K, V]` (`[N, HV, V, K]` with `state_v_first`), any float dtype (widened).
    pub initial_state: Option<&'a DeviceTensor>,
}

impl<'a> FwdHTensors<'a> {
    /// The three required tensors, no gate, no initial state.
    pub fn new(k: &'a DeviceTensor, w: &'a DeviceTensor, u: &'a DeviceTensor) -> Self {
        FwdHTensors {
            k,
            w,
            u,
            g: None,
            gk: None,
            initial_state: None,
        }
    }

    /// Shapes and dtypes, for validation.
    pub fn meta(&self) -> FwdHMeta<'_> {
        let m = |t: &'a DeviceTensor| (t.shape(), t.dtype());
        FwdHMeta {
            k: m(self.k),
            w: m(self.w),
            u: m(self.u),
            g: self.g.map(m),
            gk: self.gk.map(m),
            initial_state: self.initial_state.map(m),
        }
    }
}

/// Shapes and dtypes of one call's inputs: what validation needs (no GPU).
#[derive(Debug, Clone, Copy)]
pub struct FwdHMeta<'a> {
    pub k: (&'a [usize], Dtype),
    pub w: (&'a [usize], Dtype),
    pub u: (&'a [usize], Dtype),
    pub g: Option<(&'a [usize], Dtype)>,
    pub gk: Option<(&'a [usize], Dtype)>,
    pub initial_state: Option<(&'a [usize], Dtype)>,
}

impl FwdHMeta<'_> {
    pub(crate) fn shapes(&self) -> FwdHShapes<'_> {
        FwdHShapes {
            k: self.k.0,
            w: self.w.0,
            u: self.u.0,
            g: self.g.map(|t| t.0),
            gk: self.gk.map(|t| t.0),
            initial_state: self.initial_state.map(|t| t.0),
        }
    }

    /// Dtype rules of the GPU kernels (`conformance/spec/ops-delta-rule.md` §1.4): `k, w, u` one
    /// float dtype, gates and `initial_state` any float dtype (widened).
    pub(crate) fn check_dtypes(&self) -> attn_reference::Result<()> {
        let mut float: Vec<(&str, Dtype)> = Vec::new();
        for (n, t) in [
            ("g", self.g),
            ("gk", self.gk),
            ("initial_state", self.initial_state),
        ] {
            if let Some((_, d)) = t {
                float.push((n, d));
            }
        }
        validate_delta_dtypes(&DeltaDtypes {
            main: vec![("k", self.k.1), ("w", self.w.1), ("u", self.u.1)],
            float,
            ..DeltaDtypes::default()
        })
    }
}

/// Outputs of one call (`conformance/spec/ops-delta-rule.md` §2.3).
#[derive(Debug)]
pub struct FwdHDeviceOutputs {
    /// `[B, NT, HV, K, V]` (`[.., V, K]` with `state_v_first`), `k`'s dtype.
    pub h: DeviceTensor,
    /// `[B, T, HV, V]`, `u`'s dtype, when `save_new_value`.
    pub v_new: Option<DeviceTensor>,
    /// `[N, HV, K, V]` (or `[N, HV, V, K]`) float32 (float64 for float64 inputs), when
    /// `output_final_state`.
    pub final_state: Option<DeviceTensor>,
}

/// Validates a call from shapes and dtypes alone (no GPU needed):
/// `conformance/spec/ops-delta-rule.md` §1.5 and §2.6 plus the GPU's dtype rules. Returns the
/// geometry.
pub fn check_fwd_h(
    meta: &FwdHMeta<'_>,
    cu_seqlens: Option<&[i64]>,
    params: &FwdHParams,
) -> attn_reference::Result<Geometry> {
    meta.check_dtypes()?;
    validate_chunk_gated_delta_rule_fwd_h(&meta.shapes(), cu_seqlens, params)
}

/// A validated call, its sequence table on the device and its kernel, reusable across launches
/// on tensors of the same shapes (benchmarks time [`FwdHPlan::run`] alone).
#[derive(Debug)]
pub struct FwdHPlan {
    geo: Geometry,
    varlen: bool,
    params: FwdHParams,
    dtype: Dtype,
    choice: KernelChoice,
    /// The Hopper kernel (`chunk_gated_delta_rule_fwd_h_wg_bf16`) in place of `choice`.
    hopper: bool,
    seqs: DeviceTensor,
}

impl FwdHPlan {
    /// Validates the call and uploads its sequence table.
    pub fn new(
        gpu: &Gpu,
        inputs: &FwdHTensors<'_>,
        cu_seqlens: Option<&[i64]>,
        params: &FwdHParams,
    ) -> GpuResult<FwdHPlan> {
        let geo = check_fwd_h(&inputs.meta(), cu_seqlens, params)?;
        let varlen = cu_seqlens.is_some();
        let dtype = inputs.k.dtype();
        let chunks: Vec<usize> = geo.seqs.iter().map(|s| s.num_chunks(geo.bt)).collect();
        let work = Workload {
            dtype,
            k: geo.k,
            col_groups: &[geo.v],
            seq_chunks: &chunks,
            hv: geo.hv,
        };
        let choice = kernel_choice(&work, gpu.sm_count());
        let seqs = seq_table(gpu, &geo, varlen)?;
        let mut plan = FwdHPlan {
            geo,
            varlen,
            params: *params,
            dtype,
            choice,
            hopper: false,
            seqs,
        };
        plan.hopper = wg::fwd_h_fits(gpu, dtype, &plan.geo, plan.h_rows());
        Ok(plan)
    }

    /// The plan with another tensor-core tile choice (tests cover every variant), on the
    /// `mma.sync` kernels even where the Hopper kernel fits: `kp` 64, 128 or 256 and at least
    /// `K`, `bv` 16, 32 or 64 (64 only with `kp <= 128`), half inputs only.
    pub fn with_choice(mut self, choice: KernelChoice) -> attn_reference::Result<FwdHPlan> {
        let ok = match choice {
            KernelChoice::Fma => matches!(self.dtype, Dtype::F32 | Dtype::F64),
            KernelChoice::Mma { kp, bv } => {
                matches!(self.dtype, Dtype::BF16 | Dtype::F16)
                    && [64, 128, 256].contains(&kp)
                    && kp >= self.geo.k
                    && [16, 32, 64].contains(&bv)
                    && (kp <= 128 || bv <= 32)
            }
        };
        if !ok {
            return Err(Error::param(
                "kernel",
                format!("a kernel for {} inputs with K = {}", self.dtype, self.geo.k),
                format!("{choice:?}"),
            ));
        }
        self.choice = choice;
        self.hopper = false;
        Ok(self)
    }

    /// The `mma.sync` / FMA kernel this plan launches where it does not run the Hopper kernel.
    pub fn choice(&self) -> KernelChoice {
        self.choice
    }

    /// Whether the plan runs the Hopper kernel (`chunk_gated_delta_rule_fwd_h_wg_bf16`: sm_90,
    /// bf16, `K = 128`, `V` a multiple of 64, chunks of 64; not with `$ATTN_FWD_H_WG=0`).
    pub fn hopper(&self) -> bool {
        self.hopper
    }

    /// The validated geometry.
    pub fn geometry(&self) -> &Geometry {
        &self.geo
    }

    fn h_shape(&self) -> [usize; 5] {
        let g = &self.geo;
        let nt = g.nt(self.varlen);
        if self.params.state_v_first {
            [g.b, nt, g.hv, g.v, g.k]
        } else {
            [g.b, nt, g.hv, g.k, g.v]
        }
    }

    /// Rows of `h` seen as a matrix of its last dimension's columns.
    fn h_rows(&self) -> usize {
        let s = self.h_shape();
        s[..4].iter().product()
    }

    /// Fresh (unwritten) outputs of the plan's shapes and dtypes.
    pub fn alloc_outputs(&self, gpu: &Gpu) -> GpuResult<FwdHDeviceOutputs> {
        let g = &self.geo;
        let p = &self.params;
        Ok(FwdHDeviceOutputs {
            h: DeviceTensor::alloc(gpu, &self.h_shape(), self.dtype)?,
            v_new: p
                .save_new_value
                .then(|| DeviceTensor::alloc(gpu, &[g.b, g.t, g.hv, g.v], self.dtype))
                .transpose()?,
            final_state: p
                .output_final_state
                .then(|| {
                    DeviceTensor::alloc(
                        gpu,
                        &g.state_shape(p.state_v_first),
                        state_dtype(self.dtype),
                    )
                })
                .transpose()?,
        })
    }

    /// Checks `out` against the plan: every output present as the parameters ask, with the
    /// plan's shapes and dtypes.
    pub(crate) fn check_outputs(&self, out: &FwdHDeviceOutputs) -> attn_reference::Result<()> {
        let g = &self.geo;
        let p = &self.params;
        let want = |arg: &str, t: Option<&DeviceTensor>, on: bool, shape: &[usize], d: Dtype| match (
            t, on,
        ) {
            (None, false) => Ok(()),
            (Some(_), false) => Err(Error::missing(arg, "no tensor (not asked for)", "one")),
            (None, true) => Err(Error::missing(arg, "an output tensor", "none")),
            (Some(t), true) if t.dtype() != d => Err(Error::dtype(arg, d.name(), t.dtype().name())),
            (Some(t), true) if t.shape() != shape => {
                Err(Error::shape(arg, format!("{shape:?}"), t.shape()))
            }
            _ => Ok(()),
        };
        want("h", Some(&out.h), true, &self.h_shape(), self.dtype)?;
        want(
            "v_new",
            out.v_new.as_ref(),
            p.save_new_value,
            &[g.b, g.t, g.hv, g.v],
            self.dtype,
        )?;
        want(
            "final_state",
            out.final_state.as_ref(),
            p.output_final_state,
            &g.state_shape(p.state_v_first),
            state_dtype(self.dtype),
        )
    }

    /// Runs the recurrence of `inputs` (the shapes the plan was made for) into `out`.
    pub fn run(
        &self,
        gpu: &Gpu,
        inputs: &FwdHTensors<'_>,
        out: &mut FwdHDeviceOutputs,
    ) -> GpuResult<()> {
        let geo = self.recheck(inputs)?;
        if geo != self.geo || inputs.k.dtype() != self.dtype {
            return Err(Error::shape(
                "k",
                "the shapes and dtype the plan was made for",
                inputs.k.shape(),
            )
            .into());
        }
        self.check_outputs(out)?;
        let g = &self.geo;
        let p = &self.params;
        let args = FwdHArgs {
            k: inputs.k.ptr(gpu),
            w: inputs.w.ptr(gpu),
            u: inputs.u.ptr(gpu),
            g: inputs.g.map_or(0, |t| t.ptr(gpu)),
            gk: inputs.gk.map_or(0, |t| t.ptr(gpu)),
            h0: inputs.initial_state.map_or(0, |t| t.ptr(gpu)),
            seqs: self.seqs.ptr(gpu),
            h: out.h.ptr_mut(gpu),
            v_new: out.v_new.as_mut().map_or(0, |t| t.ptr_mut(gpu)),
            ht: out.final_state.as_mut().map_or(0, |t| t.ptr_mut(gpu)),
            heads: g.h as i64,
            value_heads: g.hv as i64,
            k_dim: g.k as i64,
            v_dim: g.v as i64,
            cols: g.v as i64,
            bt: g.bt as i64,
            g_dtype: code(inputs.g),
            gk_dtype: code(inputs.gk),
            h0_dtype: code(inputs.initial_state),
            v_first: p.state_v_first as i64,
            nb_b: g.v.div_ceil(self.choice.bv()) as i64,
            split: 0,
            warm: 0,
        };
        if self.hopper {
            let blocks = g.v / 64;
            let grid = grid_x(g.n() * g.hv * blocks, "u", "N * HV * V / 64 < 2^31")?;
            let wargs = FwdHWgArgs::new(args, g.b * g.t, self.h_rows())?;
            let name = "chunk_gated_delta_rule_fwd_h_wg_bf16";
            if grid > 0 {
                gpu.queue_with_smem(
                    Module::DeltaFwdWg,
                    name,
                    (grid, 1),
                    256,
                    wg::WG_SMEM as u32,
                    &wargs,
                )?;
            }
            return gpu.wait_if_checked(name);
        }
        launch(
            gpu,
            Module::ChunkGatedDeltaRuleFwdH,
            self.choice,
            self.dtype,
            g.n() * g.hv,
            g.v.div_ceil(self.choice.bv()),
            &args,
        )
    }

    /// Re-validates `inputs` with the plan's own sequences (its `cu_seqlens` when varlen).
    pub(crate) fn recheck(&self, inputs: &FwdHTensors<'_>) -> attn_reference::Result<Geometry> {
        let cu: Vec<i64> = std::iter::once(0)
            .chain(self.geo.seqs.iter().map(|s| s.eos as i64))
            .collect();
        check_fwd_h(
            &inputs.meta(),
            self.varlen.then_some(cu.as_slice()),
            &self.params,
        )
    }
}

/// `chunk_gated_delta_rule_fwd_h` into new outputs (`conformance/spec/ops-delta-rule.md` §2.3).
pub fn chunk_gated_delta_rule_fwd_h(
    gpu: &Gpu,
    inputs: &FwdHTensors<'_>,
    cu_seqlens: Option<&[i64]>,
    params: &FwdHParams,
) -> GpuResult<FwdHDeviceOutputs> {
    let plan = FwdHPlan::new(gpu, inputs, cu_seqlens, params)?;
    let mut out = plan.alloc_outputs(gpu)?;
    plan.run(gpu, inputs, &mut out)?;
    Ok(out)
}
