//! `gdn_fwd` (`conformance/spec/ops-delta-rule.md` §8): Gated DeltaNet with a scalar gate per head,
//! as its recurrent definition ([`gdn_fwd`]) and as the chunked pipeline of 8.5
//! ([`gdn_fwd_chunked`]).
//!
//! Definition, per sequence and value head, with `α_t = exp(g_t)`:
//!
//! ```text
//! S_t = α_t (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ,     o_t = scale · S_tᵀ q_t
//! ```
//!
//! Chunked, per chunk with `G = (1/ln 2) · chunk-local cumsum(g)` and incoming state `S_c`:
//! `L[r, j] = β_r (k_r · k_j) exp2(G_r − G_j)` (`j < r`), `A = (I + L)^{-1}`,
//! `w = A diag(β) (exp2(G) ⊙ K)`, `u = A diag(β) V`, `D = u − w S_c`,
//! `o_r = scale exp2(G_r) q_rᵀ S_c + scale Σ_{j ≤ r} (q_r · k_j) exp2(G_r − G_j) D_j`, and the
//! state step of section 2 with the raw keys and `g = G`.

use super::check::{self, Geometry};
use super::chunk;
use super::fwd_h::FWD_H_CHUNK_SIZES;
use super::prep::{self, DeltaFwdOutputs, ForwardCall, Prepared};
use crate::error::Result;
use crate::scalar::Real;
use crate::varlen::Seq;
use ndarray::linalg::general_mat_mul;
use ndarray::{s, Array2, ArrayView1, ArrayView2, ArrayView3, ArrayView4, Axis};

/// Parameters of [`gdn_fwd`] (`conformance/spec/ops-delta-rule.md` §8.2; `Default` gives the spec
/// defaults).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GdnFwdParams {
    /// `None` = `K^-0.5`.
    pub scale: Option<f64>,
    pub output_final_state: bool,
    pub use_qk_l2norm_in_kernel: bool,
    /// 16, 32 or 64 (default 64).
    pub chunk_size: i64,
    pub state_v_first: bool,
}

impl Default for GdnFwdParams {
    fn default() -> Self {
        GdnFwdParams {
            scale: None,
            output_final_state: false,
            use_qk_l2norm_in_kernel: false,
            chunk_size: 64,
            state_v_first: false,
        }
    }
}

/// Shapes of the inputs of [`gdn_fwd`].
#[derive(Debug, Clone, Copy, Default)]
pub struct GdnFwdShapes<'a> {
    pub q: &'a [usize],
    pub k: &'a [usize],
    pub v: &'a [usize],
    pub g: &'a [usize],
    pub beta: &'a [usize],
    pub initial_state: Option<&'a [usize]>,
}

/// The tensors of one [`gdn_fwd`] call.
#[derive(Debug, Clone)]
pub struct GdnFwdInputs<'a, T> {
    /// `[B, T, H, K]`.
    pub q: ArrayView4<'a, T>,
    /// `[B, T, H, K]`.
    pub k: ArrayView4<'a, T>,
    /// `[B, T, HV, V]`.
    pub v: ArrayView4<'a, T>,
    /// `[B, T, HV]`: per-step natural-log decay.
    pub g: ArrayView3<'a, T>,
    /// `[B, T, HV]`.
    pub beta: ArrayView3<'a, T>,
    pub initial_state: Option<ArrayView4<'a, T>>,
    pub cu_seqlens: Option<&'a [i64]>,
}

impl<'a, T> GdnFwdInputs<'a, T> {
    /// The required tensors; every optional input absent.
    pub fn new(
        q: ArrayView4<'a, T>,
        k: ArrayView4<'a, T>,
        v: ArrayView4<'a, T>,
        g: ArrayView3<'a, T>,
        beta: ArrayView3<'a, T>,
    ) -> Self {
        GdnFwdInputs {
            q,
            k,
            v,
            g,
            beta,
            initial_state: None,
            cu_seqlens: None,
        }
    }

    /// The shapes, for validation.
    pub fn shapes(&self) -> GdnFwdShapes<'_> {
        GdnFwdShapes {
            q: self.q.shape(),
            k: self.k.shape(),
            v: self.v.shape(),
            g: self.g.shape(),
            beta: self.beta.shape(),
            initial_state: self.initial_state.as_ref().map(|a| a.shape()),
        }
    }
}

/// Validates a [`gdn_fwd`] call (`conformance/spec/ops-delta-rule.md` §1.5, §8.7) from shapes and
/// parameters.
pub fn validate_gdn_fwd(
    shapes: &GdnFwdShapes<'_>,
    cu_seqlens: Option<&[i64]>,
    params: &GdnFwdParams,
) -> Result<Geometry> {
    let geo = ForwardCall {
        q: shapes.q,
        k: shapes.k,
        v: shapes.v,
        g: shapes.g,
        beta: shapes.beta,
        initial_state: shapes.initial_state,
        gate_per_key: false,
        cu_seqlens,
        chunk_size: params.chunk_size,
        allowed: FWD_H_CHUNK_SIZES,
        state_v_first: params.state_v_first,
    }
    .validate()?;
    check::scale(params.scale, geo.k)?;
    Ok(geo)
}

