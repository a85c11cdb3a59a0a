//! Intra-card split of the state recurrence (spec sections 3–5): `fwd_h_pre_scan` (affine
//! summaries of sub-sequences), `fwd_h_merge` (prefix chain of the summaries) and
//! `chunk_gated_delta_rule_fwd_h_split` (the two, then section 2 on the sub-sequences).
//!
//! Each chunk map is affine in the incoming state, `S_{c+1} = A_c S_c + B_c` with
//! `A_c = γ_c diag(λ_c) − K̃_cᵀ W_c` and `B_c = K̃_cᵀ U_c`. The summary of a sub-sequence of
//! chunks `0 .. m−1` is `M = A_{m−1} ⋯ A_0` and `b` (the exit state from zero), so that
//! `S_out = M S_in + b`. Running the chunk step of section 2 on the augmented state
//! `X = [b | M]` (`K × (V + K)`) from `[0 | I]` with values `[U | 0]` yields both at once.

use super::check::{self, boundary, Geometry};
use super::chunk;
use super::fwd_h::{
    self, chunk_gated_delta_rule_fwd_h, load_state, store_state, tasks, FwdHInputs, FwdHParams,
    FwdHShapes,
};
use crate::error::{Error, Result};
use crate::scalar::Real;
use ndarray::{s, Array2, Array3, Array4, ArrayView3, ArrayView4, Axis};
use rayon::prelude::*;

/// Inputs of [`fwd_h_pre_scan`]: those of section 2 without `initial_state` (which must be
/// `None`); `cu_seqlens` delimits the summarised (sub-)sequences.
pub type FwdHPreScanInputs<'a, T> = FwdHInputs<'a, T>;

/// Parameters of [`fwd_h_pre_scan`] (spec 3.2).
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

/// Output of [`fwd_h_pre_scan`] (spec 3.2).
#[derive(Debug, Clone, PartialEq)]
pub struct FwdHPreScanOutputs<T> {
    /// `[S, HV, K, V + K]`: `hm[s, hv] = [b | M]`.
    pub hm: Array4<T>,
}

/// Validates a [`fwd_h_pre_scan`] call (spec 3.4).
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
/// (spec 3.1): `M = A_{m−1} ⋯ A_0` and `b` the exit state from `S = 0`. An empty
/// sub-sequence has `[0 | I]`.
pub fn fwd_h_pre_scan<T: Real>(
    inp: &FwdHPreScanInputs<'_, T>,
    params: &FwdHPreScanParams,
) -> Result<FwdHPreScanOutputs<T>> {
    let geo = validate_fwd_h_pre_scan(&inp.shapes(), inp.cu_seqlens, params)?;
    let (kd, vd, bt) = (geo.k, geo.v, geo.bt);
    let per_head: Vec<_> = tasks(&geo)
        .into_par_iter()
        .map(|(i, hv)| {
            let seq = geo.seqs[i];
            let rows = s![seq.batch, seq.bos..seq.eos, hv, ..];
            let k = inp.k.slice(s![seq.batch, seq.bos..seq.eos, geo.kh(hv), ..]);
            let (w, u) = (inp.w.slice(rows), inp.u.slice(rows));
            let g = inp
                .g
                .as_ref()
                .map(|g| g.slice(s![seq.batch, seq.bos..seq.eos, hv]));
            let gk = inp.gk.as_ref().map(|gk| gk.slice(rows));
            let mut x = Array2::<T>::zeros((kd, vd + kd));
            x.slice_mut(s![.., vd..]).assign(&Array2::eye(kd));
            for a in (0..seq.len()).step_by(bt) {
                let e = (a + bt).min(seq.len());
                let d = chunk::delta(&x, w.slice(s![a..e, ..]), u.slice(s![a..e, ..]));
                chunk::advance(
                    &mut x,
                    k.slice(s![a..e, ..]),
                    &d,
                    g.map(|g| g.slice_move(s![a..e])),
                    gk.map(|gk| gk.slice_move(s![a..e, ..])),
                );
            }
            (i, hv, x)
        })
        .collect();
    let mut hm = Array4::<T>::zeros((geo.n(), geo.hv, kd, vd + kd));
    for (i, hv, x) in per_head {
        hm.slice_mut(s![i, hv, .., ..]).assign(&x);
    }
    Ok(FwdHPreScanOutputs { hm })
}

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

