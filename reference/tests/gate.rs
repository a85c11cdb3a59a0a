//! Properties of `kda_gate` and `kda_gate_chunk_cumsum` (`conformance/spec/ops-cumsum.md` §4-§5).

mod common;

use attn_reference::cumsum::chunk_local_cumsum;
use attn_reference::gate::{kda_gate, kda_gate_chunk_cumsum, KdaGateChunkCumsumParams};
use attn_reference::RCP_LN2;
use common::{check_close, narrow, same_bits, widen, Rng};
use ndarray::{Array1, Array4, ArrayD, Ix4};
use proptest::prelude::*;

/// One random gate problem: `g [B, T, HV, K]`, `A_log [HV]`, `dt_bias [HV*K]`.
struct Problem {
    g: Array4<f64>,
    a_log: Array1<f64>,
    dt_bias: Array1<f64>,
}

fn problem(rng: &mut Rng, b: usize, t: usize, hv: usize, k: usize) -> Problem {
    let g = rng
        .array(&[b, t, hv, k], -8.0, 8.0)
        .into_dimensionality::<Ix4>()
        .unwrap();
    let a_log = rng.array(&[hv], -2.0, 2.0).into_dimensionality().unwrap();
    let dt_bias = rng
        .array(&[hv * k], -1.0, 1.0)
        .into_dimensionality()
        .unwrap();
    Problem { g, a_log, dt_bias }
}

/// PyTorch `F.softplus` (beta 1, threshold 20), written out for the oracle.
fn torch_softplus(x: f64) -> f64 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// FLA's `naive_kda_gate` / `naive_kda_lowerbound_gate`, element by element.
fn naive_gate(p: &Problem, use_a: bool, use_bias: bool, lower_bound: Option<f64>) -> Array4<f64> {
    let k_dim = p.g.shape()[3];
    Array4::from_shape_fn(p.g.raw_dim(), |(b, t, hv, k)| {
        let bias = if use_bias {
            p.dt_bias[hv * k_dim + k]
        } else {
            0.0
        };
        let a = p.g[[b, t, hv, k]] + bias;
        let w = if use_a { p.a_log[hv].exp() } else { 1.0 };
        match lower_bound {
            None => -w * torch_softplus(a),
            Some(lb) => lb / (1.0 + (-(w * a)).exp()),
        }
    })
}

fn dyn4(a: ArrayD<f64>) -> Array4<f64> {
    a.into_dimensionality().unwrap()
}

fn config() -> ProptestConfig {
    ProptestConfig::with_cases(32)
}

