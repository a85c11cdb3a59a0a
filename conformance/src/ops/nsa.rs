//! Native sparse attention, `conformance/spec/ops-nsa.md`: `nsa_compress_kv`,
//! `nsa_compression_attention`, `nsa_select_blocks`, `nsa_selection_attention`, `nsa_gate_combine`,
//! `nsa_fwd`. Each op's registry entry, its float64 CPU runner (`<op>_cpu`) and its GPU runner
//! (`<op>_gpu`), side by side.
//!
//! Comparison (§9): float outputs by the rule of `conformance/spec/README.md` (`lse`'s `-inf`
//! positions must match both ways, which the rule's non-finite check already demands);
//! `block_indices` by the index rule ([`crate::index_rule`]), the reference adding its block
//! scores as `block_indices.scores`; `nsa_fwd`'s `o` against the reference computed from the
//! candidate's `block_indices` when the case has them (§7, [`TAKEN_FROM_CANDIDATE`]).

use super::device::{download, gpu, opt_upload, upload};
use super::{float_dim, input, opt_float_dim, opt_indices, P_SCALE};
use crate::case::Tensors;
use crate::compare::{IndexMode, IndexRule, Rule};
use crate::error::Problem;
use crate::params::{ParamSpec, ParamType, Params};
use crate::spec::{self as s, InputSpec, OpSpec, OutputSpec};
use crate::tensor::Tensor;
use attn_reference::nsa::nsa_fwd::FwdGates;
use attn_reference::nsa::{self as nsa, BlockCounts, EmptyLse, Gates, PartialBlock};
use attn_reference::nsa::{SelectMode, Visibility};
use attn_reference::{DtypeClass, Error};
use ndarray::{Array, Array3, ArrayD, Dimension, Ix3, Ix4, IxDyn};
use std::str::FromStr;

pub const OPS: &[OpSpec] = &[
    NSA_COMPRESS_KV,
    NSA_COMPRESSION_ATTENTION,
    NSA_SELECT_BLOCKS,
    NSA_SELECTION_ATTENTION,
    NSA_GATE_COMBINE,
    NSA_FWD,
];

/// `(op, output)`: `nsa_fwd`'s reference `o` is computed from the candidate's `block_indices`
/// when the case holds them (`conformance/spec/ops-nsa.md` §7), so that a near-tie flip cannot fail
/// `o`.
pub const TAKEN_FROM_CANDIDATE: &[(&str, &str)] = &[("nsa_fwd", "block_indices")];

const P_BLOCK_SIZE: ParamSpec = s::param("block_size", ParamType::Int, Some("64"));
const P_PARTIAL: ParamSpec = s::param(
    "partial_block",
    ParamType::Str(&["mean_of_valid", "drop"]),
    Some("\"mean_of_valid\""),
);
/// The integer form of `block_counts`; `null` = absent (the op's default applies).
const P_COUNTS: ParamSpec = s::param("block_counts", ParamType::OptInt, Some("null"));

/// An output whose dtype is that of input `like` (`q`, `k`, `o_cmp`) — written per op, since
/// entries take plain `fn`s.
fn o_rule(_: &Tensors, _: &Params, c: DtypeClass) -> Rule {
    Rule::default_for(c)
}

/// `lse` (and `gates`) are float32 whatever the inputs.
fn f32_class(_: &Tensors, _: &Params) -> Result<DtypeClass, Problem> {
    Ok(DtypeClass::Float32)
}

/// `lse`: the threshold of `conformance/spec/README.md` for the inputs' precision (half inputs:
/// 5e-3), else for the class the candidate computed it in.
fn lse_rule(inputs: &Tensors, _: &Params, class: DtypeClass) -> Rule {
    match inputs.get("q").map(|q| q.dtype().class()) {
        Some(DtypeClass::Half) => Rule::Threshold(5e-3),
        _ => Rule::default_for(class),
    }
}

const LSE: OutputSpec = OutputSpec {
    name: "lse",
    optional: true,
    class: f32_class,
    rule: lse_rule,
    parts: &[],
    shape: "[B, T, HQ]",
    dtype: "float32",
    present: "always (a case may leave it out: FLA's naive functions do not return it)",
};

