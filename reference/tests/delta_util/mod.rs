//! Helpers of the delta-rule tests: a seeded generator of realistic inputs
//! (`conformance/spec/ops-delta-rule.md` §10.2), an independent per-token oracle of the recurrence
//! with its trace, and the comparison rule.
#![allow(dead_code)]

use ndarray::{s, Array1, Array2, Array3, Array4, ArrayD, ArrayView4, Axis, Dimension};

#[path = "../common/mod.rs"]
mod common;

/// The tests' seeded generator (uniforms, normals, `randn` tensors).
pub use common::Rng;

/// `x / sqrt(Σ x² + 1e-6)` along the last axis.
pub fn l2norm(mut x: Array4<f64>) -> Array4<f64> {
    for mut row in x.lanes_mut(Axis(3)) {
        let n = (row.iter().map(|v| v * v).sum::<f64>() + 1e-6).sqrt();
        row /= n;
    }
    x
}

pub fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// `logsigmoid(randn) / n`, then a fraction `p_zero` of entries set to 0
/// (`conformance/spec/ops-delta-rule.md` §10.2).
pub fn gates<D: Dimension, Sh: ndarray::ShapeBuilder<Dim = D>>(
    rng: &mut Rng,
    shape: Sh,
    n: f64,
    p_zero: f64,
) -> ndarray::Array<f64, D> {
    ndarray::Array::from_shape_simple_fn(shape, || {
        let x = rng.normal();
        let ls = -((-x).exp().ln_1p());
        if rng.uniform(0.0, 1.0) < p_zero {
            0.0
        } else {
            ls / n
        }
    })
}

/// `sigmoid(randn)`.
pub fn betas(rng: &mut Rng, shape: (usize, usize, usize)) -> Array3<f64> {
    Array3::from_shape_simple_fn(shape, || sigmoid(rng.normal()))
}

/// A random `cu_seqlens` of `n` sequences with lengths in `0 ..= max_len` (some empty, some one
/// token when `n` allows).
pub fn layout(rng: &mut Rng, n: usize, max_len: usize) -> Vec<i64> {
    let mut cu = vec![0i64];
    for _ in 0..n {
        let len = match rng.below(6) {
            0 => 0,
            1 => 1,
            _ => rng.below(max_len + 1),
        };
        cu.push(cu.last().copied().unwrap_or(0) + len as i64);
    }
    cu
}

/// The sequences `(batch, bos, eos)` of a layout (`cu` or `B` rows of `T`).
pub fn seqs(b: usize, t: usize, cu: Option<&[i64]>) -> Vec<(usize, usize, usize)> {
    match cu {
        Some(cu) => cu
            .windows(2)
            .map(|w| (0, w[0] as usize, w[1] as usize))
            .collect(),
        None => (0..b).map(|n| (n, 0, t)).collect(),
    }
}

/// Chunk-local cumulative sum of per-step gates along axis 1, times `1/ln 2` (log2 units),
/// chunks restarting at every sequence start. Works on `[B, T, HV]` and `[B, T, HV, K]`.
pub fn chunk_cumsum_log2(a: &ArrayD<f64>, bt: usize, cu: Option<&[i64]>) -> ArrayD<f64> {
    let (b, t) = (a.shape()[0], a.shape()[1]);
    let mut out = a.clone();
    for (bi, bos, eos) in seqs(b, t, cu) {
        let mut row = out.index_axis_mut(Axis(0), bi);
        for c in (bos..eos).step_by(bt) {
            let e = (c + bt).min(eos);
            for t in c + 1..e {
                let prev = row.index_axis(Axis(0), t - 1).to_owned();
                let mut cur = row.index_axis_mut(Axis(0), t);
                cur += &prev;
            }
        }
    }
    out * std::f64::consts::LOG2_E
}

/// The recurrence of `conformance/spec/ops-delta-rule.md` §6.4 for one (sequence, head), written
/// per element as the oracle: returns `o` rows, the deltas `δ_t`, and the state after every token
/// (`states[t+1]`, with `states[0]` the initial state).
pub struct Trace {
    pub o: Array2<f64>,
    pub delta: Array2<f64>,
    pub states: Vec<Array2<f64>>,
}

