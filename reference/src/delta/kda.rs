//! `kda_fwd` (`conformance/spec/ops-delta-rule.md` §6): the Kimi Delta Attention forward, as its
//! recurrent definition ([`kda_fwd`]) and as the chunked pipeline ([`kda_fwd_chunked`]: gate cumsum
//! → `kda_intra` → `chunk_gated_delta_rule_fwd_h` → output).
//!
//! Definition, per sequence and value head, after the optional in-kernel preprocessing (L2 norm
//! of `q, k`; `β = sigmoid(beta)·(1|2)`; `a = kda_gate(g, A_log, dt_bias, lower_bound)`):
//!
//! ```text
//! S_t = (I − β_t k_t k_tᵀ) diag(exp(a_t)) S_{t−1} + β_t k_t v_tᵀ,     o_t = scale · S_tᵀ q_t
//! ```
//!
//! Chunked, per chunk with `G = (1/ln 2) · chunk-local cumsum(a)` and incoming state `S_c`:
//! `D = u − w S_c`, `o_r = scale (q_r ⊙ exp2(G_r))ᵀ S_c + Σ_{j ≤ r} Aqk[r, j] D_j`,
//! `S_{c+1} = diag(exp2(G_ℓ)) S_c + kgᵀ D`.

use super::check::{self, Geometry};
use super::chunk;
use super::intra::{intra_chunk, KDA_CHUNK_SIZES};
use super::prep::{self, DeltaFwdOutputs, ForwardCall, Prepared};
use crate::error::{Error, Result};
use crate::scalar::Real;
use crate::varlen::Seq;
use ndarray::linalg::general_mat_mul;
use ndarray::{s, Array2, ArrayView1, ArrayView3, ArrayView4, CowArray, Ix4};

/// Parameters of [`kda_fwd`] (`conformance/spec/ops-delta-rule.md` §6.2; `Default` gives the spec
/// defaults).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KdaFwdParams {
    /// `None` = `K^-0.5`.
    pub scale: Option<f64>,
    pub output_final_state: bool,
    pub use_qk_l2norm_in_kernel: bool,
    /// `g` is the raw gate input of `kda_gate` (with `A_log`, `dt_bias`, `lower_bound`).
    pub use_gate_in_kernel: bool,
    /// Finite, `< 0`; selects the lower-bound gate (with `use_gate_in_kernel`).
    pub lower_bound: Option<f64>,
    pub use_beta_sigmoid_in_kernel: bool,
    /// `β = 2 · sigmoid(beta)`; requires `use_beta_sigmoid_in_kernel`.
    pub allow_neg_eigval: bool,
    /// Numerics hint (per-step gates in `[−5, 0]`); no effect on the exact result.
    pub safe_gate: bool,
    /// 32 or 64 (default 64).
    pub chunk_size: i64,
    pub state_v_first: bool,
}

impl Default for KdaFwdParams {
    fn default() -> Self {
        KdaFwdParams {
            scale: None,
            output_final_state: false,
            use_qk_l2norm_in_kernel: false,
            use_gate_in_kernel: false,
            lower_bound: None,
            use_beta_sigmoid_in_kernel: false,
            allow_neg_eigval: false,
            safe_gate: false,
            chunk_size: 64,
            state_v_first: false,
        }
    }
}

/// Shapes of the inputs of [`kda_fwd`].
#[derive(Debug, Clone, Copy, Default)]
pub struct KdaFwdShapes<'a> {
    pub q: &'a [usize],
    pub k: &'a [usize],
    pub v: &'a [usize],
    pub g: &'a [usize],
    pub beta: &'a [usize],
    pub initial_state: Option<&'a [usize]>,
    pub a_log: Option<&'a [usize]>,
    pub dt_bias: Option<&'a [usize]>,
}

/// The tensors of one [`kda_fwd`] call.
#[derive(Debug, Clone)]
pub struct KdaFwdInputs<'a, T> {
    /// `[B, T, H, K]`.
    pub q: ArrayView4<'a, T>,
    /// `[B, T, H, K]`.
    pub k: ArrayView4<'a, T>,
    /// `[B, T, HV, V]`.
    pub v: ArrayView4<'a, T>,
    /// `[B, T, HV, K]`: natural-log decay, or the raw gate input with `use_gate_in_kernel`.
    pub g: ArrayView4<'a, T>,
    /// `[B, T, HV]`: `β`, or logits with `use_beta_sigmoid_in_kernel`.
    pub beta: ArrayView3<'a, T>,
    pub initial_state: Option<ArrayView4<'a, T>>,
    /// `[HV]`, only with `use_gate_in_kernel`.
    pub a_log: Option<ArrayView1<'a, T>>,
    /// `[HV · K]`, only with `use_gate_in_kernel`.
    pub dt_bias: Option<ArrayView1<'a, T>>,
    pub cu_seqlens: Option<&'a [i64]>,
}

