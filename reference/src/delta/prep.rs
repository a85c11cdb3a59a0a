//! Pieces shared by `kda_fwd` and `gdn_fwd`: their common validation (6.7, 8.7), the in-kernel
//! preprocessing (`conformance/spec/ops-delta-rule.md` §6.4 steps 1–2) and the prepared tensors,
//! the recurrent definition (6.4, 8.4) for one (sequence, value head), and the parallel run over
//! (sequence, value head) with the assembly of the outputs.

use super::check::{self, Geometry};
use super::fwd_h::{load_state, scatter, store_state, tasks};
use super::intra::validate_qkvb;
use crate::error::Result;
use crate::scalar::Real;
use crate::varlen::Seq;
use ndarray::{
    s, Array2, Array4, ArrayView1, ArrayView2, ArrayView3, ArrayView4, Axis, CowArray, Ix3, Ix4,
    Zip,
};
use rayon::prelude::*;
use std::ops::Range;

/// Outputs of `kda_fwd` and `gdn_fwd` (`conformance/spec/ops-delta-rule.md` §6.3, §8.3), in the
/// compute precision.
#[derive(Debug, Clone, PartialEq)]
pub struct DeltaFwdOutputs<T> {
    /// `[B, T, HV, V]`.
    pub o: Array4<T>,
    /// `[N, HV, K, V]` (`[N, HV, V, K]` with `state_v_first`) when `output_final_state`.
    pub final_state: Option<Array4<T>>,
}

/// `x / sqrt(Σ_d x_d² + 1e-6)` along the last axis when `on`
/// (`conformance/spec/ops-delta-rule.md` §6.4 step 1), else `x`.
pub(crate) fn l2norm<'a, T: Real>(x: ArrayView4<'a, T>, on: bool) -> CowArray<'a, T, Ix4> {
    if !on {
        return x.into();
    }
    let mut y = x.to_owned();
    Zip::from(y.lanes_mut(Axis(3))).par_for_each(|mut row| {
        let ss = row.iter().fold(T::zero(), |acc, &e| acc + e * e);
        let inv = (ss + T::c(1e-6)).sqrt().recip();
        row *= inv;
    });
    y.into()
}

/// `β = sigmoid(beta) · (2 if allow_neg_eigval)` when `sigmoid`, else `beta`
/// (`conformance/spec/ops-delta-rule.md` §6.4 step 2).
pub(crate) fn beta<'a, T: Real>(
    beta: ArrayView3<'a, T>,
    sigmoid: bool,
    allow_neg_eigval: bool,
) -> CowArray<'a, T, Ix3> {
    if !sigmoid {
        return beta.into();
    }
    let m = if allow_neg_eigval {
        T::c(2.0)
    } else {
        T::one()
    };
    beta.mapv(|x| m * crate::gate::sigmoid(x)).into()
}

/// The natural-log gate of one (sequence, value head): per key (`L × K`) or scalar (`L`).
#[derive(Clone, Copy)]
pub(crate) enum SeqGate<'a, T> {
    PerKey(ArrayView2<'a, T>),
    Scalar(ArrayView1<'a, T>),
}

/// The natural-log gate of a whole forward call, by (batch, token range, value head).
pub(crate) trait GateRows<T> {
    /// The gate rows `r` of batch row `b`, value head `hv`.
    fn rows(&self, b: usize, r: Range<usize>, hv: usize) -> SeqGate<'_, T>;
}

/// KDA's per-key gate `[B, T, HV, K]`.
impl<T: Real> GateRows<T> for CowArray<'_, T, Ix4> {
    fn rows(&self, b: usize, r: Range<usize>, hv: usize) -> SeqGate<'_, T> {
        SeqGate::PerKey(self.slice(s![b, r, hv, ..]))
    }
}