pub fn trace(
    q: &Array2<f64>,
    k: &Array2<f64>,
    v: &Array2<f64>,
    a: &Array2<f64>,
    beta: &Array1<f64>,
    s0: &Array2<f64>,
    scale: f64,
) -> Trace {
    let (len, kd, vd) = (k.nrows(), k.ncols(), v.ncols());
    let mut st = s0.clone();
    let mut states = vec![st.clone()];
    let mut o = Array2::zeros((len, vd));
    let mut delta = Array2::zeros((len, vd));
    for t in 0..len {
        for i in 0..kd {
            let al = a[[t, i]].exp();
            for j in 0..vd {
                st[[i, j]] *= al;
            }
        }
        for j in 0..vd {
            let sk: f64 = (0..kd).map(|i| st[[i, j]] * k[[t, i]]).sum();
            delta[[t, j]] = beta[t] * (v[[t, j]] - sk);
        }
        for i in 0..kd {
            for j in 0..vd {
                st[[i, j]] += k[[t, i]] * delta[[t, j]];
            }
        }
        for j in 0..vd {
            o[[t, j]] = scale * (0..kd).map(|i| st[[i, j]] * q[[t, i]]).sum::<f64>();
        }
        states.push(st.clone());
    }
    Trace { o, delta, states }
}

/// `RMS(x − r) / (RMS(r) + 1e-8)` (spec comparison ratio); shapes must agree.
pub fn ratio<D: Dimension>(x: &ndarray::Array<f64, D>, r: &ndarray::Array<f64, D>) -> f64 {
    assert_eq!(x.shape(), r.shape(), "shape mismatch");
    common::ratio(r, x)
}

/// Fails unless every element is finite and `ratio(x, r) <= tol`.
pub fn assert_close<D: Dimension>(
    x: &ndarray::Array<f64, D>,
    r: &ndarray::Array<f64, D>,
    tol: f64,
    what: &str,
) {
    assert!(x.iter().all(|v| v.is_finite()), "{what}: non-finite values");
    let q = ratio(x, r);
    assert!(q <= tol, "{what}: ratio {q:e} > {tol:e}");
}

/// `[N, HV, K, V]` → `[N, HV, V, K]`.
pub fn transpose_state(x: ArrayView4<'_, f64>) -> Array4<f64> {
    x.permuted_axes([0, 1, 3, 2])
        .as_standard_layout()
        .into_owned()
}

/// A rank-2 slice of a `[B, T, H, D]` tensor as an owned matrix (rows `bos..eos`, head `h`).
pub fn rows(x: &Array4<f64>, b: usize, bos: usize, eos: usize, h: usize) -> Array2<f64> {
    x.slice(s![b, bos..eos, h, ..]).to_owned()
}

/// A random realistic delta-rule case (`conformance/spec/ops-delta-rule.md` §10.2): shapes, layout
/// and tensors.
pub struct Case {
    pub seed: u64,
    /// 5% of tokens carry gates of −1000 (`conformance/spec/ops-delta-rule.md` §10.2 hard forget).
    pub hard_forget: bool,
    pub b: usize,
    pub t: usize,
    pub h: usize,
    pub hv: usize,
    pub kd: usize,
    pub vd: usize,
    pub cu: Option<Vec<i64>>,
    pub q: Array4<f64>,
    pub k: Array4<f64>,
    pub v: Array4<f64>,
    /// Per-key natural-log gates `[B, T, HV, K]`.
    pub g: Array4<f64>,
    /// Scalar natural-log gates `[B, T, HV]`.
    pub gs: Array3<f64>,
    pub beta: Array3<f64>,
    /// `[N, HV, K, V]`.
    pub h0: Array4<f64>,
}