impl<'a, T> KdaFwdInputs<'a, T> {
    /// The required tensors; every optional input absent.
    pub fn new(
        q: ArrayView4<'a, T>,
        k: ArrayView4<'a, T>,
        v: ArrayView4<'a, T>,
        g: ArrayView4<'a, T>,
        beta: ArrayView3<'a, T>,
    ) -> Self {
        KdaFwdInputs {
            q,
            k,
            v,
            g,
            beta,
            initial_state: None,
            a_log: None,
            dt_bias: None,
            cu_seqlens: None,
        }
    }

    /// The shapes, for validation.
    pub fn shapes(&self) -> KdaFwdShapes<'_> {
        KdaFwdShapes {
            q: self.q.shape(),
            k: self.k.shape(),
            v: self.v.shape(),
            g: self.g.shape(),
            beta: self.beta.shape(),
            initial_state: self.initial_state.as_ref().map(|a| a.shape()),
            a_log: self.a_log.as_ref().map(|a| a.shape()),
            dt_bias: self.dt_bias.as_ref().map(|a| a.shape()),
        }
    }
}

/// Validates a [`kda_fwd`] call (`conformance/spec/ops-delta-rule.md` §1.5, §6.7) from shapes and
/// parameters.
pub fn validate_kda_fwd(
    shapes: &KdaFwdShapes<'_>,
    cu_seqlens: Option<&[i64]>,
    params: &KdaFwdParams,
) -> Result<Geometry> {
    let geo = ForwardCall {
        q: shapes.q,
        k: shapes.k,
        v: shapes.v,
        g: shapes.g,
        beta: shapes.beta,
        initial_state: shapes.initial_state,
        gate_per_key: true,
        cu_seqlens,
        chunk_size: params.chunk_size,
        allowed: KDA_CHUNK_SIZES,
        state_v_first: params.state_v_first,
    }
    .validate()?;
    validate_gate_args(shapes, &geo, params)?;
    if params.allow_neg_eigval && !params.use_beta_sigmoid_in_kernel {
        return Err(Error::param(
            "allow_neg_eigval",
            "use_beta_sigmoid_in_kernel = true",
            "use_beta_sigmoid_in_kernel = false",
        ));
    }
    check::scale(params.scale, geo.k)?;
    Ok(geo)
}

/// `A_log`, `dt_bias`, `lower_bound` and `safe_gate` against `use_gate_in_kernel`
/// (`conformance/spec/ops-delta-rule.md` §6.7).
fn validate_gate_args(
    shapes: &KdaFwdShapes<'_>,
    geo: &Geometry,
    params: &KdaFwdParams,
) -> Result<()> {
    if let Some(lb) = params.lower_bound {
        if !lb.is_finite() || lb >= 0.0 {
            return Err(Error::param("lower_bound", "a finite value < 0", lb));
        }
    }
    if !params.use_gate_in_kernel {
        for (arg, given) in [("A_log", shapes.a_log), ("dt_bias", shapes.dt_bias)] {
            if let Some(sh) = given {
                return Err(Error::missing(
                    arg,
                    "no tensor without use_gate_in_kernel",
                    format!("a tensor of shape {sh:?}"),
                ));
            }
        }
        return Ok(());
    }
    if let Some(a) = shapes.a_log {
        check::exact("A_log", a, &[geo.hv], "[HV]")?;
    } else if params.lower_bound.is_none() {
        return Err(Error::missing(
            "A_log",
            "A_log (or lower_bound) with use_gate_in_kernel",
            "neither",
        ));
    }
    if let Some(d) = shapes.dt_bias {
        check::exact("dt_bias", d, &[geo.hv * geo.k], "[HV * K]")?;
    }
    if params.safe_gate && !params.lower_bound.is_some_and(|lb| lb >= -5.0) {
        return Err(Error::param(
            "lower_bound",
            "in [-5, 0) with safe_gate and use_gate_in_kernel",
            format!("{:?}", params.lower_bound),
        ));
    }
    Ok(())
}

