//! Runners of `kda_gate` and `kda_gate_chunk_cumsum` (spec `ops-cumsum.md` 4-5).

use super::{float_dim, opt_float_dim, opt_indices, out};
use crate::case::Tensors;
use crate::error::Problem;
use crate::params::Params;
use attn_reference::gate::{self, KdaGateChunkCumsumParams};
use ndarray::{Ix1, Ix4};

/// `y = kda_gate(g, A_log, dt_bias, lower_bound)` in float64.
pub fn kda_gate(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
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

/// `o = chunk_local_cumsum(kda_gate(g, A_log, dt_bias), chunk_size, reverse, scale)` in float64.
pub fn kda_gate_chunk_cumsum(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
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
