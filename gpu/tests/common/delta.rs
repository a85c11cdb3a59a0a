//! Delta-rule inputs for the GPU tests. Realistic ones follow
//! `conformance/spec/ops-delta-rule.md` §10.2: normalised keys, log-sigmoid gates (optionally a
//! fraction without decay, or 5% hard-forget tokens at −1000), `w, u` (and KDA's `kg`) from the
//! reference's `kda_intra` run on exactly the chunks of the tested layout, so the recurrence stays
//! bounded. Small random ones scale `k, w` down instead.

use super::forward::Regime;
use super::{upload, Rng};
use attn_gpu::{DeviceTensor, Gpu};
use attn_reference::delta::{self as d, FwdHInputs, KdaIntraInputs, KdaIntraParams};
use attn_reference::Dtype;
use ndarray::{s, Array3, Array4, ArrayD, Axis, Ix3, Ix4};

/// Which gates a case passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gates {
    None,
    G,
    Gk,
    Both,
}
pub const GATES: [Gates; 4] = [Gates::None, Gates::G, Gates::Gk, Gates::Both];

/// The extents and sequences of a case.
#[derive(Clone, Debug)]
pub struct Layout {
    pub b: usize,
    pub t: usize,
    pub h: usize,
    pub hv: usize,
    pub k: usize,
    pub v: usize,
    pub bt: usize,
    pub cu: Option<Vec<i64>>,
}

impl Layout {
    /// `[bos, eos)` of every sequence, in rows of the packed `B * T` axis.
    pub fn seqs(&self) -> Vec<(usize, usize)> {
        match &self.cu {
            Some(cu) => cu
                .windows(2)
                .map(|w| (w[0] as usize, w[1] as usize))
                .collect(),
            None => (0..self.b)
                .map(|b| (b * self.t, b * self.t + self.t))
                .collect(),
        }
    }
    pub fn n(&self) -> usize {
        self.seqs().len()
    }
    /// Boundaries of every chunk (a `cu_seqlens` over the packed rows with one piece per chunk).
    fn chunk_bounds(&self) -> Vec<i64> {
        let mut cu = vec![0i64];
        for (bos, eos) in self.seqs() {
            let mut a = bos;
            while a < eos {
                a = (a + self.bt).min(eos);
                cu.push(a as i64);
            }
        }
        cu
    }
}

/// A case's inputs as float64 host arrays (`[B, T, ..]`).
#[derive(Clone, Debug)]
pub struct Inputs {
    pub k: Array4<f64>,
    pub w: Array4<f64>,
    pub u: Array4<f64>,
    pub g: Option<Array3<f64>>,
    pub gk: Option<Array4<f64>>,
}

/// Per-step natural-log gates `logsigmoid(randn) / n` (`n` 1 or 10), half of them zero when
/// `sparse`; with `hard`, 5% of the tokens (every lane) at −1000.
fn step_gates(rng: &mut Rng, shape: &[usize], sparse: bool, hard: bool) -> ArrayD<f64> {
    let n = if rng.below(2) == 0 { 1.0 } else { 10.0 };
    let mut a = ArrayD::from_shape_simple_fn(shape, || {
        let x = rng.normal();
        -(1.0 + (-x).exp()).ln() / n
    });
    if sparse {
        a.mapv_inplace(|v| if rng.below(2) == 0 { 0.0 } else { v });
    }
    if hard {
        let tokens = shape[0] * shape[1];
        let lanes: usize = shape[2..].iter().product();
        let flat = a.as_slice_mut().unwrap();
        for tok in 0..tokens {
            if rng.below(20) == 0 {
                flat[tok * lanes..(tok + 1) * lanes].fill(-1000.0);
            }
        }
    }
    a
}

