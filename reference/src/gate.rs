//! KDA gates: `kda_gate`, `kda_gate_chunk_cumsum` (spec `ops-cumsum.md` 4-5).
//! API FIXED BY THE LEAD: bodies to be written (replace every `todo!`).

use crate::error::Result;
use crate::scalar::Real;
use ndarray::{Array4, ArrayView1, ArrayView4};

/// Validates `g` `[B, T, HV, K]`, `A_log` `[HV]` (required unless `lower_bound`), `dt_bias`
/// `[HV * K]`; returns `(B, T, HV, K)`.
pub fn validate_kda_gate(
    g_shape: &[usize],
    a_log_len: Option<usize>,
    dt_bias_len: Option<usize>,
    lower_bound: Option<f64>,
) -> Result<(usize, usize, usize, usize)> {
    let _ = (g_shape, a_log_len, dt_bias_len, lower_bound);
    todo!()
}

/// `y = -exp(A_log[hv]) · softplus(g + dt_bias)` (PyTorch softplus, threshold 20), or with
/// `lower_bound`: `y = lower_bound · sigmoid(exp(A_log[hv]) · a)` (`sigmoid(a)` without `A_log`).
pub fn kda_gate<T: Real>(
    g: ArrayView4<'_, T>,
    a_log: Option<ArrayView1<'_, T>>,
    dt_bias: Option<ArrayView1<'_, T>>,
    lower_bound: Option<f64>,
) -> Result<Array4<T>> {
    let _ = (g, a_log, dt_bias, lower_bound);
    todo!()
}

/// Parameters of [`kda_gate_chunk_cumsum`] (spec defaults via `Default`, except `chunk_size`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KdaGateChunkCumsumParams {
    pub chunk_size: i64,
    pub scale: Option<f64>,
    pub lower_bound: Option<f64>,
    pub reverse: bool,
}

/// `chunk_local_cumsum(kda_gate(g, A_log, dt_bias, lower_bound), chunk_size, reverse, scale)`.
pub fn kda_gate_chunk_cumsum<T: Real>(
    g: ArrayView4<'_, T>,
    a_log: Option<ArrayView1<'_, T>>,
    dt_bias: Option<ArrayView1<'_, T>>,
    cu_seqlens: Option<&[i64]>,
    params: KdaGateChunkCumsumParams,
) -> Result<Array4<T>> {
    let _ = (g, a_log, dt_bias, cu_seqlens, params);
    todo!()
}
