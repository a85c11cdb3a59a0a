//! Inputs of the whole delta-rule forwards (`kda_fwd`, `gdn_fwd`) for the GPU tests, in the gate
//! regimes a model meets: strong decay (`logsigmoid(randn)`), trained-like (Mamba's `dt`
//! initialisation through the KDA gate), long memory (`a ∈ [−1e-3, 0]`), the spec's `/10` and
//! masked variants, and hard forget (5% of tokens at −1000).

use super::{upload, Rng};
use attn_gpu::{DeviceTensor, ForwardTensors, Gpu};
use attn_reference::delta::{self as d, GdnFwdParams, KdaFwdParams};
use attn_reference::Dtype;
use ndarray::{Array1, Array3, Array4, ArrayD, Axis, Ix1, Ix3, Ix4};

/// The half-precision threshold of `kda_fwd` / `gdn_fwd`'s `o` and final state
/// (`conformance/spec/ops-delta-rule.md` §6.8): 1e-2 when long (a sequence of 8192 tokens or
/// more, or of 1024 or more under long-memory gates), else 5e-3.
pub fn half_threshold(regime: Regime, longest: usize) -> f64 {
    if longest >= 8192 || (regime == Regime::Long && longest >= 1024) {
        1e-2
    } else {
        5e-3
    }
}

/// How the per-step gates are drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Regime {
    /// `logsigmoid(randn)`: mean about −0.8 per token.
    Strong,
    /// `logsigmoid(randn) / 10`, half of the entries 0 (no decay).
    Mild,
    /// `−exp(A_log) · softplus(x + dt_bias)`, Mamba's `dt` in `[1e-3, 1e-1]`, `A_log = ln U[1,
    /// 16]`.
    Trained,
    /// `a ∈ [−1e-3, 0]`: the state remembers thousands of tokens.
    Long,
    /// Strong decay with 5% of the tokens at −1000.
    Hard,
    /// `a ∈ [−5, 0]` (the promise of `safe_gate`).
    Safe,
}

pub const REGIMES: [Regime; 6] = [
    Regime::Strong,
    Regime::Mild,
    Regime::Trained,
    Regime::Long,
    Regime::Hard,
    Regime::Safe,
];

fn logsigmoid(x: f64) -> f64 {
    -((-x).exp().ln_1p())
}

fn softplus(x: f64) -> f64 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// Per-step natural-log gates of `shape` (`[.., HV]` or `[.., HV, K]`, the head axis at 2).
pub fn step_gates(rng: &mut Rng, shape: &[usize], regime: Regime) -> ArrayD<f64> {
    let hv = shape[2];
    let a_log: Vec<f64> = (0..hv).map(|_| rng.uniform(1.0, 16.0).ln()).collect();
    let mut out = ArrayD::zeros(shape.to_vec());
    for (idx, x) in out.indexed_iter_mut() {
        let head = idx[2];
        *x = match regime {
            Regime::Strong => logsigmoid(rng.normal()),
            Regime::Mild => {
                if rng.below(2) == 0 {
                    0.0
                } else {
                    logsigmoid(rng.normal()) / 10.0
                }
            }
            Regime::Trained => {
                let dt = (rng.uniform(1e-3f64.ln(), 1e-1f64.ln())).exp();
                let bias = dt + (-(-dt).exp_m1()).ln();
                -a_log[head].exp() * softplus(rng.normal() * 0.5 + bias)
            }
            Regime::Long => rng.uniform(-1e-3, 0.0),
            Regime::Hard => {
                if rng.below(20) == 0 {
                    -1000.0
                } else {
                    logsigmoid(rng.normal())
                }
            }
            Regime::Safe => rng.uniform(-5.0, 0.0),
        };
    }
    out
}

/// `x / ‖x‖` along the last axis.
pub fn normalised(rng: &mut Rng, shape: [usize; 4]) -> Array4<f64> {
    let mut x: Array4<f64> = rng.randn(shape);
    for mut row in x.lanes_mut(Axis(3)) {
        let n = row.iter().map(|v| v * v).sum::<f64>().sqrt().max(1e-12);
        row /= n;
    }
    x
}