proptest! {
    #![proptest_config(config())]

    /// Both forms (with/without `dt_bias`, with/without `A_log` under `lower_bound`) match the
    /// upstream formulas within 1e-10 in f64, and every value is a log-decay `<= 0`.
    #[test]
    fn gate_matches_upstream_formula(
        b in 1usize..3, t in 0usize..20, hv in 1usize..4, k in 1usize..9,
        use_bias: bool, use_a: bool, lb in prop::option::of(-5.0f64..-0.01), seed: u64,
    ) {
        let p = problem(&mut Rng::new(seed), b, t, hv, k);
        let use_a = use_a || lb.is_none();
        let y = kda_gate(
            p.g.view(),
            use_a.then(|| p.a_log.view()),
            use_bias.then(|| p.dt_bias.view()),
            lb,
        ).unwrap();
        let want = naive_gate(&p, use_a, use_bias, lb);
        if let Err(e) = check_close("y", &want.into_dyn(), &y.clone().into_dyn(), 1e-10) {
            prop_assert!(false, "{}", e);
        }
        prop_assert!(y.iter().all(|&v| v <= 0.0));
        if let Some(lb) = lb {
            prop_assert!(y.iter().all(|&v| v >= lb));
        }
    }

    /// The softplus branch switches exactly at PyTorch's threshold: identity above 20,
    /// `log1p(exp(x))` at and below it; -30 gives a tiny but non-zero decay.
    #[test]
    fn softplus_threshold_and_large_negative(hv in 1usize..4, k in 1usize..6, seed: u64) {
        let mut p = problem(&mut Rng::new(seed), 1, 4, hv, k);
        for (t, x) in [19.9, 20.0, 20.1, -30.0].into_iter().enumerate() {
            p.g.slice_mut(ndarray::s![0, t, .., ..]).fill(x);
        }
        let y = kda_gate(p.g.view(), Some(p.a_log.view()), None, None).unwrap();
        for h in 0..hv {
            let w = p.a_log[h].exp();
            for kk in 0..k {
                prop_assert_eq!(y[[0, 2, h, kk]], -w * 20.1);
                prop_assert_eq!(y[[0, 1, h, kk]], -w * 20.0f64.exp().ln_1p());
                prop_assert_eq!(y[[0, 0, h, kk]], -w * 19.9f64.exp().ln_1p());
                let tiny = y[[0, 3, h, kk]];
                prop_assert!(tiny < 0.0 && tiny > -w * 1e-12, "{}", tiny);
            }
        }
    }

    /// f32 gates meet the spec threshold (1e-5) against f64 on the same inputs.
    #[test]
    fn gate_f32_close_to_f64(
        t in 1usize..40, hv in 1usize..4, k in 1usize..17, lb in prop::option::of(-5.0f64..-0.1), seed: u64,
    ) {
        let p = problem(&mut Rng::new(seed), 2, t, hv, k);
        let (g32, a32, d32) = (narrow(&p.g), narrow(&p.a_log), narrow(&p.dt_bias));
        let r = kda_gate(g32.mapv(f64::from).view(), Some(a32.mapv(f64::from).view()),
                         Some(d32.mapv(f64::from).view()), lb).unwrap();
        let c = kda_gate(g32.view(), Some(a32.view()), Some(d32.view()), lb).unwrap();
        if let Err(e) = check_close("y", &r.into_dyn(), &widen(&c), 1e-5) { prop_assert!(false, "{}", e); }
    }

    /// The fused op is `chunk_local_cumsum(kda_gate(..))`, bit for bit, with varlen, reverse and
    /// scale; forward chunk sums of gates never increase within a chunk.
    #[test]
    fn gate_chunk_cumsum_is_composition(
        t in 0usize..90, hv in 1usize..3, k in 1usize..5, log_bt in 2u32..6,
        varlen: bool, reverse: bool, scaled: bool, lb in prop::option::of(-5.0f64..-0.1), seed: u64,
    ) {
        let mut rng = Rng::new(seed);
        let b = if varlen { 1 } else { 2 };
        let p = problem(&mut rng, b, t, hv, k);
        let cut = rng.below(t + 1) as i64;
        let cu = [0, cut, cut, t as i64];
        let cu = varlen.then_some(&cu[..]);
        let params = KdaGateChunkCumsumParams {
            scale: scaled.then_some(RCP_LN2),
            lower_bound: lb,
            reverse,
            ..KdaGateChunkCumsumParams::new(1 << log_bt)
        };
        let fused = kda_gate_chunk_cumsum(p.g.view(), Some(p.a_log.view()), Some(p.dt_bias.view()), cu, params).unwrap();
        let y = kda_gate(p.g.view(), Some(p.a_log.view()), Some(p.dt_bias.view()), lb).unwrap();
        let composed = dyn4(chunk_local_cumsum(y.into_dyn().view(), cu, 1 << log_bt, reverse, params.scale).unwrap());
        prop_assert!(same_bits(&fused, &composed));
        prop_assert!(fused.iter().all(|&v| v <= 0.0));
    }

    /// f32 fused gate + chunk cumsum meets the spec threshold (1e-5) against f64.
    #[test]
    fn gate_chunk_cumsum_f32_close_to_f64(t in 1usize..200, hv in 1usize..3, k in 1usize..9, seed: u64) {
        let p = problem(&mut Rng::new(seed), 1, t, hv, k);
        let (g32, a32, d32) = (narrow(&p.g), narrow(&p.a_log), narrow(&p.dt_bias));
        let params = KdaGateChunkCumsumParams { scale: Some(RCP_LN2), ..KdaGateChunkCumsumParams::new(64) };
        let r = kda_gate_chunk_cumsum(g32.mapv(f64::from).view(), Some(a32.mapv(f64::from).view()),
                                      Some(d32.mapv(f64::from).view()), None, params).unwrap();
        let c = kda_gate_chunk_cumsum(g32.view(), Some(a32.view()), Some(d32.view()), None, params).unwrap();
        if let Err(e) = check_close("o", &r.into_dyn(), &widen(&c), 1e-5) { prop_assert!(false, "{}", e); }
    }
}
