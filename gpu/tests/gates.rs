//! GPU KDA gates against the float64 reference: `kda_gate` and the fused
//! `kda_gate_chunk_cumsum`, with and without `dt_bias`, `A_log` and `lower_bound`, around the
//! softplus threshold and at large negative inputs, varlen and reverse, several dtypes.
//! Outputs are poisoned with NaN before each launch. Without a GPU each test says why and
//! passes.

mod common;

use attn_gpu::{kda_gate_chunk_cumsum_into, kda_gate_into, DeviceTensor, GateInputs, Gpu};
use attn_reference::gate::{self as refg, KdaGateChunkCumsumParams};
use attn_reference::{Dtype, RCP_LN2};
use common::*;
use ndarray::{ArrayD, Ix1, Ix4};
use proptest::prelude::{any, prop};
use proptest::test_runner::TestRunner;

/// A gate case: g, optional A_log / dt_bias, lower_bound.
struct GateCase {
    g: ArrayD<f64>,
    a_log: Option<ArrayD<f64>>,
    dt_bias: Option<ArrayD<f64>>,
    lower_bound: Option<f64>,
}

fn gate_case(rng: &mut Rng, shape: &[usize], form: usize) -> GateCase {
    let (hv, k) = (shape[2], shape[3]);
    let mut g = rng.array(shape, -6.0, 6.0);
    // values around the softplus threshold and far below zero
    for v in g.iter_mut() {
        match rng.below(16) {
            0 => *v = [19.9, 20.0, 20.1, -30.0][rng.below(4)],
            1 => *v = rng.uniform(18.0, 22.0),
            _ => {}
        }
    }
    let a_log = (form != 3).then(|| rng.array(&[hv], -2.0, 1.0));
    let dt_bias = (form % 2 == 0).then(|| rng.array(&[hv * k], -1.0, 1.0));
    let lower_bound = (form >= 2).then(|| rng.uniform(-5.0, -0.1));
    GateCase {
        g,
        a_log,
        dt_bias,
        lower_bound,
    }
}

/// Uploads the case in `din` (side inputs in fp32) and returns the widened values used.
fn upload_case(
    gpu: &Gpu,
    c: &GateCase,
    din: Dtype,
) -> (
    DeviceTensor,
    Option<DeviceTensor>,
    Option<DeviceTensor>,
    GateCase,
) {
    let (g, gv) = upload(gpu, &c.g, din);
    let a = c.a_log.as_ref().map(|a| upload(gpu, a, Dtype::F32));
    let d = c.dt_bias.as_ref().map(|d| upload(gpu, d, Dtype::F32));
    let widened = GateCase {
        g: gv,
        a_log: a.as_ref().map(|(_, v)| v.clone()),
        dt_bias: d.as_ref().map(|(_, v)| v.clone()),
        lower_bound: c.lower_bound,
    };
    (g, a.map(|(t, _)| t), d.map(|(t, _)| t), widened)
}

fn views(
    c: &GateCase,
) -> (
    ndarray::ArrayView4<'_, f64>,
    Option<ndarray::ArrayView1<'_, f64>>,
    Option<ndarray::ArrayView1<'_, f64>>,
) {
    (
        c.g.view().into_dimensionality::<Ix4>().unwrap(),
        c.a_log
            .as_ref()
            .map(|a| a.view().into_dimensionality::<Ix1>().unwrap()),
        c.dt_bias
            .as_ref()
            .map(|d| d.view().into_dimensionality::<Ix1>().unwrap()),
    )
}