const CU_SEQLENS: InputSpec = s::index("cu_seqlens", false, "[N + 1]");
const Q: InputSpec = s::float("q", true, "[B, T, HQ, K]", "float");
/// `o` of the attention branches: `[B, T, HQ, V]` in the dtype of `q`.
const O: OutputSpec = s::output(
    "o",
    "[B, T, HQ, V]",
    "dtype of q",
    |i, _| super::class_of(i, "q"),
    o_rule,
);

/// The near-tie band of §9 by the candidate's precision, read from `q`'s dtype: float64 1e-9,
/// float32 1e-4, bf16/fp16 inputs 5e-2.
fn delta(inputs: &Tensors) -> f64 {
    match inputs.get("q").map(|q| q.dtype().class()) {
        Some(DtypeClass::Float64) => 1e-9,
        Some(DtypeClass::Half) => 5e-2,
        _ => 1e-4,
    }
}

fn int_class(_: &Tensors, _: &Params) -> Result<DtypeClass, Problem> {
    Ok(DtypeClass::Int)
}

/// `block_indices` of mode `"fla"` (and of `nsa_fwd`): rows as sets.
fn set_rule(inputs: &Tensors, _: &Params, _: DtypeClass) -> Rule {
    Rule::Index(IndexRule {
        mode: IndexMode::Set,
        delta: delta(inputs),
    })
}

/// `block_indices` of `nsa_select_blocks`: sets for `"fla"`, sorted rows for tile means.
fn select_rule(inputs: &Tensors, p: &Params, _: DtypeClass) -> Rule {
    let mode = match p.str("mode") {
        Ok("mslk_tile_mean") => IndexMode::Sorted,
        _ => IndexMode::Set,
    };
    Rule::Index(IndexRule {
        mode,
        delta: delta(inputs),
    })
}

// ------------------------------------------------------------------------- input helpers

/// Every present input of `names` has the dtype of `like` (`conformance/spec/ops-nsa.md` §1: one
/// float dtype per call).
fn same_dtype(inputs: &Tensors, like: &str, names: &[&str]) -> Result<(), Problem> {
    let d = input(inputs, like)?.dtype();
    for name in names {
        if let Some(t) = inputs.get(*name) {
            if t.dtype() != d {
                let expected = format!("the dtype of {like} ({d})");
                return Err(Error::dtype(*name, expected, t.dtype().name()).into());
            }
        }
    }
    Ok(())
}

/// Optional index input `name` with rank `D`, as `i64`.
fn opt_index_dim<D: Dimension>(
    inputs: &Tensors,
    name: &str,
) -> Result<Option<Array<i64, D>>, Problem> {
    let Some(t) = inputs.get(name) else {
        return Ok(None);
    };
    let flat = t.to_indices(name)?;
    let a = ArrayD::from_shape_vec(IxDyn(t.shape()), flat).expect("shape of its own elements");
    let rank = D::NDIM.map_or("a fixed rank".to_string(), |n| format!("rank {n}"));
    a.into_dimensionality::<D>()
        .map(Some)
        .map_err(|_| Error::shape(name, rank, t.shape()).into())
}

/// `cu_seqlens`, when given.
fn cu(inputs: &Tensors) -> Result<Option<Vec<i64>>, Problem> {
    opt_indices(inputs, "cu_seqlens")
}

/// The call's `block_counts`: the integer parameter or the `[B, T, H]` tensor `counts` (at most
/// one of them), or none.
fn block_counts<'a>(
    p: &Params,
    counts: &'a Option<Array3<i64>>,
) -> Result<Option<BlockCounts<'a>>, Problem> {
    Ok(BlockCounts::from_parts(
        p.opt_int("block_counts")?,
        counts.as_ref().map(|c| c.view()),
    )?)
}

fn f64_out(name: &str, a: ArrayD<f64>) -> (String, Tensor) {
    (name.to_string(), Tensor::F64(a))
}

