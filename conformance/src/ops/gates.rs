//! The KDA gates of `conformance/spec/ops-cumsum.md` §4-§5: `kda_gate`, `kda_gate_chunk_cumsum`.
//! Each op's registry entry, its float64 CPU runner (`<op>_cpu`) and its GPU runner (`<op>_gpu`),
//! side by side.

use super::device::{download, gpu, one, opt_upload, output_dtype, upload};
use super::{float_dim, input, opt_float_dim, opt_indices, out};
use super::{P_CHUNK, P_LOWER, P_OUT_F32, P_REVERSE, P_SCALE};
use crate::case::Tensors;
use crate::compare::Rule;
use crate::error::Problem;
use crate::params::Params;
use crate::spec::{self as s, InputSpec, OpSpec};
use attn_gpu::GateInputs;
use attn_reference::gate::{self, KdaGateChunkCumsumParams};
use attn_reference::DtypeClass;
use ndarray::{Ix1, Ix4};

pub const OPS: &[OpSpec] = &[KDA_GATE, KDA_GATE_CHUNK_CUMSUM];

const GATE_INPUTS: [InputSpec; 3] = [
    s::float("g", true, "[B, T, HV, K]", "float"),
    s::float(
        "A_log",
        false,
        "[HV]",
        "float (required unless lower_bound is set)",
    ),
    s::float("dt_bias", false, "[HV * K]", "float"),
];

const KDA_GATE: OpSpec = OpSpec {
    id: "kda_gate",
    summary: "KDA decay -exp(A_log)*softplus(g+dt_bias), or lower_bound*sigmoid(...)",
    inputs: &GATE_INPUTS,
    params: &[P_LOWER],
    outputs: &[s::output(
        "y",
        "[B, T, HV, K]",
        "float32",
        |_, _| Ok(DtypeClass::Float32),
        |_, _, c| Rule::default_for(c),
    )],
    cpu: kda_gate_cpu,
    gpu: Some(kda_gate_gpu),
    cp: None,
    section: "conformance/spec/ops-cumsum.md §4",
};

/// `y = kda_gate(g, A_log, dt_bias, lower_bound)` in float64.
fn kda_gate_cpu(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    let g = float_dim::<Ix4>(inputs, "g")?;
    let a_log = opt_float_dim::<Ix1>(inputs, "A_log")?;
    let dt_bias = opt_float_dim::<Ix1>(inputs, "dt_bias")?;
    let y = gate::kda_gate(
        g.view(),
        a_log.as_ref().map(|a| a.view()),
        dt_bias.as_ref().map(|a| a.view()),
        p.opt_f64("lower_bound")?,
    )?;
    Ok(out("y", y.into_dyn()))
}

/// `kda_gate` on the GPU (float32 output).
fn kda_gate_gpu(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    let gpu = gpu()?;
    let g = upload(gpu, input(inputs, "g")?)?;
    let a_log = opt_upload(gpu, inputs, "A_log")?;
    let dt_bias = opt_upload(gpu, inputs, "dt_bias")?;
    let side = GateInputs {
        a_log: a_log.as_ref(),
        dt_bias: dt_bias.as_ref(),
    };
    let y = attn_gpu::kda_gate(gpu, &g, &side, p.opt_f64("lower_bound")?)?;
    Ok(one("y", download(gpu, &y)?))
}

const KDA_GATE_CHUNK_CUMSUM: OpSpec = OpSpec {
    id: "kda_gate_chunk_cumsum",
    summary: "chunk_local_cumsum(kda_gate(g, A_log, dt_bias)) fused",
    inputs: &[
        GATE_INPUTS[0],
        GATE_INPUTS[1],
        GATE_INPUTS[2],
        s::index("cu_seqlens", false, "[N + 1]"),
    ],
    params: &[P_CHUNK, P_SCALE, P_LOWER, P_OUT_F32, P_REVERSE],
    outputs: &[s::output(
        "o",
        "[B, T, HV, K]",
        "output_dtype (default float32); null: dtype of g",
        |i, p| super::out_class(i, p, "g"),
        |_, _, c| Rule::default_for(c),
    )],
    cpu: kda_gate_chunk_cumsum_cpu,
    gpu: Some(kda_gate_chunk_cumsum_gpu),
    cp: None,
    section: "conformance/spec/ops-cumsum.md §5",
};

/// `o = chunk_local_cumsum(kda_gate(g, A_log, dt_bias), chunk_size, reverse, scale)` in float64.
fn kda_gate_chunk_cumsum_cpu(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    let g = float_dim::<Ix4>(inputs, "g")?;
    let a_log = opt_float_dim::<Ix1>(inputs, "A_log")?;
    let dt_bias = opt_float_dim::<Ix1>(inputs, "dt_bias")?;
    let cu = opt_indices(inputs, "cu_seqlens")?;
    let params = KdaGateChunkCumsumParams {
        chunk_size: p.int("chunk_size")?,
        scale: p.opt_f64("scale")?,
        lower_bound: p.opt_f64("lower_bound")?,
        reverse: p.bool("reverse")?,
    };
    let o = gate::kda_gate_chunk_cumsum(
        g.view(),
        a_log.as_ref().map(|a| a.view()),
        dt_bias.as_ref().map(|a| a.view()),
        cu.as_deref(),
        params,
    )?;
    Ok(out("o", o.into_dyn()))
}

/// `kda_gate_chunk_cumsum` on the GPU (the fused kernel).
fn kda_gate_chunk_cumsum_gpu(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    let gpu = gpu()?;
    let g = upload(gpu, input(inputs, "g")?)?;
    let a_log = opt_upload(gpu, inputs, "A_log")?;
    let dt_bias = opt_upload(gpu, inputs, "dt_bias")?;
    let cu = opt_indices(inputs, "cu_seqlens")?;
    let side = GateInputs {
        a_log: a_log.as_ref(),
        dt_bias: dt_bias.as_ref(),
    };
    let params = KdaGateChunkCumsumParams {
        chunk_size: p.int("chunk_size")?,
        scale: p.opt_f64("scale")?,
        lower_bound: p.opt_f64("lower_bound")?,
        reverse: p.bool("reverse")?,
    };
    let o =
        attn_gpu::kda_gate_chunk_cumsum(gpu, &g, &side, cu.as_deref(), &params, output_dtype(p)?)?;
    Ok(one("o", download(gpu, &o)?))
}
