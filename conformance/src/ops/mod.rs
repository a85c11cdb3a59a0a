//! The ops, one module per family: each holds, for every op of its family, the registry entry
//! ([`OpSpec`](crate::spec::OpSpec)), the float64 CPU runner and the GPU runner where there is
//! one, side by side ([`scans`], [`gates`], [`decode`], [`delta`], [`nsa`]). [`device`] is the GPU
//! plumbing they share. This module holds what the families share: reading inputs by name,
//! expected output classes, thresholds and common parameters.
//!
//! Below: `case`, `params`, `compare`, `spec`. Above: `registry`, which gathers the families'
//! `OPS` tables. A family never imports another family.

pub mod decode;
pub mod delta;
pub mod device;
pub mod gates;
pub mod nsa;
pub mod scans;

use crate::case::Tensors;
use crate::compare::Rule;
use crate::error::Problem;
use crate::params::{ParamSpec, ParamType, Params};
use crate::spec::param;
use crate::tensor::Tensor;
use attn_reference::{Dtype, DtypeClass, Error};
use ndarray::{ArrayD, Dimension};
use std::str::FromStr;

/// The `output_dtype` values of ops whose output is float32 or float64.
pub const FLOAT_OUT: &[&str] = &["float32", "float64"];
pub const P_REVERSE: ParamSpec = param("reverse", ParamType::Bool, Some("false"));
pub const P_SCALE: ParamSpec = param("scale", ParamType::OptFloat, Some("null"));
pub const P_CHUNK: ParamSpec = param("chunk_size", ParamType::Int, None);
pub const P_OUT_F32: ParamSpec = param(
    "output_dtype",
    ParamType::OptStr(FLOAT_OUT),
    Some("\"float32\""),
);
pub const P_LOWER: ParamSpec = param("lower_bound", ParamType::OptFloat, Some("null"));

/// Required input `name`.
pub fn input<'a>(inputs: &'a Tensors, name: &str) -> Result<&'a Tensor, Problem> {
    inputs
        .get(name)
        .ok_or_else(|| Problem::MissingInput(name.into()))
}

/// Required float input `name` widened to `f64`.
pub fn float(inputs: &Tensors, name: &str) -> Result<ArrayD<f64>, Problem> {
    input(inputs, name)?.to_f64(name)
}

/// Optional float input `name` widened to `f64`, with rank `D`.
pub fn opt_float_dim<D: Dimension>(
    inputs: &Tensors,
    name: &str,
) -> Result<Option<ndarray::Array<f64, D>>, Problem> {
    inputs
        .get(name)
        .map(|_| float_dim(inputs, name))
        .transpose()
}

/// Required float input `name` widened to `f64`, with rank `D` (else a shape error naming it).
pub fn float_dim<D: Dimension>(
    inputs: &Tensors,
    name: &str,
) -> Result<ndarray::Array<f64, D>, Problem> {
    let a = float(inputs, name)?;
    let shape = a.shape().to_vec();
    a.into_dimensionality::<D>().map_err(|_| {
        let rank = D::NDIM.map_or("a fixed rank".to_string(), |n| format!("rank {n}"));
        Error::shape(name, rank, shape).into()
    })
}

/// Optional 1-D index input `name` as `i64`.
pub fn opt_indices(inputs: &Tensors, name: &str) -> Result<Option<Vec<i64>>, Problem> {
    let Some(t) = inputs.get(name) else {
        return Ok(None);
    };
    if t.shape().len() != 1 {
        return Err(Error::shape(name, "a 1-D index tensor", t.shape()).into());
    }
    t.to_indices(name).map(Some)
}

/// Required 1-D index input `name` as `i64`.
pub fn indices(inputs: &Tensors, name: &str) -> Result<Vec<i64>, Problem> {
    opt_indices(inputs, name)?.ok_or_else(|| Problem::MissingInput(name.into()))
}

/// One named float64 output.
pub fn out(name: &str, a: ArrayD<f64>) -> Tensors {
    Tensors::from([(name.to_string(), Tensor::F64(a))])
}

/// The dtype class of input `name`.
pub fn class_of(inputs: &Tensors, name: &str) -> Result<DtypeClass, Problem> {
    Ok(input(inputs, name)?.dtype().class())
}

/// The class of an output whose dtype is the `output_dtype` parameter, or that of input `like`
/// when it is `null`.
pub fn out_class(inputs: &Tensors, params: &Params, like: &str) -> Result<DtypeClass, Problem> {
    match params.opt_str("output_dtype")? {
        Some(s) => Ok(Dtype::from_str(s)
            .map_err(|_| Error::param("output_dtype", "float32 or float64", s))?
            .class()),
        None => class_of(inputs, like),
    }
}

/// Threshold of a long scan (`cumsum`, `chunk_global_cumsum`): float32 `1e-5` up to scan length
/// 2^16 and `1e-4` beyond (rounding error grows with the length); otherwise the default.
pub fn scan_threshold(class: DtypeClass, scan_len: usize) -> Rule {
    match class {
        DtypeClass::Float32 if scan_len > 1 << 16 => Rule::Threshold(1e-4),
        c => Rule::default_for(c),
    }
}

/// The scan length of a `cumsum` call (0 when `dim` is out of range: the run reports that).
pub fn cumsum_len(inputs: &Tensors, params: &Params) -> usize {
    let (Some(x), Ok(dim)) = (inputs.get("x"), params.int("dim")) else {
        return 0;
    };
    let rank = x.shape().len() as i64;
    let axis = if dim < 0 { dim + rank } else { dim };
    usize::try_from(axis)
        .ok()
        .and_then(|a| x.shape().get(a).copied())
        .unwrap_or(0)
}

/// The longest sequence of a `[B, T, ...]` input `g` (per `cu_seqlens` when given).
pub fn longest_sequence(inputs: &Tensors) -> usize {
    let t = inputs
        .get("g")
        .and_then(|g| g.shape().get(1).copied())
        .unwrap_or(0);
    match opt_indices(inputs, "cu_seqlens") {
        Ok(Some(cu)) => cu
            .windows(2)
            .map(|w| usize::try_from(w[1].saturating_sub(w[0])).unwrap_or(0))
            .max()
            .unwrap_or(0),
        _ => t,
    }
}