fn i32_out(name: &str, a: ArrayD<i32>) -> (String, Tensor) {
    (name.to_string(), Tensor::I32(a))
}

// ---------------------------------------------------------------------- nsa_compress_kv

const NSA_COMPRESS_KV: OpSpec = OpSpec {
    id: "nsa_compress_kv",
    summary: "block means of k and v (mean_of_valid | drop), optional per-head projection",
    inputs: &[
        s::float("k", true, "[B, T, H, K]", "float"),
        s::float("v", false, "[B, T, H, V]", "float, as k"),
        s::float("w_k", false, "[H, K, K]", "float"),
        s::float("w_v", false, "[H, V, V]", "float (needs v)"),
        CU_SEQLENS,
    ],
    params: &[P_BLOCK_SIZE, P_PARTIAL],
    outputs: &[
        s::output(
            "k_cmp",
            "[B, TC, H, K] (varlen: [1, sum TC_n, H, K])",
            "dtype of k",
            |i, _| super::class_of(i, "k"),
            o_rule,
        ),
        s::output(
            "v_cmp",
            "[B, TC, H, V] (varlen: [1, sum TC_n, H, V])",
            "dtype of v",
            |i, _| super::class_of(i, "v"),
            o_rule,
        )
        .when("when v is given"),
    ],
    cpu: nsa_compress_kv_cpu,
    gpu: Some(nsa_compress_kv_gpu),
    cp: None,
    section: "conformance/spec/ops-nsa.md §2",
};

/// `(k_cmp, v_cmp) = nsa_compress_kv(...)` in float64 (weights of any float dtype, widened).
fn nsa_compress_kv_cpu(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    same_dtype(inputs, "k", &["v"])?;
    let k = float_dim::<Ix4>(inputs, "k")?;
    let v = opt_float_dim::<Ix4>(inputs, "v")?;
    let w_k = opt_float_dim::<Ix3>(inputs, "w_k")?;
    let w_v = opt_float_dim::<Ix3>(inputs, "w_v")?;
    let r = nsa::nsa_compress_kv(
        k.view(),
        v.as_ref().map(|a| a.view()),
        w_k.as_ref().map(|a| a.view()),
        w_v.as_ref().map(|a| a.view()),
        cu(inputs)?.as_deref(),
        p.int("block_size")?,
        PartialBlock::from_str(p.str("partial_block")?)?,
    )?;
    let mut out = Tensors::from([f64_out("k_cmp", r.k_cmp.into_dyn())]);
    if let Some(v_cmp) = r.v_cmp {
        out.extend([f64_out("v_cmp", v_cmp.into_dyn())]);
    }
    Ok(out)
}

/// `nsa_compress_kv` on the GPU: one pass over `k` and `v`, outputs in `k`'s dtype.
fn nsa_compress_kv_gpu(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    let gpu = gpu()?;
    let k = upload(gpu, input(inputs, "k")?)?;
    let [v, w_k, w_v] = ["v", "w_k", "w_v"].map(|n| opt_upload(gpu, inputs, n));
    let (v, w_k, w_v) = (v?, w_k?, w_v?);
    let x = attn_gpu::CompressInputs {
        k: &k,
        v: v.as_ref(),
        w_k: w_k.as_ref(),
        w_v: w_v.as_ref(),
    };
    let (k_cmp, v_cmp) = attn_gpu::nsa_compress_kv(
        gpu,
        &x,
        cu(inputs)?.as_deref(),
        p.int("block_size")?,
        PartialBlock::from_str(p.str("partial_block")?)?,
    )?;
    let mut out = Tensors::from([("k_cmp".to_string(), download(gpu, &k_cmp)?)]);
    if let Some(v_cmp) = v_cmp {
        out.insert("v_cmp".into(), download(gpu, &v_cmp)?);
    }
    Ok(out)
}

// ------------------------------------------------------------ nsa_compression_attention

