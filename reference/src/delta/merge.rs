//! `fwd_h_merge` (`conformance/spec/ops-delta-rule.md` §4): the prefix chain `X ← M_j X + b_j` over
//! the summaries of each sequence's consecutive sub-sequences, giving the state entering every
//! sub-sequence.

use super::check::{self, boundary};
use super::fwd_h::{load_state, store_state};
use crate::error::{Error, Result};
use crate::scalar::Real;
use ndarray::{s, Array4, ArrayView4};
use rayon::prelude::*;

/// Shapes of the inputs of [`fwd_h_merge`].
#[derive(Debug, Clone, Copy, Default)]
pub struct FwdHMergeShapes<'a> {
    /// `[S, HV, K, V + K]`.
    pub hm: &'a [usize],
    /// `[N, HV, K, V]` (`[N, HV, V, K]` with `state_v_first`) when given.
    pub initial_state: Option<&'a [usize]>,
}

/// The tensors of one [`fwd_h_merge`] call.
#[derive(Debug, Clone)]
pub struct FwdHMergeInputs<'a, T> {
    /// Summaries `[b | M]` of all `S` sub-sequences, in packed order.
    pub hm: ArrayView4<'a, T>,
    /// `[N + 1]`: sequence `n` owns sub-sequences `subseq_offsets[n] .. subseq_offsets[n+1]`.
    pub subseq_offsets: &'a [i64],
    pub initial_state: Option<ArrayView4<'a, T>>,
}

/// Parameters of [`fwd_h_merge`] (`conformance/spec/ops-delta-rule.md` §4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FwdHMergeParams {
    /// Layout of `initial_state` and of the outputs (`hm` is always key-first).
    pub state_v_first: bool,
    pub output_final_state: bool,
}

/// Outputs of [`fwd_h_merge`] (`conformance/spec/ops-delta-rule.md` §4.3).
#[derive(Debug, Clone, PartialEq)]
pub struct FwdHMergeOutputs<T> {
    /// `[S, HV, K, V]` (or `[S, HV, V, K]`): the state entering every sub-sequence.
    pub initial_states: Array4<T>,
    /// `[N, HV, K, V]` (or `[N, HV, V, K]`) when `output_final_state`.
    pub final_state: Option<Array4<T>>,
}

/// Validated geometry of a merge: `S` summaries of `N` sequences, `HV` heads, `K × V` states.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MergePlan {
    pub s: usize,
    pub n: usize,
    pub hv: usize,
    pub k: usize,
    pub v: usize,
}

/// Validates a [`fwd_h_merge`] call (`conformance/spec/ops-delta-rule.md` §4.6).
pub fn validate_fwd_h_merge(
    shapes: &FwdHMergeShapes<'_>,
    subseq_offsets: &[i64],
    params: &FwdHMergeParams,
) -> Result<MergePlan> {
    let hm = shapes.hm;
    check::rank("hm", hm, 4)?;
    let (s, hv, k) = (hm[0], hm[1], hm[2]);
    check::positive("hm", "HV", hm, hv)?;
    check::key_dim("hm", hm, k)?;
    if hm[3] <= k {
        return Err(Error::shape("hm", "[S, HV, K, V + K] with V >= 1", hm));
    }
    let v = hm[3] - k;
    let arg = "subseq_offsets";
    if subseq_offsets.len() < 2 {
        return Err(boundary(
            arg,
            "length N + 1 >= 2",
            format!("length {}", subseq_offsets.len()),
        ));
    }
    if subseq_offsets[0] != 0 {
        return Err(boundary(
            arg,
            "subseq_offsets[0] == 0",
            format!("{}", subseq_offsets[0]),
        ));
    }
    if let Some(i) = (1..subseq_offsets.len()).find(|&i| subseq_offsets[i] < subseq_offsets[i - 1])
    {
        return Err(boundary(
            arg,
            "non-decreasing values",
            format!("subseq_offsets[{i}] = {}", subseq_offsets[i]),
        ));
    }
    let last = subseq_offsets[subseq_offsets.len() - 1];
    if last != s as i64 {
        return Err(boundary(
            arg,
            format!("last value == S = {s}"),
            format!("{last}"),
        ));
    }
    let n = subseq_offsets.len() - 1;
    if let Some(st) = shapes.initial_state {
        check::rank("initial_state", st, 4)?;
        let want = if params.state_v_first {
            [n, hv, v, k]
        } else {
            [n, hv, k, v]
        };
        check::exact(
            "initial_state",
            st,
            &want,
            "[N, HV, K, V] (V, K with state_v_first)",
        )?;
    }
    Ok(MergePlan { s, n, hv, k, v })
}

/// The prefix chain of `conformance/spec/ops-delta-rule.md` §4.4: for every sequence `n` and head,
/// `X ← initial_state[n]`, then for each of its sub-sequences `j`: `initial_states[j] = X`, `X ←
/// M_j X + b_j`; `final_state[n] = X`.
pub fn fwd_h_merge<T: Real>(
    inp: &FwdHMergeInputs<'_, T>,
    params: &FwdHMergeParams,
) -> Result<FwdHMergeOutputs<T>> {
    let shapes = FwdHMergeShapes {
        hm: inp.hm.shape(),
        initial_state: inp.initial_state.as_ref().map(|a| a.shape()),
    };
    let plan = validate_fwd_h_merge(&shapes, inp.subseq_offsets, params)?;
    let (k, v, vf) = (plan.k, plan.v, params.state_v_first);
    let offs = inp.subseq_offsets;
    let chains: Vec<_> = (0..plan.n)
        .flat_map(|n| (0..plan.hv).map(move |hv| (n, hv)))
        .collect::<Vec<_>>()
        .into_par_iter()
        .map(|(n, hv)| {
            let mut x = load_state(inp.initial_state.as_ref(), n, hv, k, v, vf);
            let mut entering = Vec::new();
            for j in offs[n] as usize..offs[n + 1] as usize {
                let sm = inp.hm.slice(s![j, hv, .., ..]);
                entering.push(x.clone());
                let mut next = sm.slice(s![.., ..v]).to_owned();
                ndarray::linalg::general_mat_mul(
                    T::one(),
                    &sm.slice(s![.., v..]),
                    &x,
                    T::one(),
                    &mut next,
                );
                x = next;
            }
            (n, hv, entering, x)
        })
        .collect();
    let (sa, sb) = if vf { (v, k) } else { (k, v) };
    let mut initial_states = Array4::<T>::zeros((plan.s, plan.hv, sa, sb));
    let mut final_state = params
        .output_final_state
        .then(|| Array4::<T>::zeros((plan.n, plan.hv, sa, sb)));
    for (n, hv, entering, x) in chains {
        for (j, st) in (offs[n] as usize..).zip(&entering) {
            store_state(initial_states.slice_mut(s![j, hv, .., ..]), st, vf);
        }
        if let Some(fs) = final_state.as_mut() {
            store_state(fs.slice_mut(s![n, hv, .., ..]), &x, vf);
        }
    }
    Ok(FwdHMergeOutputs {
        initial_states,
        final_state,
    })
}