/// The host tensors of one forward case (float64; each already rounded to the dtype it is
/// uploaded in, so the reference sees exactly what the device holds).
#[derive(Clone, Debug)]
pub struct ForwardHost {
    pub q: Array4<f64>,
    pub k: Array4<f64>,
    pub v: Array4<f64>,
    /// KDA `[B, T, HV, K]`, GDN `[B, T, HV]`.
    pub g: ArrayD<f64>,
    pub beta: Array3<f64>,
    pub h0: Option<Array4<f64>>,
    pub a_log: Option<Array1<f64>>,
    pub dt_bias: Option<Array1<f64>>,
}

/// The device copies of a [`ForwardHost`].
pub struct ForwardDev {
    pub q: DeviceTensor,
    pub k: DeviceTensor,
    pub v: DeviceTensor,
    pub g: DeviceTensor,
    pub beta: DeviceTensor,
    pub h0: Option<DeviceTensor>,
    pub a_log: Option<DeviceTensor>,
    pub dt_bias: Option<DeviceTensor>,
}

impl ForwardDev {
    pub fn tensors(&self) -> ForwardTensors<'_> {
        ForwardTensors {
            initial_state: self.h0.as_ref(),
            a_log: self.a_log.as_ref(),
            dt_bias: self.dt_bias.as_ref(),
            ..ForwardTensors::new(&self.q, &self.k, &self.v, &self.g, &self.beta)
        }
    }
}

/// What a forward case draws.
#[derive(Clone, Copy, Debug)]
pub struct Draw {
    pub b: usize,
    pub t: usize,
    pub h: usize,
    pub hv: usize,
    pub k: usize,
    pub v: usize,
    /// KDA's per-key gate (else GDN's scalar one).
    pub per_key: bool,
    pub regime: Regime,
    /// Keys and queries raw (normalised in the kernel) instead of unit length.
    pub raw_qk: bool,
    /// `beta` as logits (sigmoid in the kernel) instead of `β ∈ (0, 1)`.
    pub beta_logits: bool,
    /// `g` as the raw input of the KDA gate, with `A_log` and `dt_bias` (Mamba's init).
    pub gate_input: bool,
    pub h0: bool,
    pub v_first: bool,
}

/// Draws a case, rounds main data to `dtype` and side tensors to `side` (gates, β, A_log,
/// dt_bias, the initial state), uploads everything and returns both copies.
pub fn draw(
    gpu: &Gpu,
    rng: &mut Rng,
    d: &Draw,
    dtype: Dtype,
    side: Dtype,
) -> (ForwardHost, ForwardDev) {
    let (b, t, h, hv, kd, vd) = (d.b, d.t, d.h, d.hv, d.k, d.v);
    let qk = |rng: &mut Rng| -> Array4<f64> {
        if d.raw_qk {
            rng.randn([b, t, h, kd])
        } else {
            normalised(rng, [b, t, h, kd])
        }
    };
    let q = qk(rng);
    let k = qk(rng);
    let v: Array4<f64> = rng.randn([b, t, hv, vd]);
    let beta: Array3<f64> = if d.beta_logits {
        rng.randn([b, t, hv])
    } else {
        rng.array(&[b, t, hv], 0.0, 1.0)
            .into_dimensionality::<Ix3>()
            .unwrap()
    };
    let gshape: Vec<usize> = if d.per_key {
        vec![b, t, hv, kd]
    } else {
        vec![b, t, hv]
    };
    let (g, a_log, dt_bias) = if d.gate_input {
        // the KDA gate's input: x ~ N(0, 0.5²) with Mamba's dt_bias and A_log = ln U[1, 16]
        let x = rng.randn(ndarray::IxDyn(&gshape)).mapv(|v| 0.5 * v);
        let dtb: Array1<f64> = (0..hv * kd)
            .map(|_| {
                let dt = rng.uniform(1e-3f64.ln(), 1e-1f64.ln()).exp();
                dt + (-(-dt).exp_m1()).ln()
            })
            .collect();
        let al: Array1<f64> = (0..hv).map(|_| rng.uniform(1.0, 16.0).ln()).collect();
        (x, Some(al), Some(dtb))
    } else {
        (step_gates(rng, &gshape, d.regime), None, None)
    };
    let h0 = d.h0.then(|| {
        let n = b; // callers with cu_seqlens pass b = 1 and set N through `state_rows`
        let shape = if d.v_first {
            [n, hv, vd, kd]
        } else {
            [n, hv, kd, vd]
        };
        rng.randn(shape).mapv(|x| 0.1 * x)
    });
    let up = |a: ArrayD<f64>, dt: Dtype| upload(gpu, &a, dt);
    let (qd, q) = up(q.into_dyn(), dtype);
    let (kd_, k) = up(k.into_dyn(), dtype);
    let (vd_, v) = up(v.into_dyn(), dtype);
    let (gd, g) = up(g, side);
    let (bd, beta) = up(beta.into_dyn(), side);
    let h0 = h0.map(|a| up(a.into_dyn(), side));
    let a_log = a_log.map(|a| up(a.into_dyn(), side));
    let dt_bias = dt_bias.map(|a| up(a.into_dyn(), side));
    let four = |a: ArrayD<f64>| a.into_dimensionality::<Ix4>().unwrap();
    let one = |a: ArrayD<f64>| a.into_dimensionality::<Ix1>().unwrap();
    let host = ForwardHost {
        q: four(q),
        k: four(k),
        v: four(v),
        g,
        beta: beta.into_dimensionality::<Ix3>().unwrap(),
        h0: h0.as_ref().map(|(_, a)| four(a.clone())),
        a_log: a_log.as_ref().map(|(_, a)| one(a.clone())),
        dt_bias: dt_bias.as_ref().map(|(_, a)| one(a.clone())),
    };
    let dev = ForwardDev {
        q: qd,
        k: kd_,
        v: vd_,
        g: gd,
        beta: bd,
        h0: h0.map(|(t, _)| t),
        a_log: a_log.map(|(t, _)| t),
        dt_bias: dt_bias.map(|(t, _)| t),
    };
    (host, dev)
}