const NSA_COMPRESSION_ATTENTION: OpSpec = OpSpec {
    id: "nsa_compression_attention",
    summary: "each query attends to its visible compressed blocks (complete | started | all)",
    inputs: &[
        Q,
        s::float(
            "k_cmp",
            true,
            "[B, TC, H, K] (varlen packed)",
            "float, as q",
        ),
        s::float(
            "v_cmp",
            true,
            "[B, TC, H, V] (varlen packed)",
            "float, as q",
        ),
        CU_SEQLENS,
    ],
    params: &[
        P_BLOCK_SIZE,
        P_SCALE,
        s::param(
            "visibility",
            ParamType::Str(&["complete", "started", "all"]),
            Some("\"complete\""),
        ),
        P_PARTIAL,
        s::param(
            "empty_lse",
            ParamType::Str(&["-inf", "zero"]),
            Some("\"-inf\""),
        ),
    ],
    outputs: &[O, LSE],
    cpu: nsa_compression_attention_cpu,
    gpu: Some(nsa_compression_attention_gpu),
    cp: None,
    section: "conformance/spec/ops-nsa.md §3",
};

/// `(o, lse) = nsa_compression_attention(...)` in float64.
fn nsa_compression_attention_cpu(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    same_dtype(inputs, "q", &["k_cmp", "v_cmp"])?;
    let q = float_dim::<Ix4>(inputs, "q")?;
    let k_cmp = float_dim::<Ix4>(inputs, "k_cmp")?;
    let v_cmp = float_dim::<Ix4>(inputs, "v_cmp")?;
    let r = nsa::nsa_compression_attention(
        q.view(),
        k_cmp.view(),
        v_cmp.view(),
        cu(inputs)?.as_deref(),
        p.int("block_size")?,
        p.opt_f64("scale")?,
        Visibility::from_str(p.str("visibility")?)?,
        PartialBlock::from_str(p.str("partial_block")?)?,
        EmptyLse::from_str(p.str("empty_lse")?)?,
    )?;
    Ok(Tensors::from([
        f64_out("o", r.o.into_dyn()),
        f64_out("lse", r.lse.into_dyn()),
    ]))
}

/// `nsa_compression_attention` on the GPU (`o` in `q`'s dtype, `lse` float32).
fn nsa_compression_attention_gpu(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    let gpu = gpu()?;
    let [q, k_cmp, v_cmp] = ["q", "k_cmp", "v_cmp"].map(|n| upload(gpu, input(inputs, n)?));
    let (q, k_cmp, v_cmp) = (q?, k_cmp?, v_cmp?);
    let x = attn_gpu::CmpAttnInputs {
        q: &q,
        k_cmp: &k_cmp,
        v_cmp: &v_cmp,
    };
    let params = attn_gpu::CmpAttnParams {
        block_size: p.int("block_size")?,
        scale: p.opt_f64("scale")?,
        visibility: Visibility::from_str(p.str("visibility")?)?,
        partial_block: PartialBlock::from_str(p.str("partial_block")?)?,
        empty_lse: EmptyLse::from_str(p.str("empty_lse")?)?,
    };
    let (o, lse) = attn_gpu::nsa_compression_attention(gpu, &x, cu(inputs)?.as_deref(), &params)?;
    Ok(Tensors::from([
        ("o".to_string(), download(gpu, &o)?),
        ("lse".to_string(), download(gpu, &lse)?),
    ]))
}

// --------------------------------------------------------------------- nsa_select_blocks

const NSA_SELECT_BLOCKS: OpSpec = OpSpec {
    id: "nsa_select_blocks",
    summary: "block importance and top-k per row (fla | mslk_tile_mean)",
    inputs: &[
        Q,
        s::float(
            "k_cmp",
            true,
            "[B, TC, H, K] (varlen packed)",
            "float, as q",
        ),
        s::index("block_counts", false, "[B, T, H] (mode fla)"),
        CU_SEQLENS,
    ],
    params: &[
        s::param(
            "mode",
            ParamType::Str(&["fla", "mslk_tile_mean"]),
            Some("\"fla\""),
        ),
        P_BLOCK_SIZE,
        P_COUNTS,
        P_SCALE,
        s::param("q_tile_size", ParamType::Int, Some("256")),
        s::param("causal", ParamType::Bool, Some("true")),
    ],
    outputs: &[s::output(
        "block_indices",
        "[B, T, H, S] (fla) or [B, NQ, HQ, S_m] (mslk_tile_mean)",
        "int32",
        int_class,
        select_rule,
    )],
    cpu: nsa_select_blocks_cpu,
    gpu: Some(nsa_select_blocks_gpu),
    cp: None,
    section: "conformance/spec/ops-nsa.md §4",
};

