//! The delta-rule ops of `conformance/spec/ops-delta-rule.md`: `chunk_gated_delta_rule_fwd_h`,
//! `fwd_h_pre_scan`, `fwd_h_merge`, `chunk_gated_delta_rule_fwd_h_split`, `kda_intra`, `kda_fwd`
//! (its recurrent definition) and `gdn_fwd` (its recurrent definition). Each op's registry entry,
//! its float64 CPU runner (`<op>_cpu`), its GPU runner (`<op>_gpu`:
//! `attn-gpu`'s kernels on the case's inputs in their own dtypes) and, for
//! `chunk_gated_delta_rule_fwd_h`, `kda_fwd` and `gdn_fwd`, its context-parallel runner
//! (`<op>_cp`: `attn_gpu::cp` over the GPUs of a group, `verify --gpus N`), side by side, then
//! the output classes and thresholds they share.

use super::device::CP_MIN_PIECE_CHUNKS;
use super::device::{download, from_hosts, gpu, host, opt_host, opt_upload, upload};
use super::{float_dim, indices, input, opt_float_dim, opt_indices};
use super::{P_LOWER, P_SCALE};
use crate::case::Tensors;
use crate::compare::Rule;
use crate::error::Problem;
use crate::params::{ParamSpec, ParamType, Params};
use crate::spec::{self as s, InputSpec, OpSpec, OutputSpec, PartSpec};
use crate::tensor::Tensor;
use attn_gpu::cp::{self as cp, CpGroup};
use attn_reference::delta::{self as d, DeltaDtypes};
use attn_reference::DtypeClass;
use ndarray::{ArrayD, Ix1, Ix3, Ix4};

pub const OPS: &[OpSpec] = &[
    CHUNK_GATED_DELTA_RULE_FWD_H,
    FWD_H_PRE_SCAN,
    FWD_H_MERGE,
    CHUNK_GATED_DELTA_RULE_FWD_H_SPLIT,
    KDA_INTRA,
    KDA_FWD,
    GDN_FWD,
];

const P_CHUNK64: ParamSpec = s::param("chunk_size", ParamType::Int, Some("64"));
const P_FINAL: ParamSpec = s::param("output_final_state", ParamType::Bool, Some("false"));
const P_V_FIRST: ParamSpec = s::param("state_v_first", ParamType::Bool, Some("false"));
const P_SAVE_V: ParamSpec = s::param("save_new_value", ParamType::Bool, Some("true"));
const P_SAFE_GATE: ParamSpec = s::param("safe_gate", ParamType::Bool, Some("false"));
const P_L2NORM: ParamSpec = s::param("use_qk_l2norm_in_kernel", ParamType::Bool, Some("false"));
/// The layout of a state `initial_state` / `final_state`.
const STATE: &str = "[N, HV, K, V] ([N, HV, V, K] with state_v_first)";
/// The dtype of an output FLA stores in float32 ([`f32_class`]).
const F32_OUT: &str = "float32 (float64 for a float64 main input)";
/// `initial_state` of the ops that take one.
const INITIAL_STATE: InputSpec = s::float("initial_state", false, STATE, "f32|f64");
const CU_SEQLENS: InputSpec = s::index("cu_seqlens", false, "[N + 1]");
/// `k, w, u, g, gk` of the state-recurrence ops (`conformance/spec/ops-delta-rule.md` §2.1), then
/// the op's own inputs.
macro_rules! fwd_h_inputs {
    ($($extra:expr),* $(,)?) => {
        &[
            s::float("k", true, "[B, T, H, K]", "float (k, w, u share one dtype)"),
            s::float("w", true, "[B, T, HV, K]", "float, as k"),
            s::float("u", true, "[B, T, HV, V]", "float, as k"),
            s::float("g", false, "[B, T, HV]", "float"),
            s::float("gk", false, "[B, T, HV, K]", "float"),
            $($extra),*
        ]
    };
}
/// `h`, `v_new`, `final_state` of section 2 (and 5): the `half` / `half_long` / `f32`
/// thresholds of `h` and `v_new`, then those of `final_state`.
macro_rules! fwd_h_outputs {
    ($h:literal, $h_long:literal, $h32:literal; $s:literal, $s_long:literal, $s32:literal) => {
        [
            s::output(
                "h",
                "[B, NT, HV, K, V] ([B, NT, HV, V, K] with state_v_first; varlen: B = 1, \
                 NT = total chunks)",
                "dtype of k",
                |i, _| super::class_of(i, "k"),
                |i, _, c| threshold(i, "k", c, $h, $h_long, $h32),
            ),
            s::output(
                "v_new",
                "[B, T, HV, V]",
                "dtype of u",
                |i, _| super::class_of(i, "u"),
                |i, _, c| threshold(i, "k", c, $h, $h_long, $h32),
            )
            .when("when save_new_value"),
            s::output(
                "final_state",
                STATE,
                F32_OUT,
                |i, _| Ok(f32_class(i, "k")),
                |i, _, c| threshold(i, "k", c, $s, $s_long, $s32),
            )
            .when("when output_final_state"),
        ]
    };
}
const FWD_H_OUTPUTS: [OutputSpec; 3] = fwd_h_outputs!(1e-2, 1e-2, 1e-5; 5e-3, 1e-2, 1e-5);
/// Section 5's outputs, with its looser float32 threshold.
const SPLIT_OUTPUTS: [OutputSpec; 3] = fwd_h_outputs!(1e-2, 1e-2, 5e-5; 1e-2, 1e-2, 5e-5);
/// An output of `kda_intra` stored in the dtype of input `like` (the default thresholds of
/// `conformance/spec/README.md` by `q`, `conformance/spec/ops-delta-rule.md` §7.7).
macro_rules! intra_output {
    ($name:literal, $shape:literal, $like:literal) => {
        s::output(
            $name,
            $shape,
            concat!("dtype of ", $like),
            |i, _| super::class_of(i, $like),
            |i, _, c| threshold(i, "q", c, 5e-3, 5e-3, 1e-5),
        )
    };
}
/// `q, k, v, g, beta, initial_state` of `kda_fwd` / `gdn_fwd`
/// (`conformance/spec/ops-delta-rule.md` §6.1, §8.1), `g` of layout `$g`, then the op's own inputs.
macro_rules! forward_inputs {
    ($g:literal; $($extra:expr),* $(,)?) => {
        &[
            s::float("q", true, "[B, T, H, K]", "float (q, k, v share one dtype)"),
            s::float("k", true, "[B, T, H, K]", "float, as q"),
            s::float("v", true, "[B, T, HV, V]", "float, as q"),
            s::float("g", true, $g, "float"),
            s::float("beta", true, "[B, T, HV]", "float"),
            INITIAL_STATE,
            $($extra),*
        ]
    };
}
/// `o` and `final_state` of `kda_fwd` / `gdn_fwd`
/// (`conformance/spec/ops-delta-rule.md` §6.8, §8.8).
const FORWARD_OUTPUTS: [OutputSpec; 2] = [
    s::output(
        "o",
        "[B, T, HV, V]",
        "dtype of q",
        |i, _| super::class_of(i, "q"),
        forward_threshold,
    ),
    s::output(
        "final_state",
        STATE,
        F32_OUT,
        |i, _| Ok(f32_class(i, "q")),
        forward_threshold,
    )
    .when("when output_final_state"),
];