/// The definition (`conformance/spec/ops-delta-rule.md` §8.4): the per-token recurrence over every
/// (sequence, value head), `S_t = exp(g_t) (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ`, `o_t = scale
/// · S_tᵀ q_t`.
pub fn gdn_fwd<T: Real>(
    inp: &GdnFwdInputs<'_, T>,
    params: &GdnFwdParams,
) -> Result<DeltaFwdOutputs<T>> {
    run(inp, params, |pre, geo, seq, hv, s0, scale| {
        pre.recurrence(geo, seq, hv, &s0, scale)
    })
}

/// The chunked pipeline (`conformance/spec/ops-delta-rule.md` §8.5): per chunk, the WY factors `w,
/// u` of `A = (I + L)^{-1}`, `D = u − w S_c`, the output `o_r = scale exp2(G_r) q_rᵀ S_c + scale
/// Σ_{j ≤ r} (q_r · k_j) exp2(G_r − G_j) D_j` and the state step of section 2 (see the module
/// docs). Equal to [`gdn_fwd`] in exact arithmetic.
pub fn gdn_fwd_chunked<T: Real>(
    inp: &GdnFwdInputs<'_, T>,
    params: &GdnFwdParams,
) -> Result<DeltaFwdOutputs<T>> {
    run(inp, params, |pre, geo, seq, hv, s0, scale| {
        let (b, kh) = (seq.batch, geo.kh(hv));
        let mut st = s0;
        let mut o = Array2::<T>::zeros((seq.len(), geo.v));
        for (a, e) in seq.chunks(geo.bt) {
            let qc = pre.q.slice(s![b, a..e, kh, ..]);
            let kc = pre.k.slice(s![b, a..e, kh, ..]);
            let gl = chunk::log2_cumsum1(pre.gate.slice(s![b, a..e, hv]));
            let beta = pre.beta.slice(s![b, a..e, hv]);
            let (w, u) = wy(kc, pre.v.slice(s![b, a..e, hv, ..]), gl.view(), beta);
            let d = chunk::delta(&st, w.view(), u.view());
            let mut oc = o.slice_mut(s![a - seq.bos..e - seq.bos, ..]);
            general_mat_mul(scale, &qc, &st, T::zero(), &mut oc);
            for (mut row, &gr) in oc.axis_iter_mut(Axis(0)).zip(&gl) {
                row *= gr.exp2();
            }
            let mut qk = qc.dot(&kc.t());
            decay_lower(&mut qk, gl.view(), true);
            general_mat_mul(scale, &qk, &d, T::one(), &mut oc);
            chunk::advance(&mut st, kc, &d, Some(gl.view()), None);
        }
        (o, st)
    })
}

/// `M[r, j] ← M[r, j] · exp2(G_r − G_j)` for `j < r` (and `j == r` when `diag`), `0` above
/// (selected, never multiplied by an overflowing factor).
fn decay_lower<T: Real>(m: &mut Array2<T>, g: ArrayView1<'_, T>, diag: bool) {
    for ((r, j), x) in m.indexed_iter_mut() {
        if j < r || (diag && j == r) {
            *x *= (g[r] - g[j]).exp2();
        } else {
            *x = T::zero();
        }
    }
}

/// GDN's WY factors of one chunk: `A = (I + L)^{-1}`, `w = A diag(β) (exp2(G) ⊙ K)`,
/// `u = A diag(β) V`.
fn wy<T: Real>(
    k: ArrayView2<'_, T>,
    v: ArrayView2<'_, T>,
    g: ArrayView1<'_, T>,
    beta: ArrayView1<'_, T>,
) -> (Array2<T>, Array2<T>) {
    let mut l = k.dot(&k.t());
    decay_lower(&mut l, g, false);
    let mut kb = k.to_owned();
    let mut vb = v.to_owned();
    for (((mut lr, mut kr), mut vr), (&b, &gr)) in l
        .axis_iter_mut(Axis(0))
        .zip(kb.axis_iter_mut(Axis(0)))
        .zip(vb.axis_iter_mut(Axis(0)))
        .zip(beta.iter().zip(g))
    {
        lr *= b;
        kr *= b * gr.exp2();
        vr *= b;
    }
    let a = chunk::unit_lower_inverse(&l);
    (a.dot(&kb), a.dot(&vb))
}

/// GDN's prepared tensors: only `q, k` change (L2 norm); the gate is the scalar `g`.
type GdnPrepared<'a, T> = Prepared<'a, T, ArrayView3<'a, T>>;

/// Validation, preprocessing and the parallel loop over (sequence, value head) shared by both
/// forms; `head` computes one pair from its initial state.
fn run<T: Real, F>(
    inp: &GdnFwdInputs<'_, T>,
    params: &GdnFwdParams,
    head: F,
) -> Result<DeltaFwdOutputs<T>>
where
    F: Fn(&GdnPrepared<'_, T>, &Geometry, Seq, usize, Array2<T>, T) -> (Array2<T>, Array2<T>)
        + Sync,
{
    let geo = validate_gdn_fwd(&inp.shapes(), inp.cu_seqlens, params)?;
    let scale = T::c(check::scale(params.scale, geo.k)?);
    let pre = Prepared {
        q: prep::l2norm(inp.q, params.use_qk_l2norm_in_kernel),
        k: prep::l2norm(inp.k, params.use_qk_l2norm_in_kernel),
        v: inp.v,
        beta: inp.beta.into(),
        gate: inp.g,
    };
    Ok(prep::run_heads(
        &geo,
        inp.initial_state.as_ref(),
        params.output_final_state,
        params.state_v_first,
        |seq, hv, s0| head(&pre, &geo, seq, hv, s0, scale),
    ))
}