fn kda_gate_matches_reference(gpu: &Gpu) {
    let s = (
        1..3usize,
        1..200usize,
        1..5usize,
        prop::sample::select(vec![1usize, 7, 16, 64, 128]),
        0..4usize,
        0..4usize,
        any::<u64>(),
    );
    TestRunner::new(cases(40))
        .run(&s, |(b, t, hv, k, form, di, seed)| {
            let mut rng = Rng::new(seed);
            let shape = [b, t, hv, k];
            let case = gate_case(&mut rng, &shape, form);
            let din = FLOATS[di];
            let (g, a, d, w) = upload_case(gpu, &case, din);
            let mut y = poisoned(gpu, &shape, Dtype::F32);
            let side = GateInputs {
                a_log: a.as_ref(),
                dt_bias: d.as_ref(),
            };
            kda_gate_into(gpu, &g, &side, case.lower_bound, &mut y).unwrap();
            let (gv, av, dv) = views(&w);
            let want = refg::kda_gate(gv, av, dv, w.lower_bound)
                .unwrap()
                .into_dyn();
            assert_close(
                &format!("kda_gate {shape:?} form {form} {din}"),
                &download(gpu, &y),
                &want,
                1e-5,
            );
            Ok(())
        })
        .unwrap();
}

fn kda_gate_chunk_cumsum_matches_reference(gpu: &Gpu) {
    let s = (
        1..3usize,
        prop::sample::select(vec![1usize, 15, 63, 64, 65, 200, 1000]),
        1..4usize,
        prop::sample::select(vec![1usize, 2, 6, 8, 16, 64, 128]),
        0..4usize,
        prop::option::of(1..6usize),
        prop::sample::select(vec![16i64, 32, 64]),
        (
            any::<bool>(),
            prop::sample::select(vec![None, Some(RCP_LN2)]),
            0..4usize,
            any::<bool>(),
            any::<u64>(),
        ),
    );
    TestRunner::new(cases(40))
        .run(&s, |(b, t, hv, k, form, nseq, chunk_size, (reverse, scale, di, keep, seed))| {
            let mut rng = Rng::new(seed);
            let b = if nseq.is_some() { 1 } else { b };
            let shape = [b, t, hv, k];
            let cu = nseq.map(|n| random_cu_seqlens(&mut rng, t, n));
            let case = gate_case(&mut rng, &shape, form);
            let din = FLOATS[di];
            let dout = if keep { din } else { Dtype::F32 };
            let (g, a, d, w) = upload_case(gpu, &case, din);
            let params = KdaGateChunkCumsumParams { chunk_size, scale, lower_bound: case.lower_bound, reverse };
            let mut o = poisoned(gpu, &shape, dout);
            let side = GateInputs { a_log: a.as_ref(), dt_bias: d.as_ref() };
            kda_gate_chunk_cumsum_into(gpu, &g, &side, cu.as_deref(), &params, &mut o).unwrap();
            let (gv, av, dv) = views(&w);
            let want = refg::kda_gate_chunk_cumsum(gv, av, dv, cu.as_deref(), params).unwrap().into_dyn();
            assert_close(
                &format!("kda_gate_chunk_cumsum {shape:?} cu {cu:?} form {form} {params:?} {din}->{dout}"),
                &download(gpu, &o),
                &want,
                threshold(dout, 1e-5),
            );
            Ok(())
        })
        .unwrap();
}

fn kda_gate_chunk_cumsum_is_bit_identical_over_repeated_launches(gpu: &Gpu) {
    let shape = [2usize, 300, 4, 128];
    let mut rng = Rng::new(3);
    let case = gate_case(&mut rng, &shape, 0);
    let (g, a, d, _) = upload_case(gpu, &case, Dtype::BF16);
    let side = GateInputs {
        a_log: a.as_ref(),
        dt_bias: d.as_ref(),
    };
    let params = KdaGateChunkCumsumParams {
        chunk_size: 64,
        scale: Some(RCP_LN2),
        lower_bound: None,
        reverse: false,
    };
    let mut o = poisoned(gpu, &shape, Dtype::F32);
    kda_gate_chunk_cumsum_into(gpu, &g, &side, None, &params, &mut o).unwrap();
    let first = download(gpu, &o);
    for _ in 0..3 {
        o.poison(gpu).unwrap();
        kda_gate_chunk_cumsum_into(gpu, &g, &side, None, &params, &mut o).unwrap();
        assert_bit_identical("repeated fused gate", &first, &download(gpu, &o));
    }
}

gpu_tests!(
    kda_gate_matches_reference,
    kda_gate_chunk_cumsum_matches_reference,
    kda_gate_chunk_cumsum_is_bit_identical_over_repeated_launches
);