const CHUNK_GATED_DELTA_RULE_FWD_H: OpSpec = OpSpec {
    id: "chunk_gated_delta_rule_fwd_h",
    summary: "chunked delta-rule state recurrence: h per chunk, v_new = u - w S, final state",
    inputs: fwd_h_inputs![INITIAL_STATE, CU_SEQLENS],
    params: &[P_CHUNK64, P_FINAL, P_SAVE_V, P_V_FIRST],
    outputs: &FWD_H_OUTPUTS,
    cpu: chunk_gated_delta_rule_fwd_h_cpu,
    gpu: Some(chunk_gated_delta_rule_fwd_h_gpu),
    cp: Some(chunk_gated_delta_rule_fwd_h_cp),
    section: "conformance/spec/ops-delta-rule.md §2",
};

/// `h`, `v_new`, `final_state` of `conformance/spec/ops-delta-rule.md` §2.
fn chunk_gated_delta_rule_fwd_h_cpu(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    let f = FwdH::read(inputs)?;
    let o = d::chunk_gated_delta_rule_fwd_h(&f.inputs(), &fwd_h_params(p)?)?;
    Ok(fwd_h_outputs(o))
}

/// `h`, `v_new`, `final_state` of `conformance/spec/ops-delta-rule.md` §2 on the GPU.
fn chunk_gated_delta_rule_fwd_h_gpu(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    let gpu = gpu()?;
    let t = FwdHDevice::upload(inputs)?;
    let cu = opt_indices(inputs, "cu_seqlens")?;
    let o = attn_gpu::chunk_gated_delta_rule_fwd_h(
        gpu,
        &t.tensors(),
        cu.as_deref(),
        &fwd_h_params(p)?,
    )?;
    fwd_h_downloads(gpu, o)
}