/// Parameters of [`fwd_h_merge`] (spec 4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FwdHMergeParams {
    /// Layout of `initial_state` and of the outputs (`hm` is always key-first).
    pub state_v_first: bool,
    pub output_final_state: bool,
}

/// Outputs of [`fwd_h_merge`] (spec 4.3).
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

/// Validates a [`fwd_h_merge`] call (spec 4.6).
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

/// The prefix chain of spec 4.4: for every sequence `n` and head, `X ← initial_state[n]`,
/// then for each of its sub-sequences `j`: `initial_states[j] = X`, `X ← M_j X + b_j`;
/// `final_state[n] = X`.
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

/// The SM count assumed by the automatic split policy when none is given (H100/H200: 132).
pub const DEFAULT_NUM_SMS: usize = 132;

/// The project's split policy (spec 5.4, used when `subseq_cu_seqlens` is absent), over
/// sequences of `seq_lens` tokens packed in order, for `HV` heads, value dim `V`, chunk `BT`:
///
/// - a section-2 kernel runs `HV · ceil(V / 64)` work units per sequence; nothing is split when
///   `N · HV · ceil(V/64) >= num_sms / 2` (the GPU is already half full);
/// - only sequences of at least 256 chunks are split, into `p = min(32, NT_n / 64)` pieces of
///   `ceil(NT_n / p)` chunks (the last shorter), so pieces have at least 64 chunks;
/// - while the total number of pieces exceeds `max(N, num_sms / (HV · ceil(V/64)))`, the sequence
///   with the most pieces loses one.
///
/// Returns the `subseq_cu_seqlens` (chunk-aligned inner boundaries, one empty piece per empty
/// sequence), a valid split in the sense of spec 5.2.
pub fn auto_subseq_cu_seqlens(
    seq_lens: &[usize],
    hv: usize,
    v: usize,
    bt: usize,
    num_sms: usize,
) -> Vec<i64> {
    let units = hv.max(1) * v.div_ceil(64).max(1);
    let nts: Vec<usize> = seq_lens.iter().map(|l| l.div_ceil(bt)).collect();
    let mut pieces: Vec<usize> = vec![1; nts.len()];
    if nts.len() * units < num_sms / 2 {
        for (p, &nt) in pieces.iter_mut().zip(&nts) {
            if nt >= 256 {
                *p = (nt / 64).min(32);
            }
        }
        let budget = nts.len().max(num_sms / units);
        while pieces.iter().sum::<usize>() > budget {
            let (i, _) = pieces
                .iter()
                .enumerate()
                .max_by_key(|&(i, &p)| (p, std::cmp::Reverse(i)))
                .expect("at least one sequence when over budget");
            pieces[i] -= 1;
        }
    }
    let mut out = vec![0i64];
    let mut bos = 0usize;
    for ((&len, &nt), &p) in seq_lens.iter().zip(&nts).zip(&pieces) {
        let per = nt.div_ceil(p).max(1) * bt;
        let mut at = bos + per;
        while at < bos + len {
            out.push(at as i64);
            at += per;
        }
        bos += len;
        out.push(bos as i64);
    }
    out
}

