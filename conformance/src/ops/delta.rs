//! Runners of the delta-rule ops (spec `ops-delta-rule.md`) and their output classes and
//! thresholds: `chunk_gated_delta_rule_fwd_h`, `fwd_h_pre_scan`, `fwd_h_merge`,
//! `chunk_gated_delta_rule_fwd_h_split`, `kda_intra`, `kda_fwd` (its recurrent definition) and
//! `gdn_fwd` (its recurrent definition).

use super::{float_dim, indices, input, opt_float_dim, opt_indices};
use crate::case::Tensors;
use crate::compare::Rule;
use crate::error::Problem;
use crate::params::Params;
use crate::tensor::Tensor;
use attn_reference::delta::{self as d, DeltaDtypes};
use attn_reference::DtypeClass;
use ndarray::{ArrayD, Ix1, Ix3, Ix4};

/// Sequences longer than this make a case "long" (spec 1.6).
const LONG: usize = 4096;

/// Spec 1.4 for the present tensors: `main` share one float dtype, `states` are f32/f64.
fn check_dtypes(
    inputs: &Tensors,
    main: &[&'static str],
    states: &[&'static str],
) -> Result<(), Problem> {
    let pick = |names: &[&'static str]| {
        names
            .iter()
            .filter_map(|&n| inputs.get(n).map(|t| (n, t.dtype())))
            .collect()
    };
    d::validate_delta_dtypes(&DeltaDtypes {
        main: pick(main),
        state: pick(states),
        ..DeltaDtypes::default()
    })?;
    Ok(())
}

fn named(pairs: Vec<(&str, Option<ArrayD<f64>>)>) -> Tensors {
    pairs
        .into_iter()
        .filter_map(|(n, a)| a.map(|a| (n.to_string(), Tensor::F64(a))))
        .collect()
}

/// The section-2 tensors of a case (`k, w, u, g, gk, initial_state`).
struct FwdH {
    k: ndarray::Array4<f64>,
    w: ndarray::Array4<f64>,
    u: ndarray::Array4<f64>,
    g: Option<ndarray::Array3<f64>>,
    gk: Option<ndarray::Array4<f64>>,
    h0: Option<ndarray::Array4<f64>>,
    cu: Option<Vec<i64>>,
}

impl FwdH {
    fn read(inputs: &Tensors) -> Result<FwdH, Problem> {
        check_dtypes(inputs, &["k", "w", "u"], &["initial_state"])?;
        Ok(FwdH {
            k: float_dim::<Ix4>(inputs, "k")?,
            w: float_dim::<Ix4>(inputs, "w")?,
            u: float_dim::<Ix4>(inputs, "u")?,
            g: opt_float_dim::<Ix3>(inputs, "g")?,
            gk: opt_float_dim::<Ix4>(inputs, "gk")?,
            h0: opt_float_dim::<Ix4>(inputs, "initial_state")?,
            cu: opt_indices(inputs, "cu_seqlens")?,
        })
    }
    fn inputs(&self) -> d::FwdHInputs<'_, f64> {
        d::FwdHInputs {
            k: self.k.view(),
            w: self.w.view(),
            u: self.u.view(),
            g: self.g.as_ref().map(|a| a.view()),
            gk: self.gk.as_ref().map(|a| a.view()),
            initial_state: self.h0.as_ref().map(|a| a.view()),
            cu_seqlens: self.cu.as_deref(),
        }
    }
}

fn fwd_h_params(p: &Params) -> Result<d::FwdHParams, Problem> {
    Ok(d::FwdHParams {
        chunk_size: p.int("chunk_size")?,
        output_final_state: p.bool("output_final_state")?,
        save_new_value: p.bool("save_new_value")?,
        state_v_first: p.bool("state_v_first")?,
    })
}

fn fwd_h_outputs(o: d::FwdHOutputs<f64>) -> Tensors {
    named(vec![
        ("h", Some(o.h.into_dyn())),
        ("v_new", o.v_new.map(|a| a.into_dyn())),
        ("final_state", o.final_state.map(|a| a.into_dyn())),
    ])
}

/// `h`, `v_new`, `final_state` of spec section 2.
pub fn chunk_gated_delta_rule_fwd_h(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    let f = FwdH::read(inputs)?;
    let o = d::chunk_gated_delta_rule_fwd_h(&f.inputs(), &fwd_h_params(p)?)?;
    Ok(fwd_h_outputs(o))
}

/// `hm = [b | M]` of spec section 3.
pub fn fwd_h_pre_scan(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    let f = FwdH::read(inputs)?;
    let params = d::FwdHPreScanParams {
        chunk_size: p.int("chunk_size")?,
    };
    let hm = d::fwd_h_pre_scan(&f.inputs(), &params)?.hm;
    Ok(named(vec![("hm", Some(hm.into_dyn()))]))
}

/// `initial_states`, `final_state` of spec section 4.
pub fn fwd_h_merge(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    check_dtypes(inputs, &[], &["hm", "initial_state"])?;
    let hm = float_dim::<Ix4>(inputs, "hm")?;
    let offs = indices(inputs, "subseq_offsets")?;
    let h0 = opt_float_dim::<Ix4>(inputs, "initial_state")?;
    let params = d::FwdHMergeParams {
        state_v_first: p.bool("state_v_first")?,
        output_final_state: p.bool("output_final_state")?,
    };
    let o = d::fwd_h_merge(
        &d::FwdHMergeInputs {
            hm: hm.view(),
            subseq_offsets: &offs,
            initial_state: h0.as_ref().map(|a| a.view()),
        },
        &params,
    )?;
    Ok(named(vec![
        ("initial_states", Some(o.initial_states.into_dyn())),
        ("final_state", o.final_state.map(|a| a.into_dyn())),
    ]))
}

/// Section 2's outputs through the split of spec section 5.
pub fn chunk_gated_delta_rule_fwd_h_split(
    inputs: &Tensors,
    p: &Params,
) -> Result<Tensors, Problem> {
    let f = FwdH::read(inputs)?;
    let subseq = opt_indices(inputs, "subseq_cu_seqlens")?;
    let o = d::chunk_gated_delta_rule_fwd_h_split(
        &d::FwdHSplitInputs {
            fwd_h: f.inputs(),
            subseq_cu_seqlens: subseq.as_deref(),
        },
        &fwd_h_params(p)?,
    )?;
    Ok(fwd_h_outputs(o))
}

/// The tensors every `q, k, v` op reads (`q, k, v, beta, cu_seqlens`), after the dtype rules
/// of spec 1.4 (`q, k, v` share one float dtype, `states` are f32/f64).
struct Qkv {
    q: ndarray::Array4<f64>,
    k: ndarray::Array4<f64>,
    v: ndarray::Array4<f64>,
    beta: ndarray::Array3<f64>,
    cu: Option<Vec<i64>>,
}

impl Qkv {
    fn read(inputs: &Tensors, states: &[&'static str]) -> Result<Qkv, Problem> {
        check_dtypes(inputs, &["q", "k", "v"], states)?;
        Ok(Qkv {
            q: float_dim::<Ix4>(inputs, "q")?,
            k: float_dim::<Ix4>(inputs, "k")?,
            v: float_dim::<Ix4>(inputs, "v")?,
            beta: float_dim::<Ix3>(inputs, "beta")?,
            cu: opt_indices(inputs, "cu_seqlens")?,
        })
    }
}

/// `w, u, kg, Aqk, Akk` of spec section 7.
pub fn kda_intra(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    let x = Qkv::read(inputs, &[])?;
    let gk = float_dim::<Ix4>(inputs, "gk")?;
    let params = d::KdaIntraParams {
        scale: p.opt_f64("scale")?,
        chunk_size: p.int("chunk_size")?,
        safe_gate: p.bool("safe_gate")?,
    };
    let o = d::kda_intra(
        &d::KdaIntraInputs {
            q: x.q.view(),
            k: x.k.view(),
            v: x.v.view(),
            gk: gk.view(),
            beta: x.beta.view(),
            cu_seqlens: x.cu.as_deref(),
        },
        &params,
    )?;
    Ok(named(vec![
        ("w", Some(o.w.into_dyn())),
        ("u", Some(o.u.into_dyn())),
        ("kg", Some(o.kg.into_dyn())),
        ("Aqk", Some(o.aqk.into_dyn())),
        ("Akk", Some(o.akk.into_dyn())),
    ]))
}

fn forward_outputs(o: d::DeltaFwdOutputs<f64>) -> Tensors {
    named(vec![
        ("o", Some(o.o.into_dyn())),
        ("final_state", o.final_state.map(|a| a.into_dyn())),
    ])
}

/// `o`, `final_state` of spec section 6 (the recurrent definition).
pub fn kda_fwd(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    let x = Qkv::read(inputs, &["initial_state"])?;
    let g = float_dim::<Ix4>(inputs, "g")?;
    let h0 = opt_float_dim::<Ix4>(inputs, "initial_state")?;
    let a_log = opt_float_dim::<Ix1>(inputs, "A_log")?;
    let dt_bias = opt_float_dim::<Ix1>(inputs, "dt_bias")?;
    let params = d::KdaFwdParams {
        scale: p.opt_f64("scale")?,
        output_final_state: p.bool("output_final_state")?,
        use_qk_l2norm_in_kernel: p.bool("use_qk_l2norm_in_kernel")?,
        use_gate_in_kernel: p.bool("use_gate_in_kernel")?,
        lower_bound: p.opt_f64("lower_bound")?,
        use_beta_sigmoid_in_kernel: p.bool("use_beta_sigmoid_in_kernel")?,
        allow_neg_eigval: p.bool("allow_neg_eigval")?,
        safe_gate: p.bool("safe_gate")?,
        chunk_size: p.int("chunk_size")?,
        state_v_first: p.bool("state_v_first")?,
    };
    let inp = d::KdaFwdInputs {
        initial_state: h0.as_ref().map(|a| a.view()),
        a_log: a_log.as_ref().map(|a| a.view()),
        dt_bias: dt_bias.as_ref().map(|a| a.view()),
        cu_seqlens: x.cu.as_deref(),
        ..d::KdaFwdInputs::new(x.q.view(), x.k.view(), x.v.view(), g.view(), x.beta.view())
    };
    Ok(forward_outputs(d::kda_fwd(&inp, &params)?))
}

/// `o`, `final_state` of spec section 8 (the recurrent definition).
pub fn gdn_fwd(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    let x = Qkv::read(inputs, &["initial_state"])?;
    let g = float_dim::<Ix3>(inputs, "g")?;
    let h0 = opt_float_dim::<Ix4>(inputs, "initial_state")?;
    let params = d::GdnFwdParams {
        scale: p.opt_f64("scale")?,
        output_final_state: p.bool("output_final_state")?,
        use_qk_l2norm_in_kernel: p.bool("use_qk_l2norm_in_kernel")?,
        chunk_size: p.int("chunk_size")?,
        state_v_first: p.bool("state_v_first")?,
    };
    let inp = d::GdnFwdInputs {
        initial_state: h0.as_ref().map(|a| a.view()),
        cu_seqlens: x.cu.as_deref(),
        ..d::GdnFwdInputs::new(x.q.view(), x.k.view(), x.v.view(), g.view(), x.beta.view())
    };
    Ok(forward_outputs(d::gdn_fwd(&inp, &params)?))
}

/// The class of the op's main input (spec 1.6: `k`, `hm` or `q`), or float64 when absent.
fn main_class(inputs: &Tensors, main: &str) -> DtypeClass {
    input(inputs, main).map_or(DtypeClass::Float64, |t| t.dtype().class())
}

/// The class of an output FLA stores in float32 (`final_state`, `hm`, merged states): float64
/// when the main input is float64 (the oracle's cases), else float32.
pub fn f32_class(inputs: &Tensors, main: &str) -> DtypeClass {
    match main_class(inputs, main) {
        DtypeClass::Float64 => DtypeClass::Float64,
        _ => DtypeClass::Float32,
    }
}

/// Whether some sequence of the case has more than 4096 tokens (spec 1.6 "long").
fn long(inputs: &Tensors, main: &str) -> bool {
    let t = inputs
        .get(main)
        .and_then(|x| x.shape().get(1).copied())
        .unwrap_or(0);
    match opt_indices(inputs, "cu_seqlens") {
        Ok(Some(cu)) => cu
            .windows(2)
            .any(|w| w[1].saturating_sub(w[0]) > LONG as i64),
        _ => t > LONG,
    }
}

/// The threshold row of spec 1.6: a float64 candidate is held to `1e-10`; otherwise the class
/// of the main input picks `half` (or `half_long` for long cases), `f32` or `1e-10`.
pub fn threshold(
    inputs: &Tensors,
    main: &str,
    candidate: DtypeClass,
    half: f64,
    half_long: f64,
    f32: f64,
) -> Rule {
    if candidate == DtypeClass::Float64 {
        return Rule::Threshold(1e-10);
    }
    Rule::Threshold(match main_class(inputs, main) {
        DtypeClass::Half if long(inputs, main) => half_long,
        DtypeClass::Half => half,
        DtypeClass::Float32 => f32,
        _ => 1e-10,
    })
}

/// `V` of `hm` `[S, HV, K, V + K]` (0 when the shape is not that).
fn hm_v(t: &Tensor) -> usize {
    match t.shape() {
        [_, _, k, w] => w.saturating_sub(*k),
        _ => 0,
    }
}

/// `hm.b = hm[..., :V]`.
pub fn hm_b(t: &Tensor) -> Tensor {
    t.slice_last(0..hm_v(t))
}

/// `hm.M = hm[..., V:]`.
pub fn hm_m(t: &Tensor) -> Tensor {
    t.slice_last(hm_v(t)..usize::MAX)
}