/// `block_indices = nsa_select_blocks(...)` (int32), with `block_indices.scores` (float64).
fn nsa_select_blocks_cpu(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    same_dtype(inputs, "q", &["k_cmp"])?;
    let q = float_dim::<Ix4>(inputs, "q")?;
    let k_cmp = float_dim::<Ix4>(inputs, "k_cmp")?;
    let counts = opt_index_dim::<Ix3>(inputs, "block_counts")?;
    let bc = block_counts(p, &counts)?;
    let r = nsa::nsa_select_blocks(
        q.view(),
        k_cmp.view(),
        bc,
        cu(inputs)?.as_deref(),
        p.int("block_size")?,
        p.opt_f64("scale")?,
        SelectMode::from_str(p.str("mode")?)?,
        p.int("q_tile_size")?,
        p.bool("causal")?,
    )?;
    Ok(Tensors::from([
        i32_out("block_indices", r.block_indices.into_dyn()),
        f64_out("block_indices.scores", r.scores.into_dyn()),
    ]))
}

/// `nsa_select_blocks` on the GPU (int32 `block_indices`; the scores stay the reference's).
fn nsa_select_blocks_gpu(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    let gpu = gpu()?;
    let q = upload(gpu, input(inputs, "q")?)?;
    let k_cmp = upload(gpu, input(inputs, "k_cmp")?)?;
    let counts = opt_index_dim::<Ix3>(inputs, "block_counts")?;
    let bc = block_counts(p, &counts)?;
    let x = attn_gpu::SelectInputs {
        q: &q,
        k_cmp: &k_cmp,
    };
    let idx = attn_gpu::nsa_select_blocks(
        gpu,
        &x,
        bc,
        cu(inputs)?.as_deref(),
        p.int("block_size")?,
        p.opt_f64("scale")?,
        SelectMode::from_str(p.str("mode")?)?,
        p.int("q_tile_size")?,
        p.bool("causal")?,
    )?;
    Ok(Tensors::from([(
        "block_indices".to_string(),
        download(gpu, &idx)?,
    )]))
}

// --------------------------------------------------------------- nsa_selection_attention

const NSA_SELECTION_ATTENTION: OpSpec = OpSpec {
    id: "nsa_selection_attention",
    summary: "each query attends to the tokens of its selected blocks (multiset, causal)",
    inputs: &[
        Q,
        s::float("k", true, "[B, T, H, K]", "float, as q"),
        s::float("v", true, "[B, T, H, V]", "float, as q"),
        s::index("block_indices", true, "[B, T, H, S]"),
        s::index("block_counts", false, "[B, T, H]"),
        CU_SEQLENS,
    ],
    params: &[P_BLOCK_SIZE, P_SCALE, P_COUNTS],
    outputs: &[O, LSE],
    cpu: nsa_selection_attention_cpu,
    gpu: Some(nsa_selection_attention_gpu),
    cp: None,
    section: "conformance/spec/ops-nsa.md §5",
};

/// `(o, lse) = nsa_selection_attention(...)` in float64.
fn nsa_selection_attention_cpu(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    same_dtype(inputs, "q", &["k", "v"])?;
    let q = float_dim::<Ix4>(inputs, "q")?;
    let k = float_dim::<Ix4>(inputs, "k")?;
    let v = float_dim::<Ix4>(inputs, "v")?;
    let idx = opt_index_dim::<Ix4>(inputs, "block_indices")?
        .ok_or_else(|| Problem::MissingInput("block_indices".into()))?;
    let counts = opt_index_dim::<Ix3>(inputs, "block_counts")?;
    let bc = block_counts(p, &counts)?;
    let r = nsa::nsa_selection_attention(
        q.view(),
        k.view(),
        v.view(),
        idx.view(),
        bc,
        cu(inputs)?.as_deref(),
        p.int("block_size")?,
        p.opt_f64("scale")?,
    )?;
    Ok(Tensors::from([
        f64_out("o", r.o.into_dyn()),
        f64_out("lse", r.lse.into_dyn()),
    ]))
}