/// Chunk-local cumulative sums over the chunk pieces `bounds` of the packed rows, times
/// `1 / ln 2` (log2 units), of `[B, T, ...]` gates.
fn chunk_cumsum(a: &ArrayD<f64>, bounds: &[i64]) -> ArrayD<f64> {
    let shape = a.shape().to_vec();
    let rows = shape[0] * shape[1];
    let lanes: usize = shape[2..].iter().product();
    let src = a
        .as_standard_layout()
        .into_owned()
        .into_raw_vec_and_offset()
        .0;
    let mut out = vec![0.0; src.len()];
    for w in bounds.windows(2) {
        let mut acc = vec![0.0; lanes];
        for r in w[0] as usize..w[1] as usize {
            for l in 0..lanes {
                acc[l] += src[r * lanes + l];
                out[r * lanes + l] = acc[l] * std::f64::consts::LOG2_E;
            }
        }
    }
    let _ = rows;
    ArrayD::from_shape_vec(shape, out).unwrap()
}

fn normalised(rng: &mut Rng, shape: [usize; 4]) -> Array4<f64> {
    let mut x: Array4<f64> = rng.randn(shape);
    for mut row in x.lanes_mut(Axis(3)) {
        let n = (row.iter().map(|v| v * v).sum::<f64>() + 1e-6).sqrt();
        row.mapv_inplace(|v| v / n);
    }
    x
}

/// Realistic inputs (`conformance/spec/ops-delta-rule.md` §10.2) for `lay` with `gates`; KDA's `k =
/// kg` needs `H = HV` (with GVA the raw keys are used with `gk`).
pub fn realistic(rng: &mut Rng, lay: &Layout, gates: Gates, hard: bool) -> Inputs {
    realistic_with(rng, lay, gates, Draw::Spec { hard }).0
}

/// How [`realistic_with`] draws the per-step gates.
#[derive(Clone, Copy, Debug)]
pub enum Draw {
    /// §10.2's `logsigmoid(randn) / n`, optionally sparse or with hard-forget tokens.
    Spec { hard: bool },
    /// A regime of the whole-forward tests (strong, trained-like, long memory, ...).
    Regime(Regime),
    /// Even value heads in the first regime, odd ones in the second (fast- and slow-forgetting
    /// heads in one batch).
    Mixed(Regime, Regime),
}

/// What the truncation bound of §5.10 reads for a case of [`realistic_with`]: the per-step
/// natural-log gates (`[B, T, HV, K]` for `Gk`, `[B, T, HV]` for `G`), `β` `[B, T, HV]` and the
/// normalised keys `[B, T, H, K]` of the delta rule behind `w`, `u`.
#[derive(Clone, Debug)]
pub struct BoundHost {
    pub a: ArrayD<f64>,
    pub beta: Array3<f64>,
    pub k: Array4<f64>,
}