impl Case {
    /// `varlen`: `n_seq` packed sequences of up to `max_len` tokens; else `B` rows of `max_len`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        seed: u64,
        varlen: bool,
        n_seq: usize,
        max_len: usize,
        h: usize,
        group: usize,
        kd: usize,
        vd: usize,
    ) -> Case {
        let mut rng = Rng::new(seed ^ 0x5EED);
        let cu = varlen.then(|| layout(&mut rng, n_seq, max_len));
        Case::build(seed, cu, n_seq, max_len, h, group, kd, vd)
    }

    /// A case with the given `cu_seqlens` (`B = 1`), or `b` rows of `t` tokens when `None`.
    #[allow(clippy::too_many_arguments)]
    pub fn build(
        seed: u64,
        cu: Option<Vec<i64>>,
        b: usize,
        t: usize,
        h: usize,
        group: usize,
        kd: usize,
        vd: usize,
    ) -> Case {
        let mut rng = Rng::new(seed);
        let hv = h * group;
        let (n, b, t) = match &cu {
            Some(cu) => (cu.len() - 1, 1, *cu.last().unwrap() as usize),
            None => (b, b, t),
        };
        let gate_n = if rng.below(2) == 0 { 1.0 } else { 10.0 };
        let p_zero = if rng.below(2) == 0 { 0.0 } else { 0.5 };
        let hard_forget = rng.below(4) == 0;
        let mut g = gates(&mut rng, (b, t, hv, kd), gate_n, p_zero);
        let mut gs = gates(&mut rng, (b, t, hv), gate_n, p_zero);
        if hard_forget {
            // 5% of tokens forget everything (`conformance/spec/ops-delta-rule.md` §10.2): catches
            // unmasked 0 · inf
            for bi in 0..b {
                for ti in 0..t {
                    if rng.uniform(0.0, 1.0) < 0.05 {
                        g.slice_mut(s![bi, ti, .., ..]).fill(-1000.0);
                        gs.slice_mut(s![bi, ti, ..]).fill(-1000.0);
                    }
                }
            }
        }
        Case {
            seed,
            hard_forget,
            b,
            t,
            h,
            hv,
            kd,
            vd,
            q: l2norm(rng.randn((b, t, h, kd))),
            k: l2norm(rng.randn((b, t, h, kd))),
            v: rng.randn((b, t, hv, vd)),
            g,
            gs,
            beta: betas(&mut rng, (b, t, hv)),
            h0: rng.randn((n, hv, kd, vd)),
            cu,
        }
    }
    pub fn cu(&self) -> Option<&[i64]> {
        self.cu.as_deref()
    }
    pub fn seqs(&self) -> Vec<(usize, usize, usize)> {
        seqs(self.b, self.t, self.cu())
    }
    /// Key head of value head `hv`.
    pub fn kh(&self, hv: usize) -> usize {
        hv / (self.hv / self.h)
    }
    /// The per-key gate as `[B, T, HV, K]` with the scalar gate broadcast along `K`.
    pub fn gs_broadcast(&self) -> Array4<f64> {
        let gs = self.gs.view().insert_axis(Axis(3));
        gs.broadcast((self.b, self.t, self.hv, self.kd))
            .unwrap()
            .to_owned()
    }
}

/// A random [`Case`]: varlen or batched, `1..4` sequences of `1 ..= max_len` tokens, heads
/// `(H, HV)` with `H, HV / H` in `1 ..= 2`, `K, V` in `1 ..= max_dim`.
pub fn cases(max_len: usize, max_dim: usize) -> impl proptest::strategy::Strategy<Value = Case> {
    use proptest::prelude::*;
    (
        any::<u64>(),
        any::<bool>(),
        1usize..4,
        1usize..=max_len,
        1usize..=2,
        1usize..=2,
        1usize..=max_dim,
        1usize..=max_dim,
    )
        .prop_map(|(seed, varlen, n, len, h, group, kd, vd)| {
            Case::new(seed, varlen, n, len, h, group, kd, vd)
        })
}

impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Case {{ seed: {}, hard_forget: {}, B: {}, T: {}, H: {}, HV: {}, K: {}, V: {}, cu: {:?} }}",
            self.seed, self.hard_forget, self.b, self.t, self.h, self.hv, self.kd, self.vd, self.cu
        )
    }
}

/// Which gates a `chunk_gated_delta_rule_fwd_h` case carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateMode {
    /// KDA: `k = kg` (per value head), `gk`.
    Kda,
    /// GDN: raw `k` (key heads, GVA), scalar `g`.
    Gdn,
    /// Raw `k`, `g` and `gk`.
    Both,
}

/// Realistic inputs of section 2 (`conformance/spec/ops-delta-rule.md` §10.2): `w`, `u`, `kg` from
/// `kda_intra` on the case, chunk-local log2 gates for chunk size `bt`.
pub struct FwdHCase {
    pub k: Array4<f64>,
    pub w: Array4<f64>,
    pub u: Array4<f64>,
    pub g: Option<Array3<f64>>,
    pub gk: Option<Array4<f64>>,
}

