//! `fwd_h_pre_scan` (`conformance/spec/ops-delta-rule.md` §3): the affine summary of each
//! (sub-)sequence's chunk recurrence, used by the intra-card split.
//!
//! Each chunk map is affine in the incoming state, `S_{c+1} = A_c S_c + B_c` with
//! `A_c = γ_c diag(λ_c) − K̃_cᵀ W_c` and `B_c = K̃_cᵀ U_c`. The summary of a sub-sequence of
//! chunks `0 .. m−1` is `M = A_{m−1} ⋯ A_0` and `b` (the exit state from zero), so that
//! `S_out = M S_in + b`. Running the chunk step of section 2 on the augmented state
//! `X = [b | M]` (`K × (V + K)`) from `[0 | I]` with values `[U | 0]` yields both at once.

use super::check::Geometry;
use super::fwd_h::{self, scatter, tasks, FwdHInputs, FwdHShapes, SeqInputs};
use crate::error::{Error, Result};
use crate::scalar::Real;
use ndarray::{s, Array2, Array4};
use rayon::prelude::*;

/// Inputs of [`fwd_h_pre_scan`]: those of section 2 without `initial_state` (which must be
/// `None`); `cu_seqlens` delimits the summarised (sub-)sequences.
pub type FwdHPreScanInputs<'a, T> = FwdHInputs<'a, T>;

/// Parameters of [`fwd_h_pre_scan`] (`conformance/spec/ops-delta-rule.md` §3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FwdHPreScanParams {
    /// `BT`: 16, 32 or 64 (default 64).
    pub chunk_size: i64,
}

impl Default for FwdHPreScanParams {
    fn default() -> Self {
        FwdHPreScanParams { chunk_size: 64 }
    }
}

/// Output of [`fwd_h_pre_scan`] (`conformance/spec/ops-delta-rule.md` §3.2).
#[derive(Debug, Clone, PartialEq)]
pub struct FwdHPreScanOutputs<T> {
    /// `[S, HV, K, V + K]`: `hm[s, hv] = [b | M]`.
    pub hm: Array4<T>,
}

/// Validates a [`fwd_h_pre_scan`] call (`conformance/spec/ops-delta-rule.md` §3.4).
pub fn validate_fwd_h_pre_scan(
    shapes: &FwdHShapes<'_>,
    cu_seqlens: Option<&[i64]>,
    params: &FwdHPreScanParams,
) -> Result<Geometry> {
    let geo = fwd_h::validate_kwu(shapes, cu_seqlens, params.chunk_size)?;
    if let Some(st) = shapes.initial_state {
        return Err(Error::missing(
            "initial_state",
            "no initial_state (fwd_h_pre_scan summarises from zero)",
            format!("a tensor of shape {st:?}"),
        ));
    }
    Ok(geo)
}

/// `hm[s, hv] = [b | M]` (`[S, HV, K, V + K]`) for every (sub-)sequence `s` of `cu_seqlens`
/// (`conformance/spec/ops-delta-rule.md` §3.1): `M = A_{m−1} ⋯ A_0` and `b` the exit state from `S
/// = 0`. An empty sub-sequence has `[0 | I]`.
pub fn fwd_h_pre_scan<T: Real>(
    inp: &FwdHPreScanInputs<'_, T>,
    params: &FwdHPreScanParams,
) -> Result<FwdHPreScanOutputs<T>> {
    let geo = validate_fwd_h_pre_scan(&inp.shapes(), inp.cu_seqlens, params)?;
    let (kd, vd, bt) = (geo.k, geo.v, geo.bt);
    let per_head: Vec<_> = tasks(&geo)
        .into_par_iter()
        .map(|(i, hv)| {
            let rows = SeqInputs::of(inp, &geo, geo.seqs[i], hv);
            let mut x = Array2::<T>::zeros((kd, vd + kd));
            x.slice_mut(s![.., vd..]).assign(&Array2::eye(kd));
            for (a, e) in rows.chunks(bt) {
                rows.step(&mut x, a, e);
            }
            (i, hv, x)
        })
        .collect();
    let mut hm = Array4::<T>::zeros((geo.n(), geo.hv, kd, vd + kd));
    scatter(&mut hm, 1, &geo, &per_head, |mut hh, seq, x| {
        hh.slice_mut(s![seq.n, .., ..]).assign(x);
    });
    Ok(FwdHPreScanOutputs { hm })
}