/// [`realistic`] with the gates drawn by `draw`, and the bound's inputs (`gates` `G` or `Gk`
/// give a faithful bound; `Both` adds a second gate that `a` leaves out).
pub fn realistic_with(
    rng: &mut Rng,
    lay: &Layout,
    gates: Gates,
    draw: Draw,
) -> (Inputs, BoundHost) {
    let (b, t, h, hv, kd, vd) = (lay.b, lay.t, lay.h, lay.hv, lay.k, lay.v);
    let bounds = lay.chunk_bounds();
    let sparse = rng.below(2) == 0;
    let key_gate = matches!(gates, Gates::Gk | Gates::Both);
    let step = |rng: &mut Rng, shape: &[usize]| match draw {
        Draw::Spec { hard } => step_gates(rng, shape, sparse, hard),
        Draw::Regime(r) => super::forward::step_gates(rng, shape, r),
        Draw::Mixed(even, odd) => {
            let (x, y) = (
                super::forward::step_gates(rng, shape, even),
                super::forward::step_gates(rng, shape, odd),
            );
            let mut out = x;
            for (idx, v) in out.indexed_iter_mut() {
                if idx[2] % 2 == 1 {
                    *v = y[&idx];
                }
            }
            out
        }
    };
    let a = if key_gate {
        step(rng, &[b, t, hv, kd])
    } else {
        step(rng, &[b, t, hv])
    };
    let big = if key_gate {
        chunk_cumsum(&a, &bounds)
    } else if gates == Gates::G {
        let g = chunk_cumsum(&a, &bounds);
        let g3 = g.into_dimensionality::<Ix3>().unwrap();
        g3.insert_axis(Axis(3))
            .broadcast((b, t, hv, kd))
            .unwrap()
            .to_owned()
            .into_dyn()
    } else {
        ArrayD::zeros(vec![b, t, hv, kd])
    };
    let big = big.into_dimensionality::<Ix4>().unwrap();
    let q = normalised(rng, [b, t, h, kd]);
    let k = normalised(rng, [b, t, h, kd]);
    let v: Array4<f64> = rng.randn([b, t, hv, vd]);
    let beta: Array3<f64> = rng.randn([b, t, hv]).mapv(|x| 1.0 / (1.0 + (-x).exp()));
    let (w, u, kg) = if b * t == 0 {
        (
            Array4::zeros((b, t, hv, kd)),
            Array4::zeros((b, t, hv, vd)),
            Array4::zeros((b, t, hv, kd)),
        )
    } else {
        let flat = |a: &Array4<f64>| {
            let s = a.shape();
            a.to_shape((1, s[0] * s[1], s[2], s[3])).unwrap().to_owned()
        };
        let (qf, kf, vf, gf) = (flat(&q), flat(&k), flat(&v), flat(&big));
        let bf = beta.to_shape((1, b * t, hv)).unwrap().to_owned();
        let inp = KdaIntraInputs {
            q: qf.view(),
            k: kf.view(),
            v: vf.view(),
            gk: gf.view(),
            beta: bf.view(),
            cu_seqlens: Some(&bounds),
        };
        let o = d::kda_intra(&inp, &KdaIntraParams::default()).unwrap();
        let back = |a: Array4<f64>, last: usize| a.to_shape((b, t, hv, last)).unwrap().to_owned();
        (back(o.w, kd), back(o.u, vd), back(o.kg, kd))
    };
    let k_raw = k.clone();
    let (k_in, g, gk) = match gates {
        Gates::None => (k, None, None),
        Gates::G => (k, Some(big.slice(s![.., .., .., 0]).to_owned()), None),
        Gates::Gk | Gates::Both => {
            let keys = if h == hv { kg } else { k };
            let g2 = (gates == Gates::Both).then(|| {
                chunk_cumsum(&step_gates(rng, &[b, t, hv], false, false), &bounds)
                    .mapv(|x| x / 10.0)
                    .into_dimensionality::<Ix3>()
                    .unwrap()
            });
            (keys, g2, Some(big))
        }
    };
    let host = BoundHost { a, beta, k: k_raw };
    (
        Inputs {
            k: k_in,
            w,
            u,
            g,
            gk,
        },
        host,
    )
}

/// Small random inputs: `k, w` uniform and scaled by `(0.3 / (BT K))^(1/2)`, `u` uniform,
/// gates from uniform per-step decays in `[−0.5, 0]`.
pub fn small_random(rng: &mut Rng, lay: &Layout, gates: Gates) -> Inputs {
    let (b, t, h, hv, kd, vd) = (lay.b, lay.t, lay.h, lay.hv, lay.k, lay.v);
    let bounds = lay.chunk_bounds();
    let sc = (0.3 / (lay.bt * kd) as f64).sqrt();
    let k = rng.array(&[b, t, h, kd], -sc, sc);
    let w = rng.array(&[b, t, hv, kd], -sc, sc);
    let u = rng.array(&[b, t, hv, vd], -1.0, 1.0);
    let four = |a: ArrayD<f64>| a.into_dimensionality::<Ix4>().unwrap();
    let g = matches!(gates, Gates::G | Gates::Both).then(|| {
        chunk_cumsum(&rng.array(&[b, t, hv], -0.5, 0.0), &bounds)
            .into_dimensionality::<Ix3>()
            .unwrap()
    });
    let gk = matches!(gates, Gates::Gk | Gates::Both).then(|| {
        four(chunk_cumsum(
            &rng.array(&[b, t, hv, kd], -0.5, 0.0),
            &bounds,
        ))
    });
    Inputs {
        k: four(k),
        w: four(w),
        u: four(u),
        g,
        gk,
    }
}

