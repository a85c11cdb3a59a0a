//! `chunk_gated_delta_rule_fwd_h` (`conformance/spec/ops-delta-rule.md` §2): the inter-chunk state
//! recurrence of a chunked delta rule, given the per-chunk WY factors `w`, `u`.
//!
//! For every sequence `n` and value head `hv`, with `S` (`K × V`) starting at
//! `initial_state[n, hv]` (or zero), for every chunk `c`:
//!
//! ```text
//! h[c] = S;   D = U_c − W_c S   (= v_new rows);   S ← γ_c diag(λ_c) S + K̃_cᵀ D
//! γ_c = exp2(G_ℓ) (g),  λ_c = exp2(Gk_ℓ) (gk),  K̃_c rows exp2(G_ℓ − G_r) · k_rᵀ
//! ```
//!
//! `g`/`gk` are chunk-local cumulative gates in log2 units, read at the last valid row `ℓ` of
//! each (possibly partial) chunk.

use super::check::{self, Geometry};
use super::chunk;
use crate::error::Result;
use crate::scalar::Real;
use crate::varlen::Seq;
use ndarray::{
    s, Array, Array2, Array4, Array5, ArrayView1, ArrayView2, ArrayView3, ArrayView4, ArrayViewMut,
    ArrayViewMut2, Axis, RemoveAxis,
};
use rayon::prelude::*;

/// Allowed `chunk_size` of sections 2, 3 and 5.
pub(crate) const FWD_H_CHUNK_SIZES: &[usize] = &[16, 32, 64];

/// Parameters of [`chunk_gated_delta_rule_fwd_h`] (`conformance/spec/ops-delta-rule.md` §2.2;
/// `Default` gives the spec defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FwdHParams {
    /// `BT`: 16, 32 or 64 (default 64).
    pub chunk_size: i64,
    /// Return `final_state` (default false).
    pub output_final_state: bool,
    /// Return `v_new` (default true).
    pub save_new_value: bool,
    /// States in memory are `Sᵀ` (`[..., V, K]`) (default false).
    pub state_v_first: bool,
}

impl Default for FwdHParams {
    fn default() -> Self {
        FwdHParams {
            chunk_size: 64,
            output_final_state: false,
            save_new_value: true,
            state_v_first: false,
        }
    }
}

/// Shapes of the inputs of [`chunk_gated_delta_rule_fwd_h`] (and of the pre-scan and split
/// ops, which take the same tensors).
#[derive(Debug, Clone, Copy, Default)]
pub struct FwdHShapes<'a> {
    /// `[B, T, H, K]`.
    pub k: &'a [usize],
    /// `[B, T, HV, K]`.
    pub w: &'a [usize],
    /// `[B, T, HV, V]`.
    pub u: &'a [usize],
    /// `[B, T, HV]` when given.
    pub g: Option<&'a [usize]>,
    /// `[B, T, HV, K]` when given.
    pub gk: Option<&'a [usize]>,
    /// `[N, HV, K, V]` (`[N, HV, V, K]` with `state_v_first`) when given.
    pub initial_state: Option<&'a [usize]>,
}

/// The tensors of one [`chunk_gated_delta_rule_fwd_h`] call.
#[derive(Debug, Clone)]
pub struct FwdHInputs<'a, T> {
    pub k: ArrayView4<'a, T>,
    pub w: ArrayView4<'a, T>,
    pub u: ArrayView4<'a, T>,
    /// Scalar gate `G` (chunk-local cumsum, log2 units), `[B, T, HV]`.
    pub g: Option<ArrayView3<'a, T>>,
    /// Per-key gate `Gk`, `[B, T, HV, K]`.
    pub gk: Option<ArrayView4<'a, T>>,
    pub initial_state: Option<ArrayView4<'a, T>>,
    pub cu_seqlens: Option<&'a [i64]>,
}

