//! The truncation bound `Λ` of a warm-up (`conformance/spec/ops-delta-rule.md` §5.10), shared by
//! tests and split policies.
//!
//! For one (sequence, value head) the delta-rule step is
//! `S ↦ A_t S + β_t k_t v_tᵀ` with `A_t = (I − β_t k_t k_tᵀ) diag(α_t)`, `α_t = exp(a_t)` (a scalar
//! gate broadcast over `K`). Two runs from different states at token `t0` differ at `t1` by
//! `Δ_{t1} = A_{t1−1} ⋯ A_{t0} Δ_{t0}`, and since `‖I − β k kᵀ‖₂ = max(1, |1 − β‖k‖²|)` and
//! `‖diag(α)‖₂ = max_k α_k`,
//!
//! ```text
//! ‖Δ_{t1}‖₂ ≤ exp(Λ(t0, t1)) · ‖Δ_{t0}‖₂,
//! Λ(t0, t1) = Σ_{t = t0}^{t1 − 1} [ max_k a_{t,k} + ln max(1, |1 − β_t ‖k_t‖²|) ].
//! ```
//!
//! A warm-up that starts from zero at `t0` (so `Δ_{t0} = S_{t0}`) therefore ends at `t1` within
//! `exp(Λ) · ‖S_{t0}‖₂` of the exact state. For L2-normalised keys and `0 ≤ β ≤ 2` the second
//! term is 0 and `Λ` is the sum of each step's largest gate.

use crate::error::{Error, Result};
use crate::scalar::Real;
use ndarray::{ArrayView1, ArrayView2};

/// Natural-log per-step gates `a` (`α = exp(a)`) of one (sequence, value head).
#[derive(Debug, Clone, Copy)]
pub enum LogGates<'a, T> {
    /// Per-key gates `[T, K]` (KDA).
    PerKey(ArrayView2<'a, T>),
    /// Scalar gates `[T]`, broadcast over `K` (GDN).
    Scalar(ArrayView1<'a, T>),
}

/// `Λ(t0, t1)` of `conformance/spec/ops-delta-rule.md` §5.10 over the tokens `t0 .. t1` of one
/// (sequence, value head): `Σ_t [max_k a_{t,k} + ln max(1, |1 − β_t ‖k_t‖²|)]`, with `a` the
/// natural-log gates ([`LogGates`]), `beta` `[T]` and `k` `[T, K]` the keys the head reads (as
/// the recurrence uses them: not normalised here). Computed in `f64`; an empty window gives 0.
/// `exp(Λ)` bounds the factor by which a difference of states at `t0` can grow (or must shrink)
/// by `t1`, in the spectral norm. NaN inputs give NaN.
///
/// Refused: `k` not 2-D, `beta` or `a` not matching `k`'s `[T]` / `[T, K]` (named by argument),
/// or not `t0 <= t1 <= T` (named `t0` / `t1`).
pub fn truncation_log_bound<T: Real>(
    a: LogGates<'_, T>,
    beta: ArrayView1<'_, T>,
    k: ArrayView2<'_, T>,
    t0: usize,
    t1: usize,
) -> Result<f64> {
    let (tn, kd) = k.dim();
    if beta.len() != tn {
        return Err(Error::shape("beta", format!("[T] = [{tn}]"), beta.shape()));
    }
    match &a {
        LogGates::PerKey(g) if g.dim() != (tn, kd) => {
            return Err(Error::shape(
                "a",
                format!("[T, K] = [{tn}, {kd}]"),
                g.shape(),
            ))
        }
        LogGates::Scalar(g) if g.len() != tn => {
            return Err(Error::shape("a", format!("[T] = [{tn}]"), g.shape()))
        }
        _ => {}
    }
    if t1 > tn {
        return Err(Error::param("t1", format!("t1 <= T = {tn}"), t1));
    }
    if t0 > t1 {
        return Err(Error::param("t0", format!("t0 <= t1 = {t1}"), t0));
    }
    let mut lam = 0.0f64;
    for t in t0..t1 {
        let gate = match &a {
            LogGates::PerKey(g) => {
                g.row(t)
                    .iter()
                    .map(|x| x.f64())
                    .fold(
                        f64::NEG_INFINITY,
                        |m, x| if x.is_nan() { x } else { m.max(x) },
                    )
            }
            LogGates::Scalar(g) => g[t].f64(),
        };
        let kk: f64 = k.row(t).iter().map(|x| x.f64() * x.f64()).sum();
        let shrink = (1.0 - beta[t].f64() * kk).abs();
        let norm = if shrink.is_nan() {
            shrink
        } else {
            shrink.max(1.0)
        };
        lam += gate + norm.ln();
    }
    Ok(lam)
}