/// Replaces the initial state of a varlen case (`B = 1`) by one of `n` sequences.
pub fn set_state_rows(
    gpu: &Gpu,
    rng: &mut Rng,
    host: &mut ForwardHost,
    dev: &mut ForwardDev,
    n: usize,
    v_first: bool,
    side: Dtype,
) {
    if host.h0.is_none() {
        return;
    }
    let (hv, kd, vd) = (host.v.shape()[2], host.k.shape()[3], host.v.shape()[3]);
    let shape = if v_first {
        [n, hv, vd, kd]
    } else {
        [n, hv, kd, vd]
    };
    let a: Array4<f64> = rng.randn(shape).mapv(|x| 0.1 * x);
    let (t, a) = upload(gpu, &a.into_dyn(), side);
    host.h0 = Some(a.into_dimensionality::<Ix4>().unwrap());
    dev.h0 = Some(t);
}

/// Which forward a [`forward_reference`] computes.
#[derive(Clone, Copy, Debug)]
pub enum RefOp<'a> {
    Kda(&'a KdaFwdParams),
    Gdn(&'a GdnFwdParams),
}

/// The float64 reference (the recurrent definition) of `kda_fwd` or `gdn_fwd` on `h` (its
/// rounded inputs): `(o, final_state)`.
pub fn forward_reference(
    h: &ForwardHost,
    cu: Option<&[i64]>,
    op: RefOp<'_>,
) -> (ArrayD<f64>, Option<ArrayD<f64>>) {
    let out = match op {
        RefOp::Kda(p) => {
            let g = h.g.clone().into_dimensionality::<Ix4>().unwrap();
            let inp = d::KdaFwdInputs {
                initial_state: h.h0.as_ref().map(|a| a.view()),
                a_log: h.a_log.as_ref().map(|a| a.view()),
                dt_bias: h.dt_bias.as_ref().map(|a| a.view()),
                cu_seqlens: cu,
                ..d::KdaFwdInputs::new(h.q.view(), h.k.view(), h.v.view(), g.view(), h.beta.view())
            };
            d::kda_fwd(&inp, p).unwrap()
        }
        RefOp::Gdn(p) => {
            let g = h.g.clone().into_dimensionality::<Ix3>().unwrap();
            let inp = d::GdnFwdInputs {
                initial_state: h.h0.as_ref().map(|a| a.view()),
                cu_seqlens: cu,
                ..d::GdnFwdInputs::new(h.q.view(), h.k.view(), h.v.view(), g.view(), h.beta.view())
            };
            d::gdn_fwd(&inp, p).unwrap()
        }
    };
    (out.o.into_dyn(), out.final_state.map(|a| a.into_dyn()))
}