impl<'a, T> FwdHInputs<'a, T> {
    /// The three required tensors; every optional input absent.
    pub fn new(k: ArrayView4<'a, T>, w: ArrayView4<'a, T>, u: ArrayView4<'a, T>) -> Self {
        FwdHInputs {
            k,
            w,
            u,
            g: None,
            gk: None,
            initial_state: None,
            cu_seqlens: None,
        }
    }

    /// The shapes, for validation.
    pub fn shapes(&self) -> FwdHShapes<'_> {
        FwdHShapes {
            k: self.k.shape(),
            w: self.w.shape(),
            u: self.u.shape(),
            g: self.g.as_ref().map(|a| a.shape()),
            gk: self.gk.as_ref().map(|a| a.shape()),
            initial_state: self.initial_state.as_ref().map(|a| a.shape()),
        }
    }
}

/// Outputs of [`chunk_gated_delta_rule_fwd_h`] (`conformance/spec/ops-delta-rule.md` §2.3), in the
/// compute precision.
#[derive(Debug, Clone, PartialEq)]
pub struct FwdHOutputs<T> {
    /// `[B, NT, HV, K, V]` (`[B, NT, HV, V, K]` with `state_v_first`): the state before each chunk.
    pub h: Array5<T>,
    /// `[B, T, HV, V]` when `save_new_value`.
    pub v_new: Option<Array4<T>>,
    /// `[N, HV, K, V]` (or `[N, HV, V, K]`) when `output_final_state`.
    pub final_state: Option<Array4<T>>,
}

/// Checks `k, w, u, g, gk`, `chunk_size` and `cu_seqlens`
/// (`conformance/spec/ops-delta-rule.md` §1.5, §2.6) without the state.
pub(crate) fn validate_kwu(
    shapes: &FwdHShapes<'_>,
    cu_seqlens: Option<&[i64]>,
    chunk_size: i64,
) -> Result<Geometry> {
    let (b, t, h, k) = check::keys("k", shapes.k)?;
    let (hv, v) = check::values("u", shapes.u, ("k", shapes.k))?;
    check::rank("w", shapes.w, 4)?;
    check::exact("w", shapes.w, &[b, t, hv, k], "[B, T, HV, K]")?;
    if let Some(g) = shapes.g {
        check::rank("g", g, 3)?;
        check::exact("g", g, &[b, t, hv], "[B, T, HV]")?;
    }
    if let Some(gk) = shapes.gk {
        check::rank("gk", gk, 4)?;
        check::exact("gk", gk, &[b, t, hv, k], "[B, T, HV, K]")?;
    }
    check::geometry(
        (b, t, h, k, hv, v),
        cu_seqlens,
        chunk_size,
        FWD_H_CHUNK_SIZES,
    )
}

/// Validates a [`chunk_gated_delta_rule_fwd_h`] call
/// (`conformance/spec/ops-delta-rule.md` §1.5, §2.6) from shapes alone.
pub fn validate_chunk_gated_delta_rule_fwd_h(
    shapes: &FwdHShapes<'_>,
    cu_seqlens: Option<&[i64]>,
    params: &FwdHParams,
) -> Result<Geometry> {
    let geo = validate_kwu(shapes, cu_seqlens, params.chunk_size)?;
    check::state(
        "initial_state",
        shapes.initial_state,
        &geo,
        params.state_v_first,
    )?;
    Ok(geo)
}