/// GDN's scalar gate `[B, T, HV]`.
impl<T: Real> GateRows<T> for ArrayView3<'_, T> {
    fn rows(&self, b: usize, r: Range<usize>, hv: usize) -> SeqGate<'_, T> {
        SeqGate::Scalar(self.slice(s![b, r, hv]))
    }
}

/// The tensors of a forward after its in-kernel preprocessing: `q, k` (L2-normalised when
/// asked), `v`, `β` and the natural-log gate.
pub(crate) struct Prepared<'a, T: Real, G> {
    pub q: CowArray<'a, T, Ix4>,
    pub k: CowArray<'a, T, Ix4>,
    pub v: ArrayView4<'a, T>,
    pub beta: CowArray<'a, T, Ix3>,
    pub gate: G,
}

impl<T: Real, G: GateRows<T>> Prepared<'_, T, G> {
    /// The recurrent definition (`conformance/spec/ops-delta-rule.md` §6.4, §8.4) of sequence
    /// `seq`, value head `hv`, from `s0`: [`recurrence`] on its rows.
    pub(crate) fn recurrence(
        &self,
        geo: &Geometry,
        seq: Seq,
        hv: usize,
        s0: &Array2<T>,
        scale: T,
    ) -> (Array2<T>, Array2<T>) {
        let (b, kh, r) = (seq.batch, geo.kh(hv), seq.bos..seq.eos);
        recurrence(
            self.q.slice(s![b, r.clone(), kh, ..]),
            self.k.slice(s![b, r.clone(), kh, ..]),
            self.v.slice(s![b, r.clone(), hv, ..]),
            self.beta.slice(s![b, r.clone(), hv]),
            self.gate.rows(b, r, hv),
            s0,
            scale,
        )
    }
}

/// The recurrence of `conformance/spec/ops-delta-rule.md` §6.4 / §8.4 for one (sequence, value
/// head): for every token, `S ← diag(α_t) S`, `δ_t = β_t (v_t − Sᵀ k_t)`, `S ← S + k_t δ_tᵀ`, `o_t
/// = scale · Sᵀ q_t`, with `α_t = exp(a_t)`. Returns `o` (`L × V`) and the final state.
pub(crate) fn recurrence<T: Real>(
    q: ArrayView2<'_, T>,
    k: ArrayView2<'_, T>,
    v: ArrayView2<'_, T>,
    beta: ArrayView1<'_, T>,
    gate: SeqGate<'_, T>,
    s0: &Array2<T>,
    scale: T,
) -> (Array2<T>, Array2<T>) {
    let (len, kd, vd) = (k.nrows(), k.ncols(), v.ncols());
    let mut st: Vec<T> = s0.iter().copied().collect();
    let mut o = Array2::<T>::zeros((len, vd));
    let (mut kt, mut qt, mut alpha) = (
        vec![T::zero(); kd],
        vec![T::zero(); kd],
        vec![T::zero(); kd],
    );
    let mut acc = vec![T::zero(); vd];
    for t in 0..len {
        for (dst, &x) in kt.iter_mut().zip(k.row(t)) {
            *dst = x;
        }
        for (dst, &x) in qt.iter_mut().zip(q.row(t)) {
            *dst = x;
        }
        match gate {
            SeqGate::PerKey(a) => {
                for (dst, &x) in alpha.iter_mut().zip(a.row(t)) {
                    *dst = x.exp();
                }
            }
            SeqGate::Scalar(a) => alpha.fill(a[t].exp()),
        }
        // S ← diag(α) S and acc = Sᵀ k
        acc.fill(T::zero());
        for ((row, &al), &ki) in st.chunks_exact_mut(vd).zip(&alpha).zip(&kt) {
            for (x, a) in row.iter_mut().zip(acc.iter_mut()) {
                *x *= al;
                *a += *x * ki;
            }
        }
        // δ = β (v − Sᵀ k)
        let b = beta[t];
        for (a, &vj) in acc.iter_mut().zip(v.row(t)) {
            *a = b * (vj - *a);
        }
        // S ← S + k δᵀ and o = scale · Sᵀ q
        let mut ot = o.row_mut(t);
        for ((row, &ki), &qi) in st.chunks_exact_mut(vd).zip(&kt).zip(&qt) {
            for ((x, &d), out) in row.iter_mut().zip(&acc).zip(ot.iter_mut()) {
                *x += ki * d;
                *out += *x * qi;
            }
        }
        ot *= scale;
    }
    let fin = Array2::from_shape_fn((kd, vd), |(i, j)| st[i * vd + j]);
    (o, fin)
}