/// `nsa_selection_attention` on the GPU (`block_indices` uploaded in their own integer dtype,
/// the `block_counts` tensor checked on the host).
fn nsa_selection_attention_gpu(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    let gpu = gpu()?;
    let [q, k, v, idx] = ["q", "k", "v", "block_indices"].map(|n| upload(gpu, input(inputs, n)?));
    let (q, k, v, idx) = (q?, k?, v?, idx?);
    let counts = opt_index_dim::<Ix3>(inputs, "block_counts")?;
    let bc = block_counts(p, &counts)?;
    let x = attn_gpu::SelAttnInputs {
        q: &q,
        k: &k,
        v: &v,
        block_indices: &idx,
    };
    let (o, lse) = attn_gpu::nsa_selection_attention(
        gpu,
        &x,
        bc,
        cu(inputs)?.as_deref(),
        p.int("block_size")?,
        p.opt_f64("scale")?,
    )?;
    Ok(Tensors::from([
        ("o".to_string(), download(gpu, &o)?),
        ("lse".to_string(), download(gpu, &lse)?),
    ]))
}

// ---------------------------------------------------------------------- nsa_gate_combine

const NSA_GATE_COMBINE: OpSpec = OpSpec {
    id: "nsa_gate_combine",
    summary: "branch gates (W: sigmoid(q W), G: given, U: 1/3) and the gated sum",
    inputs: &[
        s::float("o_cmp", true, "[B, T, HQ, V]", "float"),
        s::float("o_slc", true, "[B, T, HQ, V]", "float, as o_cmp"),
        s::float("o_swa", true, "[B, T, HQ, V]", "float, as o_cmp"),
        s::float("q", false, "[B, T, HQ, K]", "float (W form)"),
        s::float("gate_proj_weight", false, "[HQ, 3, K]", "float (W form)"),
        s::float(
            "g_cmp",
            false,
            "[B, T, HQ]",
            "float (G form: all three or none)",
        ),
        s::float("g_slc", false, "[B, T, HQ]", "float (G form)"),
        s::float("g_swa", false, "[B, T, HQ]", "float (G form)"),
    ],
    params: &[],
    outputs: &[
        s::output(
            "o",
            "[B, T, HQ, V]",
            "dtype of o_cmp",
            |i, _| super::class_of(i, "o_cmp"),
            o_rule,
        ),
        OutputSpec {
            name: "gates",
            optional: true,
            class: f32_class,
            rule: o_rule,
            parts: &[],
            shape: "[B, T, HQ, 3]",
            dtype: "float32",
            present: "always (a case may leave it out)",
        },
    ],
    cpu: nsa_gate_combine_cpu,
    gpu: Some(nsa_gate_combine_gpu),
    cp: None,
    section: "conformance/spec/ops-nsa.md §6",
};

/// `(o, gates) = nsa_gate_combine(...)` in float64 (`q`, weights and given gates widened).
fn nsa_gate_combine_cpu(inputs: &Tensors, _: &Params) -> Result<Tensors, Problem> {
    same_dtype(inputs, "o_cmp", &["o_slc", "o_swa"])?;
    let o: Vec<_> = ["o_cmp", "o_slc", "o_swa"]
        .iter()
        .map(|n| float_dim::<Ix4>(inputs, n))
        .collect::<Result<_, _>>()?;
    let q = opt_float_dim::<Ix4>(inputs, "q")?;
    let w = opt_float_dim::<Ix3>(inputs, "gate_proj_weight")?;
    let g: Vec<_> = ["g_cmp", "g_slc", "g_swa"]
        .iter()
        .map(|n| opt_float_dim::<Ix3>(inputs, n))
        .collect::<Result<_, _>>()?;
    let gv = [0, 1, 2].map(|c| g[c].as_ref().map(|a| a.view()));
    let gates = Gates::from_parts(
        q.as_ref().map(|a| a.view()),
        w.as_ref().map(|a| a.view()),
        gv,
    )?;
    let r = nsa::nsa_gate_combine(o[0].view(), o[1].view(), o[2].view(), gates)?;
    Ok(Tensors::from([
        f64_out("o", r.o.into_dyn()),
        f64_out("gates", r.gates.into_dyn()),
    ]))
}