/// Runs the chunked state recurrence of `conformance/spec/ops-delta-rule.md` §2.4 over every
/// (sequence, value head): from `S = initial_state[n, hv]` (or 0), for every chunk `c`, `h[c] = S`,
/// `D = U_c − W_c S` (`v_new` rows), `S ← exp2(G_ℓ) diag(exp2(Gk_ℓ)) S + K̃_cᵀ D` with `K̃_c` rows
/// `exp2(G_ℓ − G_r) k_rᵀ` (each gate factor only when that gate is given); `final_state = S`.
pub fn chunk_gated_delta_rule_fwd_h<T: Real>(
    inp: &FwdHInputs<'_, T>,
    params: &FwdHParams,
) -> Result<FwdHOutputs<T>> {
    let geo = validate_chunk_gated_delta_rule_fwd_h(&inp.shapes(), inp.cu_seqlens, params)?;
    let varlen = inp.cu_seqlens.is_some();
    let vf = params.state_v_first;
    let (kd, vd) = (geo.k, geo.v);
    let per_head: Vec<_> = tasks(&geo)
        .into_par_iter()
        .map(|(i, hv)| {
            let seq = geo.seqs[i];
            let s0 = load_state(inp.initial_state.as_ref(), seq.n, hv, kd, vd, vf);
            (i, hv, SeqInputs::of(inp, &geo, seq, hv).run(s0, geo.bt))
        })
        .collect();

    let nt = geo.nt(varlen);
    let starts = geo.chunk_starts(varlen);
    let (sa, sb) = if vf { (vd, kd) } else { (kd, vd) };
    let mut h = Array5::<T>::zeros((geo.b, nt, geo.hv, sa, sb));
    let mut v_new = params
        .save_new_value
        .then(|| Array4::<T>::zeros((geo.b, geo.t, geo.hv, vd)));
    let mut final_state = params
        .output_final_state
        .then(|| Array4::<T>::zeros(geo.state_shape(vf)));
    scatter(&mut h, 2, &geo, &per_head, |mut hh, seq, run| {
        for (c, hc) in run.h.iter().enumerate() {
            store_state(
                hh.slice_mut(s![seq.batch, starts[seq.n] + c, .., ..]),
                hc,
                vf,
            );
        }
    });
    if let Some(vn) = v_new.as_mut() {
        scatter(vn, 2, &geo, &per_head, |mut vh, seq, run| {
            vh.slice_mut(s![seq.batch, seq.bos..seq.eos, ..])
                .assign(&run.v_new);
        });
    }
    if let Some(fs) = final_state.as_mut() {
        scatter(fs, 1, &geo, &per_head, |mut fh, seq, run| {
            store_state(fh.slice_mut(s![seq.n, .., ..]), &run.state, vf);
        });
    }
    Ok(FwdHOutputs {
        h,
        v_new,
        final_state,
    })
}

/// Every (sequence index, value head) pair.
pub(crate) fn tasks(geo: &Geometry) -> Vec<(usize, usize)> {
    (0..geo.n())
        .flat_map(|i| (0..geo.hv).map(move |hv| (i, hv)))
        .collect()
}

/// Writes per-(sequence index, value head) `results` into `out`, in parallel over its value-head
/// axis `axis`: `write(out_hv, seq, result)` gets `out` without that axis.
pub(crate) fn scatter<T, D, R, F>(
    out: &mut Array<T, D>,
    axis: usize,
    geo: &Geometry,
    results: &[(usize, usize, R)],
    write: F,
) where
    T: Real,
    D: RemoveAxis,
    R: Sync,
    F: Fn(ArrayViewMut<'_, T, D::Smaller>, Seq, &R) + Sync,
{
    let mut by_head: Vec<Vec<usize>> = vec![Vec::new(); out.len_of(Axis(axis))];
    for (j, &(_, hv, _)) in results.iter().enumerate() {
        if let Some(list) = by_head.get_mut(hv) {
            list.push(j);
        }
    }
    out.axis_iter_mut(Axis(axis))
        .into_par_iter()
        .zip(by_head.par_iter())
        .for_each(|(mut o, list)| {
            for &j in list {
                let (i, _, r) = &results[j];
                write(o.view_mut(), geo.seqs[*i], r);
            }
        });
}

/// The key-first state `[n, hv]` of an optional state tensor (zeros when absent).
pub(crate) fn load_state<T: Real>(
    st: Option<&ArrayView4<'_, T>>,
    n: usize,
    hv: usize,
    k: usize,
    v: usize,
    state_v_first: bool,
) -> Array2<T> {
    match st {
        None => Array2::zeros((k, v)),
        Some(st) => {
            let m = st.slice(s![n, hv, .., ..]);
            let m = if state_v_first { m.reversed_axes() } else { m };
            m.as_standard_layout().into_owned()
        }
    }
}

/// Writes the key-first state `s` into `dst` (transposed with `state_v_first`).
pub(crate) fn store_state<T: Real>(
    mut dst: ArrayViewMut2<'_, T>,
    s: &Array2<T>,
    state_v_first: bool,
) {
    if state_v_first {
        dst.assign(&s.t());
    } else {
        dst.assign(s);
    }
}

/// The recurrence of one (sequence, value head).
pub(crate) struct SeqRun<T> {
    /// The state before each chunk.
    pub h: Vec<Array2<T>>,
    /// `D` rows of every chunk (`L × V`).
    pub v_new: Array2<T>,
    /// The state after the last chunk.
    pub state: Array2<T>,
}

/// The rows of one (sequence, value head) of section 2's tensors: `k, w` `L × K`, `u` `L × V`,
/// the gates by row.
pub(crate) struct SeqInputs<'v, T> {
    k: ArrayView2<'v, T>,
    w: ArrayView2<'v, T>,
    u: ArrayView2<'v, T>,
    g: Option<ArrayView1<'v, T>>,
    gk: Option<ArrayView2<'v, T>>,
}