/// `subseq_offsets` of a valid split: sequence `n` owns pieces `offsets[n] .. offsets[n+1]`.
/// Validates `subseq_cu_seqlens` against the sequences (spec 5.2): each sequence `n` is cut at
/// `bos_n = p_0 < … < p_m = eos_n` (`m >= 1`, inner boundaries `chunk_size`-aligned), a
/// zero-length sequence is exactly one empty piece, and the list ends at the last `eos`.
/// `bounds` are the sequences' `(bos, eos)` in flattened token coordinates.
pub fn subseq_offsets(subseq: &[i64], bounds: &[(usize, usize)], bt: usize) -> Result<Vec<i64>> {
    let arg = "subseq_cu_seqlens";
    if subseq.len() < 2 || subseq[0] != 0 {
        return Err(boundary(
            arg,
            "length >= 2 starting at 0",
            format!("{subseq:?}"),
        ));
    }
    let mut offsets = vec![0i64];
    let mut i = 0usize; // index of the current piece start in `subseq`
    for (n, &(bos, eos)) in bounds.iter().enumerate() {
        if subseq[i] != bos as i64 {
            return Err(boundary(
                arg,
                format!("a boundary at the start {bos} of sequence {n}"),
                format!("subseq_cu_seqlens[{i}] = {}", subseq[i]),
            ));
        }
        loop {
            let Some(&next) = subseq.get(i + 1) else {
                return Err(boundary(
                    arg,
                    format!("pieces up to the end {eos} of sequence {n}"),
                    format!("the list ends at {}", subseq[i]),
                ));
            };
            let start = subseq[i];
            i += 1;
            if bos == eos {
                if next != start {
                    return Err(boundary(
                        arg,
                        format!("one empty piece for the empty sequence {n}"),
                        format!("subseq_cu_seqlens[{i}] = {next}"),
                    ));
                }
                break;
            }
            if next <= start {
                return Err(boundary(
                    arg,
                    format!("non-empty increasing pieces inside sequence {n}"),
                    format!("subseq_cu_seqlens[{i}] = {next} after {start}"),
                ));
            }
            if next > eos as i64 {
                return Err(boundary(
                    arg,
                    format!("pieces inside sequence {n} (ending at {eos})"),
                    format!("subseq_cu_seqlens[{i}] = {next}"),
                ));
            }
            if next == eos as i64 {
                break;
            }
            if (next as usize - bos) % bt != 0 {
                return Err(boundary(
                    arg,
                    format!("inner boundaries of sequence {n} at multiples of chunk_size = {bt} from {bos}"),
                    format!("subseq_cu_seqlens[{i}] = {next}"),
                ));
            }
        }
        offsets.push(i as i64);
    }
    if i + 1 != subseq.len() {
        return Err(boundary(
            arg,
            format!("the list to end at the last sequence end, index {i}"),
            format!("length {} ({subseq:?})", subseq.len()),
        ));
    }
    Ok(offsets)
}

/// The tensors of one [`chunk_gated_delta_rule_fwd_h_split`] call: section 2's, plus the
/// optional split points.
#[derive(Debug, Clone)]
pub struct FwdHSplitInputs<'a, T> {
    pub fwd_h: FwdHInputs<'a, T>,
    /// `[S + 1]` sub-sequence boundaries over the (flattened) tokens; `None` = the policy of
    /// [`auto_subseq_cu_seqlens`] with [`DEFAULT_NUM_SMS`].
    pub subseq_cu_seqlens: Option<&'a [i64]>,
}

/// A validated split: the geometry of section 2 and the pieces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitPlan {
    pub geometry: Geometry,
    /// The pieces used (given, or chosen by the policy).
    pub subseq_cu_seqlens: Vec<i64>,
    /// `subseq_offsets` of section 4 derived from them.
    pub subseq_offsets: Vec<i64>,
}

/// Validates a [`chunk_gated_delta_rule_fwd_h_split`] call (spec 5.6): section 2's checks plus
/// a valid split (5.2).
pub fn validate_chunk_gated_delta_rule_fwd_h_split(
    shapes: &FwdHShapes<'_>,
    cu_seqlens: Option<&[i64]>,
    subseq_cu_seqlens: Option<&[i64]>,
    params: &FwdHParams,
) -> Result<SplitPlan> {
    let geo = fwd_h::validate_chunk_gated_delta_rule_fwd_h(shapes, cu_seqlens, params)?;
    let bounds: Vec<(usize, usize)> = geo
        .seqs
        .iter()
        .map(|s| (s.batch * geo.t + s.bos, s.batch * geo.t + s.eos))
        .collect();
    let pieces = match subseq_cu_seqlens {
        Some(p) => p.to_vec(),
        None => {
            let lens: Vec<usize> = geo.seqs.iter().map(|s| s.len()).collect();
            auto_subseq_cu_seqlens(&lens, geo.hv, geo.v, geo.bt, DEFAULT_NUM_SMS)
        }
    };
    let offsets = subseq_offsets(&pieces, &bounds, geo.bt)?;
    Ok(SplitPlan {
        geometry: geo,
        subseq_cu_seqlens: pieces,
        subseq_offsets: offsets,
    })
}