/// `nsa_gate_combine` on the GPU; the form is validated as the reference does (the inputs'
/// shapes only), then the tensors are uploaded in their own dtypes.
fn nsa_gate_combine_gpu(inputs: &Tensors, _: &Params) -> Result<Tensors, Problem> {
    let gpu = gpu()?;
    let names = ["q", "gate_proj_weight", "g_cmp", "g_slc", "g_swa"];
    // the form from which inputs are present (the reference's rules; shapes are the kernel's
    // to check): stand-in views of one element
    let one = [0u8];
    let bad = |e: ndarray::ShapeError| Problem::Device(e.to_string());
    let v3 = ndarray::ArrayView3::from_shape((1, 1, 1), &one[..]).map_err(bad)?;
    let v4 = ndarray::ArrayView4::from_shape((1, 1, 1, 1), &one[..]).map_err(bad)?;
    let has = |n: &str| inputs.contains_key(n);
    let g3 = ["g_cmp", "g_slc", "g_swa"].map(|n| has(n).then_some(v3));
    let form = Gates::from_parts(
        has("q").then_some(v4),
        has("gate_proj_weight").then_some(v3),
        g3,
    )?;
    let up: Vec<_> = names
        .iter()
        .map(|n| opt_upload(gpu, inputs, n))
        .collect::<Result<_, _>>()?;
    let gates = match form {
        Gates::W { .. } => attn_gpu::GateForm::W {
            q: up[0].as_ref().ok_or(Problem::MissingInput("q".into()))?,
            weight: up[1]
                .as_ref()
                .ok_or(Problem::MissingInput("gate_proj_weight".into()))?,
        },
        Gates::G(_) => attn_gpu::GateForm::G {
            g_cmp: up[2]
                .as_ref()
                .ok_or(Problem::MissingInput("g_cmp".into()))?,
            g_slc: up[3]
                .as_ref()
                .ok_or(Problem::MissingInput("g_slc".into()))?,
            g_swa: up[4]
                .as_ref()
                .ok_or(Problem::MissingInput("g_swa".into()))?,
        },
        Gates::U => attn_gpu::GateForm::U,
    };
    let [o_cmp, o_slc, o_swa] = ["o_cmp", "o_slc", "o_swa"].map(|n| upload(gpu, input(inputs, n)?));
    let (o_cmp, o_slc, o_swa) = (o_cmp?, o_slc?, o_swa?);
    let x = attn_gpu::CombineInputs {
        o_cmp: &o_cmp,
        o_slc: &o_slc,
        o_swa: &o_swa,
        gates,
    };
    let (o, g) = attn_gpu::nsa_gate_combine(gpu, &x)?;
    Ok(Tensors::from([
        ("o".to_string(), download(gpu, &o)?),
        ("gates".to_string(), download(gpu, &g)?),
    ]))
}

// ------------------------------------------------------------------------------- nsa_fwd