/// `h`, `v_new`, `final_state` of `conformance/spec/ops-delta-rule.md` §2 by the
/// context-parallel path over the GPUs of `group` (the case's tokens partitioned by chunks).
fn chunk_gated_delta_rule_fwd_h_cp(
    group: &CpGroup,
    inputs: &Tensors,
    p: &Params,
) -> Result<Tensors, Problem> {
    let cu = opt_indices(inputs, "cu_seqlens")?;
    let x = cp::HostFwdHInputs {
        k: host(inputs, "k")?,
        w: host(inputs, "w")?,
        u: host(inputs, "u")?,
        g: opt_host(inputs, "g")?,
        gk: opt_host(inputs, "gk")?,
        initial_state: opt_host(inputs, "initial_state")?,
        cu_seqlens: cu.as_deref(),
    };
    let o = cp::cp_fwd_h_host(group, &x, &fwd_h_params(p)?, CP_MIN_PIECE_CHUNKS)?;
    Ok(from_hosts(vec![
        ("h", Some(o.h)),
        ("v_new", o.v_new),
        ("final_state", o.final_state),
    ]))
}

/// `h`, `v_new`, `final_state` of a GPU run, downloaded.
fn fwd_h_downloads(
    gpu: &attn_gpu::Gpu,
    o: attn_gpu::FwdHDeviceOutputs,
) -> Result<Tensors, Problem> {
    let mut out = Tensors::new();
    out.insert("h".into(), download(gpu, &o.h)?);
    for (name, t) in [("v_new", o.v_new), ("final_state", o.final_state)] {
        if let Some(t) = t {
            out.insert(name.into(), download(gpu, &t)?);
        }
    }
    Ok(out)
}

const FWD_H_PRE_SCAN: OpSpec = OpSpec {
    id: "fwd_h_pre_scan",
    summary: "affine summary hm = [b | M] of each (sub-)sequence's chunk recurrence",
    inputs: fwd_h_inputs![s::index("cu_seqlens", false, "[S + 1]")],
    params: &[P_CHUNK64],
    outputs: &[OutputSpec {
        name: "hm",
        optional: false,
        class: |i, _| Ok(f32_class(i, "k")),
        rule: |i, _, c| threshold(i, "k", c, 5e-3, 1e-2, 1e-5),
        shape: "[S, HV, K, V + K] (b = hm[..., :V], M = hm[..., V:])",
        dtype: F32_OUT,
        present: "always",
        parts: &[
            PartSpec {
                name: "hm.b",
                take: hm_b,
                rule: |i, _, c| threshold(i, "k", c, 5e-3, 1e-2, 1e-5),
            },
            PartSpec {
                name: "hm.M",
                take: hm_m,
                rule: |i, _, c| threshold(i, "k", c, 1e-2, 1e-2, 1e-5),
            },
        ],
    }],
    cpu: fwd_h_pre_scan_cpu,
    gpu: Some(fwd_h_pre_scan_gpu),
    cp: None,
    section: "conformance/spec/ops-delta-rule.md §3",
};

/// `hm = [b | M]` of `conformance/spec/ops-delta-rule.md` §3.
fn fwd_h_pre_scan_cpu(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    let f = FwdH::read(inputs)?;
    let params = d::FwdHPreScanParams {
        chunk_size: p.int("chunk_size")?,
    };
    let hm = d::fwd_h_pre_scan(&f.inputs(), &params)?.hm;
    Ok(named(vec![("hm", Some(hm.into_dyn()))]))
}

/// `hm = [b | M]` of `conformance/spec/ops-delta-rule.md` §3 on the GPU.
fn fwd_h_pre_scan_gpu(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    let gpu = gpu()?;
    let t = FwdHDevice::upload(inputs)?;
    let cu = opt_indices(inputs, "cu_seqlens")?;
    let params = d::FwdHPreScanParams {
        chunk_size: p.int("chunk_size")?,
    };
    let hm = attn_gpu::fwd_h_pre_scan(gpu, &t.tensors(), cu.as_deref(), &params)?;
    Ok(Tensors::from([("hm".to_string(), download(gpu, &hm)?)]))
}

const FWD_H_MERGE: OpSpec = OpSpec {
    id: "fwd_h_merge",
    summary: "prefix chain X <- M X + b over each sequence's sub-sequence summaries",
    inputs: &[
        s::float("hm", true, "[S, HV, K, V + K]", "f32|f64"),
        s::index("subseq_offsets", true, "[N + 1]"),
        INITIAL_STATE,
    ],
    params: &[P_V_FIRST, P_FINAL],
    outputs: &[
        s::output(
            "initial_states",
            "[S, HV, K, V] ([S, HV, V, K] with state_v_first)",
            F32_OUT,
            |i, _| Ok(f32_class(i, "hm")),
            |i, _, c| threshold(i, "hm", c, 2e-5, 2e-5, 2e-5),
        ),
        s::output(
            "final_state",
            STATE,
            F32_OUT,
            |i, _| Ok(f32_class(i, "hm")),
            |i, _, c| threshold(i, "hm", c, 2e-5, 2e-5, 2e-5),
        )
        .when("when output_final_state"),
    ],
    cpu: fwd_h_merge_cpu,
    gpu: Some(fwd_h_merge_gpu),
    cp: None,
    section: "conformance/spec/ops-delta-rule.md §4",
};