/// Section 2 computed through the split (spec 5.3): pre-scan of the pieces, merge into the
/// pieces' initial states, section 2 on the pieces. Equal to
/// [`chunk_gated_delta_rule_fwd_h`] on the same inputs whatever the (valid) split.
pub fn chunk_gated_delta_rule_fwd_h_split<T: Real>(
    inp: &FwdHSplitInputs<'_, T>,
    params: &FwdHParams,
) -> Result<fwd_h::FwdHOutputs<T>> {
    let f = &inp.fwd_h;
    let plan = validate_chunk_gated_delta_rule_fwd_h_split(
        &f.shapes(),
        f.cu_seqlens,
        inp.subseq_cu_seqlens,
        params,
    )?;
    let geo = &plan.geometry;
    let (b, t) = (geo.b, geo.t);
    let (k, w, u) = (flat4(f.k), flat4(f.w), flat4(f.u));
    let g = f.g.map(flat3);
    let gk = f.gk.map(flat4);
    let pieces = FwdHInputs {
        k: k.view(),
        w: w.view(),
        u: u.view(),
        g: g.as_ref().map(|g| g.view()),
        gk: gk.as_ref().map(|gk| gk.view()),
        initial_state: None,
        cu_seqlens: Some(&plan.subseq_cu_seqlens),
    };
    let hm = fwd_h_pre_scan(
        &pieces,
        &FwdHPreScanParams {
            chunk_size: params.chunk_size,
        },
    )?
    .hm;
    let merged = fwd_h_merge(
        &FwdHMergeInputs {
            hm: hm.view(),
            subseq_offsets: &plan.subseq_offsets,
            initial_state: f.initial_state.as_ref().map(|a| a.view()),
        },
        &FwdHMergeParams {
            state_v_first: params.state_v_first,
            output_final_state: false,
        },
    )?;
    let run = chunk_gated_delta_rule_fwd_h(
        &FwdHInputs {
            initial_state: Some(merged.initial_states.view()),
            ..pieces
        },
        params,
    )?;
    let h = if f.cu_seqlens.is_some() {
        run.h
    } else {
        let sh = run.h.shape().to_vec();
        run.h
            .into_shape_with_order((b, sh[1] / b, sh[2], sh[3], sh[4]))
            .map_err(|e| Error::shape("h", "a [B, NT, ...] layout", e.to_string()))?
    };
    let v_new = match run.v_new {
        Some(vn) => Some(
            vn.into_shape_with_order((b, t, geo.hv, geo.v))
                .map_err(|e| Error::shape("v_new", "a [B, T, HV, V] layout", e.to_string()))?,
        ),
        None => None,
    };
    let final_state = run.final_state.map(|fs| {
        let last: Vec<usize> = plan.subseq_offsets[1..]
            .iter()
            .map(|&o| o as usize - 1)
            .collect();
        fs.select(Axis(0), &last)
    });
    Ok(fwd_h::FwdHOutputs {
        h,
        v_new,
        final_state,
    })
}

/// A `[B, T, X, Y]` tensor as `[1, B·T, X, Y]` (standard layout copy).
fn flat4<T: Real>(a: ArrayView4<'_, T>) -> Array4<T> {
    let sh = a.shape().to_vec();
    let owned = a.as_standard_layout().into_owned();
    owned
        .into_shape_with_order((1, sh[0] * sh[1], sh[2], sh[3]))
        .expect("a standard-layout array reshapes")
}

/// A `[B, T, X]` tensor as `[1, B·T, X]`.
fn flat3<T: Real>(a: ArrayView3<'_, T>) -> Array3<T> {
    let sh = a.shape().to_vec();
    let owned = a.as_standard_layout().into_owned();
    owned
        .into_shape_with_order((1, sh[0] * sh[1], sh[2]))
        .expect("a standard-layout array reshapes")
}
