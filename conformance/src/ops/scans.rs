//! Runners of `cumsum`, `chunk_local_cumsum`, `chunk_global_cumsum` (spec `ops-cumsum.md` 1-3).

use super::{float, opt_indices, out};
use crate::case::Tensors;
use crate::error::Problem;
use crate::params::Params;
use attn_reference::cumsum;

/// `y = cumsum(x, dim, reverse)` in float64.
pub fn cumsum(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
    let x = float(inputs, "x")?;
    let y = cumsum::cumsum(x.view(), p.int("dim")?, p.bool("reverse")?)?;
    Ok(out("y", y))
}

/// `o = chunk_local_cumsum(g, cu_seqlens, chunk_size, reverse, scale)` in float64.
pub fn chunk_local_cumsum(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
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

/// `o = chunk_global_cumsum(g, cu_seqlens, reverse, scale)` in float64.
pub fn chunk_global_cumsum(inputs: &Tensors, p: &Params) -> Result<Tensors, Problem> {
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