/// A random state tensor `[N, HV, K, V]` (`[N, HV, V, K]` with `v_first`).
pub fn random_state(rng: &mut Rng, lay: &Layout, v_first: bool) -> Array4<f64> {
    if v_first {
        rng.randn([lay.n(), lay.hv, lay.v, lay.k])
    } else {
        rng.randn([lay.n(), lay.hv, lay.k, lay.v])
    }
}

/// Device copies of a case (main data in `dtype`, gates in `gate_dtype`, the state in
/// `state_dtype`) and the exact values they hold.
pub struct Uploaded {
    pub k: DeviceTensor,
    pub w: DeviceTensor,
    pub u: DeviceTensor,
    pub g: Option<DeviceTensor>,
    pub gk: Option<DeviceTensor>,
    pub h0: Option<DeviceTensor>,
    pub exact: Inputs,
    pub exact_h0: Option<Array4<f64>>,
}

impl Uploaded {
    pub fn new(
        gpu: &Gpu,
        inp: &Inputs,
        h0: Option<&Array4<f64>>,
        dtype: Dtype,
        gate_dtype: Dtype,
        state_dtype: Dtype,
    ) -> Uploaded {
        let up = |a: ArrayD<f64>, dt| upload(gpu, &a, dt);
        let (k, ke) = up(inp.k.clone().into_dyn(), dtype);
        let (w, we) = up(inp.w.clone().into_dyn(), dtype);
        let (u, ue) = up(inp.u.clone().into_dyn(), dtype);
        let g = inp.g.clone().map(|a| up(a.into_dyn(), gate_dtype));
        let gk = inp.gk.clone().map(|a| up(a.into_dyn(), gate_dtype));
        let h = h0.cloned().map(|a| up(a.into_dyn(), state_dtype));
        let four = |a: ArrayD<f64>| a.into_dimensionality::<Ix4>().unwrap();
        Uploaded {
            exact: Inputs {
                k: four(ke),
                w: four(we),
                u: four(ue),
                g: g.as_ref()
                    .map(|(_, e)| e.clone().into_dimensionality::<Ix3>().unwrap()),
                gk: gk.as_ref().map(|(_, e)| four(e.clone())),
            },
            exact_h0: h.as_ref().map(|(_, e)| four(e.clone())),
            k,
            w,
            u,
            g: g.map(|(t, _)| t),
            gk: gk.map(|(t, _)| t),
            h0: h.map(|(t, _)| t),
        }
    }

    pub fn tensors(&self) -> attn_gpu::FwdHTensors<'_> {
        attn_gpu::FwdHTensors {
            k: &self.k,
            w: &self.w,
            u: &self.u,
            g: self.g.as_ref(),
            gk: self.gk.as_ref(),
            initial_state: self.h0.as_ref(),
        }
    }

    /// The reference's inputs on the exact device values.
    pub fn reference<'a>(&'a self, cu: Option<&'a [i64]>) -> FwdHInputs<'a, f64> {
        FwdHInputs {
            k: self.exact.k.view(),
            w: self.exact.w.view(),
            u: self.exact.u.view(),
            g: self.exact.g.as_ref().map(|a| a.view()),
            gk: self.exact.gk.as_ref().map(|a| a.view()),
            initial_state: self.exact_h0.as_ref().map(|a| a.view()),
            cu_seqlens: cu,
        }
    }
}