/// KDA's prepared tensors: the gate is the per-key natural-log decay `a`.
type KdaPrepared<'a, T> = Prepared<'a, T, CowArray<'a, T, Ix4>>;

/// `conformance/spec/ops-delta-rule.md` §6.4 steps 1–3: L2 norm of `q, k`, `β` from logits, `a =
/// kda_gate(g, ...)`, as asked.
fn prepare<'a, T: Real>(inp: &KdaFwdInputs<'a, T>, p: &KdaFwdParams) -> Result<KdaPrepared<'a, T>> {
    let gate = if p.use_gate_in_kernel {
        crate::gate::kda_gate(inp.g, inp.a_log, inp.dt_bias, p.lower_bound)?.into()
    } else {
        inp.g.into()
    };
    Ok(Prepared {
        q: prep::l2norm(inp.q, p.use_qk_l2norm_in_kernel),
        k: prep::l2norm(inp.k, p.use_qk_l2norm_in_kernel),
        v: inp.v,
        beta: prep::beta(inp.beta, p.use_beta_sigmoid_in_kernel, p.allow_neg_eigval),
        gate,
    })
}

/// The definition (`conformance/spec/ops-delta-rule.md` §6.4): the per-token recurrence over every
/// (sequence, value head), `S_t = (I − β_t k_t k_tᵀ) diag(exp(a_t)) S_{t−1} + β_t k_t v_tᵀ`, `o_t =
/// scale · S_tᵀ q_t`, after the in-kernel preprocessing the parameters ask for.
pub fn kda_fwd<T: Real>(
    inp: &KdaFwdInputs<'_, T>,
    params: &KdaFwdParams,
) -> Result<DeltaFwdOutputs<T>> {
    run(inp, params, |pre, geo, seq, hv, s0, scale| {
        pre.recurrence(geo, seq, hv, &s0, scale)
    })
}

/// The chunked pipeline (`conformance/spec/ops-delta-rule.md` §6.5): per chunk, `G` (exact `1/ln
/// 2`), the intra stage, the state step of section 2 and the output formula. Equal to [`kda_fwd`]
/// in exact arithmetic.
pub fn kda_fwd_chunked<T: Real>(
    inp: &KdaFwdInputs<'_, T>,
    params: &KdaFwdParams,
) -> Result<DeltaFwdOutputs<T>> {
    run(inp, params, |pre, geo, seq, hv, s0, scale| {
        let (b, kh) = (seq.batch, geo.kh(hv));
        let mut st = s0;
        let mut o = Array2::<T>::zeros((seq.len(), geo.v));
        for (a, e) in seq.chunks(geo.bt) {
            let q = pre.q.slice(s![b, a..e, kh, ..]);
            let gl = chunk::log2_cumsum(pre.gate.slice(s![b, a..e, hv, ..]));
            let ic = intra_chunk(
                q,
                pre.k.slice(s![b, a..e, kh, ..]),
                pre.v.slice(s![b, a..e, hv, ..]),
                gl.view(),
                pre.beta.slice(s![b, a..e, hv]),
                scale,
            );
            let d = chunk::delta(&st, ic.w.view(), ic.u.view());
            let mut oc = o.slice_mut(s![a - seq.bos..e - seq.bos, ..]);
            let qg = &q * &gl.mapv(T::exp2);
            general_mat_mul(scale, &qg, &st, T::zero(), &mut oc);
            general_mat_mul(T::one(), &ic.aqk, &d, T::one(), &mut oc);
            chunk::advance(&mut st, ic.kg.view(), &d, None, Some(gl.view()));
        }
        (o, st)
    })
}

/// Validation, preprocessing and the parallel loop over (sequence, value head) shared by both
/// forms; `head` computes one pair from its initial state.
fn run<T: Real, F>(
    inp: &KdaFwdInputs<'_, T>,
    params: &KdaFwdParams,
    head: F,
) -> Result<DeltaFwdOutputs<T>>
where
    F: Fn(&KdaPrepared<'_, T>, &Geometry, Seq, usize, Array2<T>, T) -> (Array2<T>, Array2<T>)
        + Sync,
{
    let geo = validate_kda_fwd(&inp.shapes(), inp.cu_seqlens, params)?;
    let scale = T::c(check::scale(params.scale, geo.k)?);
    let pre = prepare(inp, params)?;
    Ok(prep::run_heads(
        &geo,
        inp.initial_state.as_ref(),
        params.output_final_state,
        params.state_v_first,
        |seq, hv, s0| head(&pre, &geo, seq, hv, s0, scale),
    ))
}
