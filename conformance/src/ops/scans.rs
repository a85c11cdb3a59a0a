//! The scans of `conformance/spec/ops-cumsum.md` §1-§3: `cumsum`, `chunk_local_cumsum`,
//! `chunk_global_cumsum`. Each op's registry entry, its float64 CPU runner (`<op>_cpu`) and its GPU
//! runner (`<op>_gpu`), side by side.

use super::device::{download, gpu, one, output_dtype, upload};
use super::{float, input, opt_indices, out, scan_threshold};
use super::{FLOAT_OUT, P_CHUNK, P_OUT_F32, P_REVERSE, P_SCALE};
use crate::case::Tensors;
use crate::compare::Rule;
use crate::error::Problem;
use crate::params::{ParamType, Params};
use crate::spec::{self as s, OpSpec};
use attn_reference::cumsum;
use attn_reference::DtypeClass;

pub const OPS: &[OpSpec] = &[CUMSUM, CHUNK_LOCAL_CUMSUM, CHUNK_GLOBAL_CUMSUM];

/// The layouts of a chunked scan's `g` and `o`: a scalar or a vector gate.
const G_SHAPE: &str = "[B, T, H] or [B, T, H, S]";

const CUMSUM: OpSpec = OpSpec {
    id: "cumsum",
    summary: "torch.cumsum(x, dim) with reverse",
    inputs: &[s::float("x", true, "any rank >= 1", "float")],
    params: &[
        s::param("dim", ParamType::Int, Some("-1")),
        P_REVERSE,
        s::param("output_dtype", ParamType::OptStr(FLOAT_OUT), Some("null")),
    ],
    outputs: &[s::output(
        "y",
        "shape of x",
        "output_dtype; null: dtype of x",
        |i, p| super::out_class(i, p, "x"),
        |i, p, c| scan_threshold(c, super::cumsum_len(i, p)),
    )],
    cpu: cumsum_cpu,
    gpu: Some(cumsum_gpu),
    cp: None,
    section: "conformance/spec/ops-cumsum.md §1",
};

/// `y = cumsum(x, dim, reverse)` in float64.
fn cumsum_cpu(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    let x = float(inputs, "x")?;
    let y = cumsum::cumsum(x.view(), p.int("dim")?, p.bool("reverse")?)?;
    Ok(out("y", y))
}

/// `cumsum` on the GPU.
fn cumsum_gpu(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    let gpu = gpu()?;
    let x = upload(gpu, input(inputs, "x")?)?;
    let y = attn_gpu::cumsum(gpu, &x, p.int("dim")?, p.bool("reverse")?, output_dtype(p)?)?;
    Ok(one("y", download(gpu, &y)?))
}

const CHUNK_LOCAL_CUMSUM: OpSpec = OpSpec {
    id: "chunk_local_cumsum",
    summary: "per-chunk prefix sums of g [B,T,H(,S)], varlen-aware",
    inputs: &[
        s::float("g", true, G_SHAPE, "float"),
        s::index("cu_seqlens", false, "[N + 1]"),
    ],
    params: &[P_CHUNK, P_REVERSE, P_SCALE, P_OUT_F32],
    outputs: &[s::output(
        "o",
        "shape of g",
        "output_dtype (default float32); null: dtype of g",
        |i, p| super::out_class(i, p, "g"),
        |_, _, c| match c {
            DtypeClass::Float32 => Rule::Threshold(1e-6),
            c => Rule::default_for(c),
        },
    )],
    cpu: chunk_local_cumsum_cpu,
    gpu: Some(chunk_local_cumsum_gpu),
    cp: None,
    section: "conformance/spec/ops-cumsum.md §2",
};

/// `o = chunk_local_cumsum(g, cu_seqlens, chunk_size, reverse, scale)` in float64.
fn chunk_local_cumsum_cpu(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    let g = float(inputs, "g")?;
    let cu = opt_indices(inputs, "cu_seqlens")?;
    let o = cumsum::chunk_local_cumsum(
        g.view(),
        cu.as_deref(),
        p.int("chunk_size")?,
        p.bool("reverse")?,
        p.opt_f64("scale")?,
    )?;
    Ok(out("o", o))
}

/// `chunk_local_cumsum` on the GPU.
fn chunk_local_cumsum_gpu(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    let gpu = gpu()?;
    let g = upload(gpu, input(inputs, "g")?)?;
    let cu = opt_indices(inputs, "cu_seqlens")?;
    let o = attn_gpu::chunk_local_cumsum(
        gpu,
        &g,
        cu.as_deref(),
        p.int("chunk_size")?,
        p.bool("reverse")?,
        p.opt_f64("scale")?,
        output_dtype(p)?,
    )?;
    Ok(one("o", download(gpu, &o)?))
}

const CHUNK_GLOBAL_CUMSUM: OpSpec = OpSpec {
    id: "chunk_global_cumsum",
    summary: "whole-sequence prefix sums of g [B,T,H(,S)], varlen-aware",
    inputs: &[
        s::float("g", true, G_SHAPE, "float"),
        s::index("cu_seqlens", false, "[N + 1]"),
    ],
    params: &[P_REVERSE, P_SCALE, P_OUT_F32],
    outputs: &[s::output(
        "o",
        "shape of g",
        "output_dtype (default float32); null: dtype of g",
        |i, p| super::out_class(i, p, "g"),
        |i, _, c| scan_threshold(c, super::longest_sequence(i)),
    )],
    cpu: chunk_global_cumsum_cpu,
    gpu: Some(chunk_global_cumsum_gpu),
    cp: None,
    section: "conformance/spec/ops-cumsum.md §3",
};

/// `o = chunk_global_cumsum(g, cu_seqlens, reverse, scale)` in float64.
fn chunk_global_cumsum_cpu(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    let g = float(inputs, "g")?;
    let cu = opt_indices(inputs, "cu_seqlens")?;
    let o = cumsum::chunk_global_cumsum(
        g.view(),
        cu.as_deref(),
        p.bool("reverse")?,
        p.opt_f64("scale")?,
    )?;
    Ok(out("o", o))
}

/// `chunk_global_cumsum` on the GPU.
fn chunk_global_cumsum_gpu(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    let gpu = gpu()?;
    let g = upload(gpu, input(inputs, "g")?)?;
    let cu = opt_indices(inputs, "cu_seqlens")?;
    let o = attn_gpu::chunk_global_cumsum(
        gpu,
        &g,
        cu.as_deref(),
        p.bool("reverse")?,
        p.opt_f64("scale")?,
        output_dtype(p)?,
    )?;
    Ok(one("o", download(gpu, &o)?))
}