const NSA_FWD: OpSpec = OpSpec {
    id: "nsa_fwd",
    summary: "the whole FLA NSA forward: compressed, selected and window branches, gated",
    inputs: &[
        Q,
        s::float("k", true, "[B, T, H, K]", "float, as q"),
        s::float("v", true, "[B, T, H, V]", "float, as q"),
        s::float("g_cmp", false, "[B, T, HQ]", "float, as q"),
        s::float("g_slc", false, "[B, T, HQ]", "float, as q"),
        s::float("g_swa", false, "[B, T, HQ]", "float, as q"),
        s::index("block_indices", false, "[B, T, H, S]"),
        s::index("block_counts", false, "[B, T, H]"),
        CU_SEQLENS,
    ],
    params: &[
        P_BLOCK_SIZE,
        P_COUNTS,
        s::param("window_size", ParamType::Int, Some("0")),
        P_SCALE,
    ],
    outputs: &[
        O,
        OutputSpec {
            name: "block_indices",
            optional: true,
            class: int_class,
            rule: set_rule,
            parts: &[],
            shape: "[B, T, H, S]",
            dtype: "int32",
            present: "when the selection is computed (no block_indices input)",
        },
    ],
    cpu: nsa_fwd_cpu,
    gpu: Some(nsa_fwd_gpu),
    cp: None,
    section: "conformance/spec/ops-nsa.md §7",
};

/// `(o, block_indices) = nsa_fwd(...)` in float64; `block_indices` (with its scores) only when
/// the selection was computed.
fn nsa_fwd_cpu(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    same_dtype(inputs, "q", &["k", "v", "g_cmp", "g_slc", "g_swa"])?;
    let q = float_dim::<Ix4>(inputs, "q")?;
    let k = float_dim::<Ix4>(inputs, "k")?;
    let v = float_dim::<Ix4>(inputs, "v")?;
    let g: Vec<_> = ["g_cmp", "g_slc", "g_swa"]
        .iter()
        .map(|n| opt_float_dim::<Ix3>(inputs, n))
        .collect::<Result<_, _>>()?;
    let gates = FwdGates {
        g_cmp: g[0].as_ref().map(|a| a.view()),
        g_slc: g[1].as_ref().map(|a| a.view()),
        g_swa: g[2].as_ref().map(|a| a.view()),
    };
    let idx = opt_index_dim::<Ix4>(inputs, "block_indices")?;
    let counts = opt_index_dim::<Ix3>(inputs, "block_counts")?;
    let bc = block_counts(p, &counts)?;
    let r = nsa::nsa_fwd(
        q.view(),
        k.view(),
        v.view(),
        gates,
        idx.as_ref().map(|a| a.view()),
        bc,
        cu(inputs)?.as_deref(),
        p.int("block_size")?,
        p.int("window_size")?,
        p.opt_f64("scale")?,
    )?;
    let mut out = Tensors::from([f64_out("o", r.o.into_dyn())]);
    if let (Some(bi), Some(sc)) = (r.block_indices, r.scores) {
        out.extend([
            i32_out("block_indices", bi.into_dyn()),
            f64_out("block_indices.scores", sc.into_dyn()),
        ]);
    }
    Ok(out)
}

/// `nsa_fwd` on the GPU: `o`, and the computed selection's `block_indices` (int32) when there
/// was one.
fn nsa_fwd_gpu(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    let gpu = gpu()?;
    let [q, k, v] = ["q", "k", "v"].map(|n| upload(gpu, input(inputs, n)?));
    let (q, k, v) = (q?, k?, v?);
    let names = ["g_cmp", "g_slc", "g_swa", "block_indices"];
    let up: Vec<_> = names
        .iter()
        .map(|n| opt_upload(gpu, inputs, n))
        .collect::<Result<_, _>>()?;
    let counts = opt_index_dim::<Ix3>(inputs, "block_counts")?;
    let bc = block_counts(p, &counts)?;
    let x = attn_gpu::FwdInputs {
        q: &q,
        k: &k,
        v: &v,
        g_cmp: up[0].as_ref(),
        g_slc: up[1].as_ref(),
        g_swa: up[2].as_ref(),
        block_indices: up[3].as_ref(),
    };
    let r = attn_gpu::nsa_fwd(
        gpu,
        &x,
        bc,
        cu(inputs)?.as_deref(),
        p.int("block_size")?,
        p.int("window_size")?,
        p.opt_f64("scale")?,
    )?;
    let mut out = Tensors::from([("o".to_string(), download(gpu, &r.o)?)]);
    if let Some(bi) = r.block_indices {
        out.insert("block_indices".into(), download(gpu, &bi)?);
    }
    Ok(out)
}