pub fn fwd_h_case(c: &Case, mode: GateMode, bt: usize) -> FwdHCase {
    use attn_reference::delta::{kda_intra, KdaIntraInputs, KdaIntraParams};
    let bti = bt.max(32);
    let gk_intra = chunk_cumsum_log2(&c.g.clone().into_dyn(), bti, c.cu())
        .into_dimensionality::<ndarray::Ix4>()
        .unwrap();
    let intra = kda_intra(
        &KdaIntraInputs {
            q: c.q.view(),
            k: c.k.view(),
            v: c.v.view(),
            gk: gk_intra.view(),
            beta: c.beta.view(),
            cu_seqlens: c.cu(),
        },
        &KdaIntraParams {
            chunk_size: bti as i64,
            ..KdaIntraParams::default()
        },
    )
    .unwrap();
    let gk = chunk_cumsum_log2(&c.g.clone().into_dyn(), bt, c.cu())
        .into_dimensionality::<ndarray::Ix4>()
        .unwrap();
    let g = chunk_cumsum_log2(&c.gs.clone().into_dyn(), bt, c.cu())
        .into_dimensionality::<ndarray::Ix3>()
        .unwrap();
    match mode {
        GateMode::Kda => FwdHCase {
            k: intra.kg,
            w: intra.w,
            u: intra.u,
            g: None,
            gk: Some(gk),
        },
        GateMode::Gdn => FwdHCase {
            k: c.k.clone(),
            w: intra.w,
            u: intra.u,
            g: Some(g),
            gk: None,
        },
        GateMode::Both => FwdHCase {
            k: c.k.clone(),
            w: intra.w,
            u: intra.u,
            g: Some(g),
            gk: Some(gk),
        },
    }
}

impl FwdHCase {
    pub fn inputs<'a>(
        &'a self,
        c: &'a Case,
        h0: Option<&'a Array4<f64>>,
    ) -> attn_reference::delta::FwdHInputs<'a, f64> {
        let mut i =
            attn_reference::delta::FwdHInputs::new(self.k.view(), self.w.view(), self.u.view());
        i.g = self.g.as_ref().map(|a| a.view());
        i.gk = self.gk.as_ref().map(|a| a.view());
        i.initial_state = h0.map(|a| a.view());
        i.cu_seqlens = c.cu();
        i
    }
}

/// The gate modes a property test draws: per-key (KDA), scalar (GDN), both.
pub fn mode() -> impl proptest::strategy::Strategy<Value = GateMode> {
    use proptest::prelude::*;
    prop_oneof![
        Just(GateMode::Kda),
        Just(GateMode::Gdn),
        Just(GateMode::Both)
    ]
}

/// The chunk sizes a property test draws.
pub fn bt() -> impl proptest::strategy::Strategy<Value = usize> {
    use proptest::prelude::*;
    prop_oneof![Just(16usize), Just(32), Just(64)]
}

/// `fwd_h` parameters with every output on.
pub fn params(bt: usize, v_first: bool) -> attn_reference::delta::FwdHParams {
    attn_reference::delta::FwdHParams {
        chunk_size: bt as i64,
        output_final_state: true,
        save_new_value: true,
        state_v_first: v_first,
    }
}

/// `h`, `v_new` and `final_state` of two `fwd_h` results within `tol` of each other.
pub fn assert_same_outputs(
    x: &attn_reference::delta::FwdHOutputs<f64>,
    r: &attn_reference::delta::FwdHOutputs<f64>,
    tol: f64,
) {
    assert_close(&x.h, &r.h, tol, "h");
    assert_close(
        x.v_new.as_ref().unwrap(),
        r.v_new.as_ref().unwrap(),
        tol,
        "v_new",
    );
    assert_close(
        x.final_state.as_ref().unwrap(),
        r.final_state.as_ref().unwrap(),
        tol,
        "final_state",
    );
}

/// Random chunk-aligned split points over the flattened tokens of a case: each inner chunk
/// boundary is cut with probability `p`; a zero-length sequence is one empty piece.
pub fn random_split(c: &Case, bt: usize, p: f64, rng: &mut Rng) -> Vec<i64> {
    let mut out = vec![0i64];
    for (b, bos, eos) in seqs(c.b, c.t, c.cu()) {
        let base = b * c.t;
        let mut at = bos + bt;
        while at < eos {
            if rng.uniform(0.0, 1.0) < p {
                out.push((base + at) as i64);
            }
            at += bt;
        }
        out.push((base + eos) as i64);
    }
    out
}