impl<'v, T: Real> SeqInputs<'v, T> {
    /// The rows of sequence `seq`, value head `hv` (key head `geo.kh(hv)`) of `inp`.
    pub(crate) fn of(inp: &'v FwdHInputs<'_, T>, geo: &Geometry, seq: Seq, hv: usize) -> Self {
        let (b, r) = (seq.batch, seq.bos..seq.eos);
        SeqInputs {
            k: inp.k.slice(s![b, r.clone(), geo.kh(hv), ..]),
            w: inp.w.slice(s![b, r.clone(), hv, ..]),
            u: inp.u.slice(s![b, r.clone(), hv, ..]),
            g: inp.g.as_ref().map(|g| g.slice(s![b, r.clone(), hv])),
            gk: inp.gk.as_ref().map(|gk| gk.slice(s![b, r.clone(), hv, ..])),
        }
    }

    /// The chunk step of `conformance/spec/ops-delta-rule.md` §2.4 on rows `a..e` (within the
    /// sequence): `D = [U | 0] − W X`, then `X` advanced to the chunk's exit; returns `D`.
    pub(crate) fn step(&self, x: &mut Array2<T>, a: usize, e: usize) -> Array2<T> {
        let d = chunk::delta(x, self.w.slice(s![a..e, ..]), self.u.slice(s![a..e, ..]));
        chunk::advance(
            x,
            self.k.slice(s![a..e, ..]),
            &d,
            self.g.map(|g| g.slice_move(s![a..e])),
            self.gk.map(|gk| gk.slice_move(s![a..e, ..])),
        );
        d
    }

    /// The chunk ranges `a..e` of the sequence's `L` rows, the last one partial.
    pub(crate) fn chunks(&self, bt: usize) -> impl Iterator<Item = (usize, usize)> {
        let len = self.k.nrows();
        (0..len).step_by(bt).map(move |a| (a, (a + bt).min(len)))
    }

    /// `conformance/spec/ops-delta-rule.md` §2.4 for the sequence from state `s0` with chunks of
    /// `bt` rows.
    pub(crate) fn run(&self, s0: Array2<T>, bt: usize) -> SeqRun<T> {
        let len = self.k.nrows();
        let mut s = s0;
        let mut h = Vec::with_capacity(len.div_ceil(bt));
        let mut v_new = Array2::<T>::zeros((len, self.u.ncols()));
        for (a, e) in self.chunks(bt) {
            h.push(s.clone());
            let d = self.step(&mut s, a, e);
            v_new.slice_mut(s![a..e, ..]).assign(&d);
        }
        SeqRun { h, v_new, state: s }
    }
}