/// The checks shared by `kda_fwd` and `gdn_fwd` (`conformance/spec/ops-delta-rule.md` §6.7, §8.7),
/// in order: `q, k, v, beta`, the gate `g` (`[B, T, HV, K]` per key, else `[B, T, HV]`),
/// `chunk_size` in `allowed` and `cu_seqlens`, then `initial_state`. The op checks its own
/// parameters after these.
pub(crate) struct ForwardCall<'a> {
    pub q: &'a [usize],
    pub k: &'a [usize],
    pub v: &'a [usize],
    pub g: &'a [usize],
    pub beta: &'a [usize],
    pub initial_state: Option<&'a [usize]>,
    pub gate_per_key: bool,
    pub cu_seqlens: Option<&'a [i64]>,
    pub chunk_size: i64,
    pub allowed: &'a [usize],
    pub state_v_first: bool,
}

impl ForwardCall<'_> {
    pub(crate) fn validate(&self) -> Result<Geometry> {
        let dims = validate_qkvb(self.q, self.k, self.v, self.beta)?;
        let (b, t, _, k, hv, _) = dims;
        if self.gate_per_key {
            check::rank("g", self.g, 4)?;
            check::exact("g", self.g, &[b, t, hv, k], "[B, T, HV, K]")?;
        } else {
            check::rank("g", self.g, 3)?;
            check::exact("g", self.g, &[b, t, hv], "[B, T, HV]")?;
        }
        let geo = check::geometry(dims, self.cu_seqlens, self.chunk_size, self.allowed)?;
        check::state(
            "initial_state",
            self.initial_state,
            &geo,
            self.state_v_first,
        )?;
        Ok(geo)
    }
}

/// Runs `head` on every (sequence, value head) in parallel, from its initial state (the
/// key-first `[n, hv]` of `initial_state`, or zero), and assembles `o` `[B, T, HV, V]` and,
/// when asked, `final_state`. `head` returns the sequence's `o` rows and its final state.
pub(crate) fn run_heads<T: Real, F>(
    geo: &Geometry,
    initial_state: Option<&ArrayView4<'_, T>>,
    output_final_state: bool,
    state_v_first: bool,
    head: F,
) -> DeltaFwdOutputs<T>
where
    F: Fn(Seq, usize, Array2<T>) -> (Array2<T>, Array2<T>) + Sync,
{
    let results: Vec<_> = tasks(geo)
        .into_par_iter()
        .map(|(i, hv)| {
            let seq = geo.seqs[i];
            let s0 = load_state(initial_state, seq.n, hv, geo.k, geo.v, state_v_first);
            (i, hv, head(seq, hv, s0))
        })
        .collect();
    let mut o = Array4::<T>::zeros((geo.b, geo.t, geo.hv, geo.v));
    scatter(&mut o, 2, geo, &results, |mut oh, seq, (rows, _)| {
        oh.slice_mut(s![seq.batch, seq.bos..seq.eos, ..])
            .assign(rows);
    });
    let mut final_state =
        output_final_state.then(|| Array4::<T>::zeros(geo.state_shape(state_v_first)));
    if let Some(fs) = final_state.as_mut() {
        scatter(fs, 1, geo, &results, |mut fh, seq, (_, fin)| {
            store_state(fh.slice_mut(s![seq.n, .., ..]), fin, state_v_first);
        });
    }
    DeltaFwdOutputs { o, final_state }
}