/// `initial_states`, `final_state` of `conformance/spec/ops-delta-rule.md` §4.
fn fwd_h_merge_cpu(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
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

/// `initial_states`, `final_state` of `conformance/spec/ops-delta-rule.md` §4 on the GPU.
fn fwd_h_merge_gpu(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    let gpu = gpu()?;
    let hm = upload(gpu, input(inputs, "hm")?)?;
    let offs = indices(inputs, "subseq_offsets")?;
    let h0 = opt_upload(gpu, inputs, "initial_state")?;
    let params = d::FwdHMergeParams {
        state_v_first: p.bool("state_v_first")?,
        output_final_state: p.bool("output_final_state")?,
    };
    let o = attn_gpu::fwd_h_merge(gpu, &hm, h0.as_ref(), &offs, &params)?;
    let mut out = Tensors::new();
    out.insert("initial_states".into(), download(gpu, &o.initial_states)?);
    if let Some(t) = o.final_state {
        out.insert("final_state".into(), download(gpu, &t)?);
    }
    Ok(out)
}

const CHUNK_GATED_DELTA_RULE_FWD_H_SPLIT: OpSpec = OpSpec {
    id: "chunk_gated_delta_rule_fwd_h_split",
    summary: "fwd_h through chunk-aligned sub-sequences: pre-scan, merge, fwd_h (same result)",
    inputs: fwd_h_inputs![
        INITIAL_STATE,
        CU_SEQLENS,
        s::index("subseq_cu_seqlens", false, "[S + 1]"),
        s::index("warmup_chunks", false, "[S]"),
    ],
    params: &[P_CHUNK64, P_FINAL, P_SAVE_V, P_V_FIRST],
    outputs: &SPLIT_OUTPUTS,
    cpu: chunk_gated_delta_rule_fwd_h_split_cpu,
    gpu: Some(chunk_gated_delta_rule_fwd_h_split_gpu),
    cp: None,
    section: "conformance/spec/ops-delta-rule.md §5",
};

/// Section 2's outputs through the split of `conformance/spec/ops-delta-rule.md` §5, with the
/// warm-up pieces of §5.9 when the case has `warmup_chunks`.
fn chunk_gated_delta_rule_fwd_h_split_cpu(
    inputs: &Tensors,
    p: &Params,
) -> Result<Tensors, Problem> {
    let f = FwdH::read(inputs)?;
    let subseq = opt_indices(inputs, "subseq_cu_seqlens")?;
    let warmup = opt_indices(inputs, "warmup_chunks")?;
    let o = d::chunk_gated_delta_rule_fwd_h_split(
        &d::FwdHSplitInputs {
            fwd_h: f.inputs(),
            subseq_cu_seqlens: subseq.as_deref(),
            warmup_chunks: warmup.as_deref(),
        },
        &fwd_h_params(p)?,
    )?;
    Ok(fwd_h_outputs(o))
}

/// Section 2's outputs through the GPU split: the case's `subseq_cu_seqlens` (and
/// `warmup_chunks`, `conformance/spec/ops-delta-rule.md` §5.9) when it has them, the auto policy
/// (split or serial) otherwise. `warmup_chunks` without `subseq_cu_seqlens` is refused before any
/// device work ([`warmups_need_pieces`]); the device validates the rest as the reference does.
fn chunk_gated_delta_rule_fwd_h_split_gpu(
    inputs: &Tensors,
    p: &Params,
) -> Result<Tensors, Problem> {
    let subseq = opt_indices(inputs, "subseq_cu_seqlens")?;
    let warmup = opt_indices(inputs, "warmup_chunks")?;
    warmups_need_pieces(subseq.is_some(), warmup.is_some())?;
    let gpu = gpu()?;
    let t = FwdHDevice::upload(inputs)?;
    let cu = opt_indices(inputs, "cu_seqlens")?;
    let mode = match (subseq.as_deref(), warmup.as_deref()) {
        (Some(s), Some(w)) => attn_gpu::SplitMode::Warmup {
            subseq_cu_seqlens: s,
            warmup_chunks: w,
        },
        (Some(s), None) => attn_gpu::SplitMode::Pieces(s),
        _ => attn_gpu::SplitMode::Auto,
    };
    let o = attn_gpu::chunk_gated_delta_rule_fwd_h_split(
        gpu,
        &t.tensors(),
        cu.as_deref(),
        mode,
        &fwd_h_params(p)?,
    )?;
    fwd_h_downloads(gpu, o)
}

/// `warmup_chunks` requires `subseq_cu_seqlens` (§5.6): the error of the reference's
/// `validate_warmup_chunks`, named `warmup_chunks`, raised on the host.
pub fn warmups_need_pieces(subseq_given: bool, warmup_given: bool) -> Result<(), Problem> {
    if warmup_given && !subseq_given {
        return Err(attn_reference::Error::missing(
            "warmup_chunks",
            "subseq_cu_seqlens alongside warmup_chunks (warm-ups need explicit pieces)",
            "warmup_chunks without subseq_cu_seqlens",
        )
        .into());
    }
    Ok(())
}

const KDA_INTRA: OpSpec = OpSpec {
    id: "kda_intra",
    summary: "KDA intra-chunk stage: Aqk, Akk = (I + L)^-1, WY factors w, u, gated keys kg",
    inputs: &[
        s::float("q", true, "[B, T, H, K]", "float (q, k, v share one dtype)"),
        s::float("k", true, "[B, T, H, K]", "float, as q"),
        s::float("v", true, "[B, T, HV, V]", "float, as q"),
        s::float("gk", true, "[B, T, HV, K]", "float"),
        s::float("beta", true, "[B, T, HV]", "float"),
        CU_SEQLENS,
    ],
    params: &[P_SCALE, P_CHUNK64, P_SAFE_GATE],
    outputs: &[
        intra_output!("w", "[B, T, HV, K]", "k"),
        intra_output!("u", "[B, T, HV, V]", "v"),
        intra_output!("kg", "[B, T, HV, K]", "k"),
        intra_output!("Aqk", "[B, T, HV, BT]", "k"),
        intra_output!("Akk", "[B, T, HV, BT]", "k"),
    ],
    cpu: kda_intra_cpu,
    gpu: Some(kda_intra_gpu),
    cp: None,
    section: "conformance/spec/ops-delta-rule.md §7",
};

fn kda_intra_params(p: &Params) -> Result<d::KdaIntraParams, Problem> {
    Ok(d::KdaIntraParams {
        scale: p.opt_f64("scale")?,
        chunk_size: p.int("chunk_size")?,
        safe_gate: p.bool("safe_gate")?,
    })
}

/// `w, u, kg, Aqk, Akk` of `conformance/spec/ops-delta-rule.md` §7.
fn kda_intra_cpu(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    let x = Qkv::read(inputs, &[])?;
    let gk = float_dim::<Ix4>(inputs, "gk")?;
    let params = kda_intra_params(p)?;
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

/// The same outputs from `attn-gpu`'s intra kernel, on the inputs in their own dtypes.
fn kda_intra_gpu(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    let gpu = gpu()?;
    let params = kda_intra_params(p)?;
    let cu = opt_indices(inputs, "cu_seqlens")?;
    let t = ["q", "k", "v", "gk", "beta"]
        .into_iter()
        .map(|n| upload(gpu, input(inputs, n)?))
        .collect::<Result<Vec<_>, Problem>>()?;
    let o = attn_gpu::kda_intra(
        gpu,
        &attn_gpu::KdaIntraTensors {
            q: &t[0],
            k: &t[1],
            v: &t[2],
            gk: &t[3],
            beta: &t[4],
        },
        cu.as_deref(),
        &params,
    )?;
    let mut out = Tensors::new();
    for (name, x) in [
        ("w", &o.w),
        ("u", &o.u),
        ("kg", &o.kg),
        ("Aqk", &o.aqk),
        ("Akk", &o.akk),
    ] {
        out.insert(name.into(), download(gpu, x)?);
    }
    Ok(out)
}

/// The tensors of a forward case on the device (`conformance/spec/ops-delta-rule.md` §6.1, 8.1).
struct ForwardDevice {
    t: Vec<attn_gpu::DeviceTensor>,
    h0: Option<attn_gpu::DeviceTensor>,
    a_log: Option<attn_gpu::DeviceTensor>,
    dt_bias: Option<attn_gpu::DeviceTensor>,
    cu: Option<Vec<i64>>,
}

impl ForwardDevice {
    fn upload(gpu: &attn_gpu::Gpu, inputs: &Tensors) -> Result<ForwardDevice, Problem> {
        Ok(ForwardDevice {
            t: ["q", "k", "v", "g", "beta"]
                .into_iter()
                .map(|n| upload(gpu, input(inputs, n)?))
                .collect::<Result<Vec<_>, Problem>>()?,
            h0: opt_upload(gpu, inputs, "initial_state")?,
            a_log: opt_upload(gpu, inputs, "A_log")?,
            dt_bias: opt_upload(gpu, inputs, "dt_bias")?,
            cu: opt_indices(inputs, "cu_seqlens")?,
        })
    }

    fn tensors(&self) -> attn_gpu::ForwardTensors<'_> {
        attn_gpu::ForwardTensors {
            initial_state: self.h0.as_ref(),
            a_log: self.a_log.as_ref(),
            dt_bias: self.dt_bias.as_ref(),
            ..attn_gpu::ForwardTensors::new(
                &self.t[0], &self.t[1], &self.t[2], &self.t[3], &self.t[4],
            )
        }
    }
}

/// Uploads a forward case's tensors, runs `run` (one of `attn-gpu`'s forwards) on them and
/// downloads `o` and the final state.
fn forward_gpu(
    inputs: &Tensors,
    run: impl FnOnce(
        &attn_gpu::Gpu,
        &attn_gpu::ForwardTensors<'_>,
        Option<&[i64]>,
    ) -> attn_gpu::GpuResult<attn_gpu::DeltaFwdDeviceOutputs>,
) -> Result<Tensors, Problem> {
    let gpu = gpu()?;
    let x = ForwardDevice::upload(gpu, inputs)?;
    let o = run(gpu, &x.tensors(), x.cu.as_deref())?;
    let mut out = Tensors::new();
    out.insert("o".into(), download(gpu, &o.o)?);
    if let Some(f) = o.final_state {
        out.insert("final_state".into(), download(gpu, &f)?);
    }
    Ok(out)
}

/// `o` and the final states of a forward by the context-parallel path over the GPUs of `group`
/// (the case's tokens partitioned by chunks).
fn forward_cp(group: &CpGroup, inputs: &Tensors, op: cp::CpForward) -> Result<Tensors, Problem> {
    let cu = opt_indices(inputs, "cu_seqlens")?;
    let x = cp::HostForwardInputs {
        q: host(inputs, "q")?,
        k: host(inputs, "k")?,
        v: host(inputs, "v")?,
        g: host(inputs, "g")?,
        beta: host(inputs, "beta")?,
        initial_state: opt_host(inputs, "initial_state")?,
        a_log: opt_host(inputs, "A_log")?,
        dt_bias: opt_host(inputs, "dt_bias")?,
        cu_seqlens: cu.as_deref(),
    };
    let o = cp::cp_forward_host(
        group,
        &x,
        op,
        CP_MIN_PIECE_CHUNKS,
        attn_gpu::ForwardPath::Auto,
    )?;
    Ok(from_hosts(vec![
        ("o", Some(o.o)),
        ("final_state", o.final_state),
    ]))
}

const KDA_FWD: OpSpec = OpSpec {
    id: "kda_fwd",
    summary: "Kimi Delta Attention forward (recurrent definition), in-kernel gate/beta/l2norm",
    inputs: forward_inputs![
        "[B, T, HV, K]";
        s::float("A_log", false, "[HV]", "float (with use_gate_in_kernel)"),
        s::float("dt_bias", false, "[HV * K]", "float (with use_gate_in_kernel)"),
        CU_SEQLENS,
    ],
    params: &[
        P_SCALE,
        P_FINAL,
        P_L2NORM,
        s::param("use_gate_in_kernel", ParamType::Bool, Some("false")),
        P_LOWER,
        s::param("use_beta_sigmoid_in_kernel", ParamType::Bool, Some("false")),
        s::param("allow_neg_eigval", ParamType::Bool, Some("false")),
        P_SAFE_GATE,
        P_CHUNK64,
        P_V_FIRST,
    ],
    outputs: &FORWARD_OUTPUTS,
    cpu: kda_fwd_cpu,
    gpu: Some(kda_fwd_gpu),
    cp: Some(kda_fwd_cp),
    section: "conformance/spec/ops-delta-rule.md §6",
};

fn kda_fwd_params(p: &Params) -> Result<d::KdaFwdParams, Problem> {
    Ok(d::KdaFwdParams {
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
    })
}

/// `o`, `final_state` of `conformance/spec/ops-delta-rule.md` §6 (the recurrent definition).
fn kda_fwd_cpu(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    let x = Qkv::read(inputs, &["initial_state"])?;
    let g = float_dim::<Ix4>(inputs, "g")?;
    let h0 = opt_float_dim::<Ix4>(inputs, "initial_state")?;
    let a_log = opt_float_dim::<Ix1>(inputs, "A_log")?;
    let dt_bias = opt_float_dim::<Ix1>(inputs, "dt_bias")?;
    let params = kda_fwd_params(p)?;
    let inp = d::KdaFwdInputs {
        initial_state: h0.as_ref().map(|a| a.view()),
        a_log: a_log.as_ref().map(|a| a.view()),
        dt_bias: dt_bias.as_ref().map(|a| a.view()),
        cu_seqlens: x.cu.as_deref(),
        ..d::KdaFwdInputs::new(x.q.view(), x.k.view(), x.v.view(), g.view(), x.beta.view())
    };
    Ok(forward_outputs(d::kda_fwd(&inp, &params)?))
}

/// The same outputs from `attn-gpu`'s forward (fused where it applies), on the inputs in their
/// own dtypes.
fn kda_fwd_gpu(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    let params = kda_fwd_params(p)?;
    forward_gpu(inputs, |gpu, t, cu| {
        attn_gpu::kda_fwd(gpu, t, cu, &params, attn_gpu::ForwardPath::Auto)
    })
}

/// The same outputs by the context-parallel path over the GPUs of `group`.
fn kda_fwd_cp(group: &CpGroup, inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    forward_cp(group, inputs, cp::CpForward::Kda(kda_fwd_params(p)?))
}

const GDN_FWD: OpSpec = OpSpec {
    id: "gdn_fwd",
    summary: "Gated DeltaNet forward (recurrent definition), scalar gate per head",
    inputs: forward_inputs!["[B, T, HV]"; CU_SEQLENS],
    params: &[P_SCALE, P_FINAL, P_L2NORM, P_CHUNK64, P_V_FIRST],
    outputs: &FORWARD_OUTPUTS,
    cpu: gdn_fwd_cpu,
    gpu: Some(gdn_fwd_gpu),
    cp: Some(gdn_fwd_cp),
    section: "conformance/spec/ops-delta-rule.md §8",
};

fn gdn_fwd_params(p: &Params) -> Result<d::GdnFwdParams, Problem> {
    Ok(d::GdnFwdParams {
        scale: p.opt_f64("scale")?,
        output_final_state: p.bool("output_final_state")?,
        use_qk_l2norm_in_kernel: p.bool("use_qk_l2norm_in_kernel")?,
        chunk_size: p.int("chunk_size")?,
        state_v_first: p.bool("state_v_first")?,
    })
}

/// `o`, `final_state` of `conformance/spec/ops-delta-rule.md` §8 (the recurrent definition).
fn gdn_fwd_cpu(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    let x = Qkv::read(inputs, &["initial_state"])?;
    let g = float_dim::<Ix3>(inputs, "g")?;
    let h0 = opt_float_dim::<Ix4>(inputs, "initial_state")?;
    let params = gdn_fwd_params(p)?;
    let inp = d::GdnFwdInputs {
        initial_state: h0.as_ref().map(|a| a.view()),
        cu_seqlens: x.cu.as_deref(),
        ..d::GdnFwdInputs::new(x.q.view(), x.k.view(), x.v.view(), g.view(), x.beta.view())
    };
    Ok(forward_outputs(d::gdn_fwd(&inp, &params)?))
}

/// The same outputs from `attn-gpu`'s forward.
fn gdn_fwd_gpu(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    let params = gdn_fwd_params(p)?;
    forward_gpu(inputs, |gpu, t, cu| {
        attn_gpu::gdn_fwd(gpu, t, cu, &params, attn_gpu::ForwardPath::Auto)
    })
}

/// The same outputs by the context-parallel path over the GPUs of `group`.
fn gdn_fwd_cp(group: &CpGroup, inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    forward_cp(group, inputs, cp::CpForward::Gdn(gdn_fwd_params(p)?))
}

/// Sequences longer than this make a case "long" (`conformance/spec/ops-delta-rule.md` §1.6).
const LONG: usize = 4096;

/// `conformance/spec/ops-delta-rule.md` §1.4 for the present tensors: `main` share one float dtype,
/// `states` are f32/f64.
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

/// The section-2 tensors of a case on the device, in their own dtypes.
struct FwdHDevice {
    k: attn_gpu::DeviceTensor,
    w: attn_gpu::DeviceTensor,
    u: attn_gpu::DeviceTensor,
    g: Option<attn_gpu::DeviceTensor>,
    gk: Option<attn_gpu::DeviceTensor>,
    h0: Option<attn_gpu::DeviceTensor>,
}

impl FwdHDevice {
    fn upload(inputs: &Tensors) -> Result<FwdHDevice, Problem> {
        let gpu = gpu()?;
        Ok(FwdHDevice {
            k: upload(gpu, input(inputs, "k")?)?,
            w: upload(gpu, input(inputs, "w")?)?,
            u: upload(gpu, input(inputs, "u")?)?,
            g: opt_upload(gpu, inputs, "g")?,
            gk: opt_upload(gpu, inputs, "gk")?,
            h0: opt_upload(gpu, inputs, "initial_state")?,
        })
    }
    fn tensors(&self) -> attn_gpu::FwdHTensors<'_> {
        attn_gpu::FwdHTensors {
            k: &self.k,
            w: &self.w,
            u: &self.u,
            g: self.g.as_ref(),
            gk: self.gk.as_ref(),
            initial_state: self.h0.as_ref(),
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

/// The tensors every `q, k, v` op reads (`q, k, v, beta, cu_seqlens`), after the dtype rules
/// of `conformance/spec/ops-delta-rule.md` §1.4 (`q, k, v` share one float dtype, `states` are
/// f32/f64).
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

fn forward_outputs(o: d::DeltaFwdOutputs<f64>) -> Tensors {
    named(vec![
        ("o", Some(o.o.into_dyn())),
        ("final_state", o.final_state.map(|a| a.into_dyn())),
    ])
}

/// The class of the op's main input (`conformance/spec/ops-delta-rule.md` §1.6: `k`, `hm` or `q`),
/// or float64 when absent.
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

/// Whether some sequence of the case has more than 4096 tokens
/// (`conformance/spec/ops-delta-rule.md` §1.6 "long").
fn long(inputs: &Tensors, main: &str) -> bool {
    seq_lens(inputs, main).into_iter().any(|n| n > LONG)
}

/// The sequence lengths of the case: from `cu_seqlens`, else `T` of `main` `[B, T, ...]` (empty
/// when neither can be read).
fn seq_lens(inputs: &Tensors, main: &str) -> Vec<usize> {
    match opt_indices(inputs, "cu_seqlens") {
        Ok(Some(cu)) => cu
            .windows(2)
            .map(|w| w[1].saturating_sub(w[0]).max(0) as usize)
            .collect(),
        _ => (inputs.get(main).and_then(|x| x.shape().get(1).copied()))
            .into_iter()
            .collect(),
    }
}

/// The threshold row of `conformance/spec/ops-delta-rule.md` §1.6: a float64 candidate is held to
/// `1e-10`; otherwise the class of the main input picks `half` (or `half_long` for long cases),
/// `f32` or `1e-10`.
pub fn threshold(
    inputs: &Tensors,
    main: &str,
    candidate: DtypeClass,
    half: f64,
    half_long: f64,
    f32: f64,
) -> Rule {
    let long = long(inputs, main);
    threshold_when(long, inputs, main, candidate, (half, half_long, f32))
}

/// `o` and `final_state` of `kda_fwd` / `gdn_fwd` (§6.8, §8.8): half 5e-3, long 1e-2, float32
/// 1e-5, where "long" is §1.6's (a sequence of more than 4096 tokens) or, by §6.8, a sequence of
/// 1024 tokens or more when every per-step log decay `a` lies in `[−1e-3, 0]` (long memory; KDA's
/// in-kernel gate evaluated as the reference's `kda_gate`). Inputs the gate cannot be read from
/// count as not long memory (the runner reports them).
fn forward_threshold(inputs: &Tensors, p: &Params, candidate: DtypeClass) -> Rule {
    let longest = seq_lens(inputs, "q").into_iter().max().unwrap_or(0);
    let long = longest > LONG || (longest >= 1024 && long_memory(inputs, p).unwrap_or(false));
    threshold_when(long, inputs, "q", candidate, (5e-3, 1e-2, 1e-5))
}

/// Whether every per-step log decay of the case lies in `[−1e-3, 0]`.
fn long_memory(inputs: &Tensors, p: &Params) -> Result<bool, Problem> {
    let in_kernel = p.bool("use_gate_in_kernel").unwrap_or(false);
    let a = if in_kernel {
        let g = float_dim::<Ix4>(inputs, "g")?;
        let a_log = opt_float_dim::<Ix1>(inputs, "A_log")?;
        let dt_bias = opt_float_dim::<Ix1>(inputs, "dt_bias")?;
        attn_reference::gate::kda_gate(
            g.view(),
            a_log.as_ref().map(|a| a.view()),
            dt_bias.as_ref().map(|a| a.view()),
            p.opt_f64("lower_bound")?,
        )?
        .into_dyn()
    } else {
        super::float(inputs, "g")?
    };
    Ok(a.iter().all(|&x| (-1e-3..=0.0).contains(&x)))
}

/// The rows of [`threshold`] with "long" given: `(half, half_long, f32)`.
fn threshold_when(
    long: bool,
    inputs: &Tensors,
    main: &str,
    candidate: DtypeClass,
    (half, half_long, f32): (f64, f64, f64),
) -> Rule {
    if candidate == DtypeClass::Float64 {
        return Rule::Threshold(1e-10);
    }
    Rule::Threshold(match main_class(inputs, main) {
        DtypeClass::Half if long => half_long,
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
