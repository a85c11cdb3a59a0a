//! KDA gates: `kda_gate`, `kda_gate_chunk_cumsum` (`conformance/spec/ops-cumsum.md` §4-§5).
//!
//! Mirrors FLA 0.6.0 `naive_kda_gate` / `naive_kda_lowerbound_gate`: with
//! `a = g[b, t, hv, k] + dt_bias[hv·K + k]` (or `a = g` without bias),
//! - `y = -exp(A_log[hv]) · softplus(a)` (PyTorch softplus: `a` for `a > 20`, else
//!   `log1p(exp(a))`), or
//! - with `lower_bound`: `y = lower_bound · sigmoid(exp(A_log[hv]) · a)`, or
//!   `lower_bound · sigmoid(a)` when `A_log` is absent.

use crate::cumsum::{scan_segments, segments, validate_seq_scan};
use crate::error::{Error, Result};
use crate::scalar::Real;
use crate::varlen::check_chunk_size;
use ndarray::{Array4, ArrayView1, ArrayView4, Zip};

/// Validates `g` `[B, T, HV, K]`, `A_log` `[HV]` (required unless `lower_bound`), `dt_bias`
/// `[HV * K]`; returns `(B, T, HV, K)`.
///
/// `lower_bound`, when given, must be finite and `< 0`, as `kda_fwd`'s in-kernel gate requires
/// (`conformance/spec/ops-delta-rule.md` §6.7; the output is a log-decay and upstream uses values
/// in `[-5, 0)`).
pub fn validate_kda_gate(
    g_shape: &[usize],
    a_log_len: Option<usize>,
    dt_bias_len: Option<usize>,
    lower_bound: Option<f64>,
) -> Result<(usize, usize, usize, usize)> {
    let [b, t, hv, k] = *g_shape else {
        return Err(Error::shape("g", "rank 4 [B, T, HV, K]", g_shape));
    };
    if let Some(lb) = lower_bound {
        if !lb.is_finite() || lb >= 0.0 {
            return Err(Error::param("lower_bound", "a finite value < 0", lb));
        }
    }
    match (a_log_len, lower_bound) {
        (None, None) => {
            return Err(Error::missing(
                "A_log",
                "A_log [HV] (optional only with lower_bound)",
                "absent, and lower_bound is null",
            ))
        }
        (Some(n), _) if n != hv => {
            return Err(Error::shape("A_log", format!("[HV] = [{hv}]"), [n]));
        }
        _ => {}
    }
    if let Some(n) = dt_bias_len {
        let want = hv.checked_mul(k);
        if want != Some(n) {
            return Err(Error::shape(
                "dt_bias",
                format!("[HV * K] = [{hv} * {k}]"),
                [n],
            ));
        }
    }
    Ok((b, t, hv, k))
}

/// PyTorch's `softplus` (beta 1, threshold 20): `x` for `x > 20`, else `log1p(exp(x))`.
pub fn softplus<T: Real>(x: T) -> T {
    if x > T::c(20.0) {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// `sigmoid(x) = 1 / (1 + exp(-x))`.
pub fn sigmoid<T: Real>(x: T) -> T {
    T::one() / (T::one() + (-x).exp())
}

/// The two gate forms, with `exp(A_log)` precomputed per head.
enum GateForm<T> {
    /// `-exp(A_log[hv]) · softplus(a)`.
    Softplus { a_exp: Vec<T> },
    /// `lb · sigmoid(exp(A_log[hv]) · a)`, or `lb · sigmoid(a)` without `A_log`.
    Bounded { lb: T, a_exp: Option<Vec<T>> },
}

/// `y = -exp(A_log[hv]) · softplus(g + dt_bias)` (PyTorch softplus, threshold 20), or with
/// `lower_bound`: `y = lower_bound · sigmoid(exp(A_log[hv]) · a)` (`sigmoid(a)` without `A_log`).
///
/// `dt_bias` is indexed `hv · K + k`. Computed in `T` element by element (in parallel).
pub fn kda_gate<T: Real>(
    g: ArrayView4<'_, T>,
    a_log: Option<ArrayView1<'_, T>>,
    dt_bias: Option<ArrayView1<'_, T>>,
    lower_bound: Option<f64>,
) -> Result<Array4<T>> {
    let (_, _, _, k_dim) = validate_kda_gate(
        g.shape(),
        a_log.map(|a| a.len()),
        dt_bias.map(|d| d.len()),
        lower_bound,
    )?;
    let a_exp: Option<Vec<T>> = a_log.map(|a| a.iter().map(|x| x.exp()).collect());
    let form = match (lower_bound.map(T::c), a_exp) {
        (Some(lb), a_exp) => GateForm::Bounded { lb, a_exp },
        (None, Some(a_exp)) => GateForm::Softplus { a_exp },
        (None, None) => return Err(Error::missing("A_log", "A_log [HV]", "absent")),
    };
    let mut y = Array4::<T>::zeros(g.raw_dim());
    Zip::indexed(&mut y)
        .and(&g)
        .par_for_each(|(_, _, hv, k), y, &gv| {
            let a = match &dt_bias {
                Some(bias) => gv + bias[hv * k_dim + k],
                None => gv,
            };
            *y = match &form {
                GateForm::Softplus { a_exp } => -a_exp[hv] * softplus(a),
                GateForm::Bounded {
                    lb,
                    a_exp: Some(a_exp),
                } => *lb * sigmoid(a_exp[hv] * a),
                GateForm::Bounded { lb, a_exp: None } => *lb * sigmoid(a),
            };
        });
    Ok(y)
}

/// Parameters of [`kda_gate_chunk_cumsum`] (spec defaults via [`Self::new`], except
/// `chunk_size`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KdaGateChunkCumsumParams {
    pub chunk_size: i64,
    pub scale: Option<f64>,
    pub lower_bound: Option<f64>,
    pub reverse: bool,
}

impl KdaGateChunkCumsumParams {
    /// The spec's defaults for a given `chunk_size`: no scale, no lower bound, forward scan.
    pub fn new(chunk_size: i64) -> Self {
        KdaGateChunkCumsumParams {
            chunk_size,
            scale: None,
            lower_bound: None,
            reverse: false,
        }
    }
}

/// `chunk_local_cumsum(kda_gate(g, A_log, dt_bias, lower_bound), chunk_size, reverse, scale)`.
///
/// Both validations run before any work; the reference then composes the two operations
/// (a kernel fuses them without writing the gate values).
pub fn kda_gate_chunk_cumsum<T: Real>(
    g: ArrayView4<'_, T>,
    a_log: Option<ArrayView1<'_, T>>,
    dt_bias: Option<ArrayView1<'_, T>>,
    cu_seqlens: Option<&[i64]>,
    params: KdaGateChunkCumsumParams,
) -> Result<Array4<T>> {
    validate_kda_gate(
        g.shape(),
        a_log.map(|a| a.len()),
        dt_bias.map(|d| d.len()),
        params.lower_bound,
    )?;
    let plan = validate_seq_scan(g.shape(), cu_seqlens, Some(params.chunk_size))?;
    let bt = check_chunk_size(params.chunk_size, None)?;
    let y = kda_gate(g, a_log, dt_bias, params.lower_bound)?;
    Ok(scan_segments(
        y.view(),
        &segments(&plan, Some(bt)),
        params.reverse,
        params.scale,
    ))
}
