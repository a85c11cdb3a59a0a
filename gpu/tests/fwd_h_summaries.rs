//! `fwd_h_pre_scan` and `fwd_h_merge` on the GPU against the float64 reference
//! (`conformance/spec/ops-delta-rule.md` §3.5, §4.7), the identity `M S0 + b = final_state`
//! (`conformance/spec/ops-delta-rule.md` §3.6), the composition pre-scan + merge + fwd_h on the
//! pieces = fwd_h on the whole sequences (`conformance/spec/ops-delta-rule.md` §4.8), and
//! determinism. Outputs are poisoned with NaN before every launch. Without a GPU each test says why
//! and passes.

mod common;

use attn_gpu::delta::{FwdHMergePlan, FwdHPlan, FwdHPreScanPlan};
use attn_gpu::{DeviceTensor, Gpu};
use attn_reference::delta::{
    self as d, FwdHMergeInputs, FwdHMergeParams, FwdHParams, FwdHPreScanParams,
};
use attn_reference::Dtype;
use common::delta::*;
use common::*;
use ndarray::{s, Array4, ArrayD, Axis, Ix4};
use proptest::prelude::any;
use proptest::test_runner::TestRunner;

/// The pre-scan of `up` on the GPU (poisoned `hm` first), downloaded.
fn pre_scan(gpu: &Gpu, up: &Uploaded, cu: Option<&[i64]>, bt: usize) -> Array4<f64> {
    let p = FwdHPreScanParams {
        chunk_size: bt as i64,
    };
    let plan = FwdHPreScanPlan::new(gpu, &up.tensors(), cu, &p).unwrap();
    let mut hm = poisoned(gpu, &plan.hm_shape(), plan.hm_dtype());
    plan.run(gpu, &up.tensors(), &mut hm).unwrap();
    download(gpu, &hm).into_dimensionality::<Ix4>().unwrap()
}

/// `hm[..., :V]` and `hm[..., V:]`.
fn parts(hm: &Array4<f64>, v: usize) -> (ArrayD<f64>, ArrayD<f64>) {
    (
        hm.slice(s![.., .., .., ..v]).to_owned().into_dyn(),
        hm.slice(s![.., .., .., v..]).to_owned().into_dyn(),
    )
}

/// `conformance/spec/ops-delta-rule.md` §3.5: `hm.b` half 5e-3 (long 1e-2), `hm.M` half 1e-2;
/// float32 1e-5 for both; float64 1e-10.
fn prescan_thresholds(dtype: Dtype, long: bool) -> (f64, f64) {
    match dtype {
        Dtype::F64 => (1e-10, 1e-10),
        Dtype::F32 => (1e-5, 1e-5),
        _ => (if long { 1e-2 } else { 5e-3 }, 1e-2),
    }
}

/// Pieces of sub-sequences over `t` tokens: `cuts` chunk-aligned inner boundaries plus empty
/// pieces where `empty` is set.
fn pieces(rng: &mut Rng, t: usize, bt: usize, cuts: usize, empty: bool) -> Vec<i64> {
    let nt = t.div_ceil(bt);
    let mut inner: Vec<i64> = (0..cuts)
        .map(|_| (rng.below(nt.max(1)) * bt).min(t) as i64)
        .collect();
    inner.sort_unstable();
    let mut cu = vec![0];
    if empty {
        cu.push(0);
    }
    cu.extend(inner);
    cu.push(t as i64);
    cu
}

fn pre_scan_matches_reference(gpu: &Gpu) {
    let s = (
        (
            0..3usize,
            0..3usize,
            0..4usize,
            0..2usize,
            0..4usize,
            0..4usize,
        ),
        (1..1500usize, 0..6usize, any::<bool>(), any::<u64>()),
    );
    TestRunner::new(cases(32))
        .run(&s, |((di, bi, ki, vi, hi, gi), (t, cuts, empty, seed))| {
            let mut rng = Rng::new(seed);
            let bt = [16, 32, 64][bi];
            let heads = [(1, 1), (2, 2), (1, 4), (2, 4)][hi];
            let cu = pieces(&mut rng, t, bt, cuts, empty);
            let lay = Layout {
                b: 1,
                t,
                h: heads.0,
                hv: heads.1,
                k: [60, 100, 128, 256][ki],
                v: [60, 100][vi],
                bt,
                cu: Some(cu.clone()),
            };
            let dtype = [Dtype::F32, Dtype::BF16, Dtype::F16, Dtype::F64][di];
            let inp = realistic(&mut rng, &lay, GATES[gi], false);
            let gate_dtype = if dtype == Dtype::F64 {
                Dtype::F64
            } else {
                Dtype::F32
            };
            let up = Uploaded::new(gpu, &inp, None, dtype, gate_dtype, Dtype::F32);
            let got = pre_scan(gpu, &up, Some(&cu), bt);
            let want = d::fwd_h_pre_scan(
                &up.reference(Some(&cu)),
                &FwdHPreScanParams {
                    chunk_size: bt as i64,
                },
            )
            .unwrap()
            .hm;
            let long = lay.seqs().iter().any(|(a, e)| e - a > 4096);
            let (tb, tm) = prescan_thresholds(dtype, long);
            let (gb, gm) = parts(&got, lay.v);
            let (wb, wm) = parts(&want, lay.v);
            let tag = format!("{lay:?} {dtype}");
            assert_close(&format!("hm.b {tag}"), &gb, &wb, tb);
            assert_close(&format!("hm.M {tag}"), &gm, &wm, tm);
            Ok(())
        })
        .unwrap();
}

fn pre_scan_of_200_chunks_and_empty_pieces(gpu: &Gpu) {
    let mut rng = Rng::new(0x5eed_0101);
    for dtype in [Dtype::BF16, Dtype::F32] {
        // pieces of 200 chunks, 1 chunk, empty, a partial chunk
        let cu = vec![0i64, 3200, 3216, 3216, 3220];
        let lay = Layout {
            b: 1,
            t: 3220,
            h: 1,
            hv: 1,
            k: 128,
            v: 128,
            bt: 16,
            cu: Some(cu.clone()),
        };
        let inp = realistic(&mut rng, &lay, Gates::Gk, false);
        let up = Uploaded::new(gpu, &inp, None, dtype, Dtype::F32, Dtype::F32);
        let got = pre_scan(gpu, &up, Some(&cu), 16);
        let want = d::fwd_h_pre_scan(
            &up.reference(Some(&cu)),
            &FwdHPreScanParams { chunk_size: 16 },
        )
        .unwrap()
        .hm;
        let (tb, tm) = prescan_thresholds(dtype, false);
        let (gb, gm) = parts(&got, 128);
        let (wb, wm) = parts(&want, 128);
        assert_close(&format!("hm.b {dtype}"), &gb, &wb, tb);
        assert_close(&format!("hm.M {dtype}"), &gm, &wm, tm);
        // the empty piece is exactly [0 | I]
        let e = got.slice(s![2, 0, .., ..]);
        for ((i, j), &x) in e.indexed_iter() {
            let (i, j): (usize, usize) = (i, j);
            let want = if j >= 128 && j - 128 == i { 1.0 } else { 0.0 };
            assert_eq!(x, want, "empty piece hm[{i}, {j}]");
        }
    }
}

/// `M · S0 + b` of every piece (`hm` `[S, HV, K, V + K]`, `s0` `[S, HV, K, V]`).
fn apply(hm: &Array4<f64>, s0: &Array4<f64>) -> Array4<f64> {
    let v = s0.shape()[3];
    let mut out = hm.slice(s![.., .., .., ..v]).to_owned();
    for (si, mut o) in out.axis_iter_mut(Axis(0)).enumerate() {
        for (hv, mut oh) in o.axis_iter_mut(Axis(0)).enumerate() {
            let m = hm.slice(s![si, hv, .., v..]);
            oh += &m.dot(&s0.slice(s![si, hv, .., ..]));
        }
    }
    out
}

fn summary_applied_to_a_state_equals_the_final_state(gpu: &Gpu) {
    let mut rng = Rng::new(0x5eed_0102);
    for (dtype, gates, k, v) in [
        (Dtype::BF16, Gates::Gk, 128, 128),
        (Dtype::F16, Gates::G, 100, 60),
        (Dtype::F32, Gates::Both, 60, 100),
    ] {
        let cu = vec![0i64, 500, 500, 1300];
        let lay = Layout {
            b: 1,
            t: 1300,
            h: 2,
            hv: 2,
            k,
            v,
            bt: 64,
            cu: Some(cu.clone()),
        };
        let inp = realistic(&mut rng, &lay, gates, false);
        let s0 = random_state(&mut rng, &lay, false);
        let up = Uploaded::new(gpu, &inp, Some(&s0), dtype, Dtype::F32, Dtype::F32);
        let no_state = Uploaded::new(gpu, &inp, None, dtype, Dtype::F32, Dtype::F32);
        let hm = pre_scan(gpu, &no_state, Some(&cu), 64);
        let p = FwdHParams {
            output_final_state: true,
            ..FwdHParams::default()
        };
        let plan = FwdHPlan::new(gpu, &up.tensors(), Some(&cu), &p).unwrap();
        let mut o = plan.alloc_outputs(gpu).unwrap();
        o.final_state.as_mut().unwrap().poison(gpu).unwrap();
        plan.run(gpu, &up.tensors(), &mut o).unwrap();
        let fin = download(gpu, o.final_state.as_ref().unwrap());
        let thr = if dtype == Dtype::F32 { 1e-5 } else { 5e-3 };
        assert_close(
            &format!("M S0 + b vs final_state {dtype}"),
            &apply(&hm, &up.exact_h0.clone().unwrap()).into_dyn(),
            &fin,
            thr,
        );
    }
}

/// A merge of `hm` in `dtype` on the GPU (poisoned outputs) and the reference's, compared (spec
/// 4.7: float32 2e-5, float64 1e-10).
fn check_merge(
    gpu: &Gpu,
    hm: &Array4<f64>,
    offsets: &[i64],
    h0: Option<&Array4<f64>>,
    p: &FwdHMergeParams,
    dtype: Dtype,
) -> (ArrayD<f64>, Option<ArrayD<f64>>) {
    let thr = if dtype == Dtype::F64 { 1e-10 } else { 2e-5 };
    let (hm_d, hm_x) = upload(gpu, &hm.clone().into_dyn(), dtype);
    let h0_up = h0.map(|a| upload(gpu, &a.clone().into_dyn(), Dtype::F32));
    let plan = FwdHMergePlan::new(gpu, &hm_d, h0_up.as_ref().map(|x| &x.0), offsets, p).unwrap();
    let mut o = plan.alloc_outputs(gpu).unwrap();
    o.initial_states.poison(gpu).unwrap();
    if let Some(t) = o.final_state.as_mut() {
        t.poison(gpu).unwrap();
    }
    plan.run(gpu, &hm_d, h0_up.as_ref().map(|x| &x.0), &mut o)
        .unwrap();
    let hm_x = hm_x.into_dimensionality::<Ix4>().unwrap();
    let h0_x = h0_up
        .as_ref()
        .map(|x| x.1.clone().into_dimensionality::<Ix4>().unwrap());
    let want = d::fwd_h_merge(
        &FwdHMergeInputs {
            hm: hm_x.view(),
            subseq_offsets: offsets,
            initial_state: h0_x.as_ref().map(|a| a.view()),
        },
        p,
    )
    .unwrap();
    let got_init = download(gpu, &o.initial_states);
    assert_close(
        &format!("initial_states {offsets:?} {p:?}"),
        &got_init,
        &want.initial_states.into_dyn(),
        thr,
    );
    let got_final = o.final_state.as_ref().map(|t| download(gpu, t));
    match (&got_final, want.final_state) {
        (Some(g), Some(w)) => assert_close(
            &format!("final_state {offsets:?} {p:?}"),
            g,
            &w.into_dyn(),
            thr,
        ),
        (None, None) => {}
        _ => panic!("final_state presence differs"),
    }
    (got_init, got_final)
}

fn merge_chains_match_reference(gpu: &Gpu) {
    let mut rng = Rng::new(0x5eed_0103);
    // several sequences of different counts (0, 1, 2, 5, 32, 40 sub-sequences)
    let counts = [1usize, 2, 0, 5, 32, 40];
    let mut offsets = vec![0i64];
    for c in counts {
        offsets.push(offsets.last().unwrap() + c as i64);
    }
    let s_total = *offsets.last().unwrap() as usize;
    for (k, v, hv) in [(16, 16, 1), (64, 100, 2), (100, 60, 1)] {
        let mut hm: Array4<f64> = rng.randn([s_total, hv, k, v + k]);
        for mut m in hm.axis_iter_mut(Axis(0)) {
            for mut mh in m.axis_iter_mut(Axis(0)) {
                let mut mm = mh.slice_mut(s![.., v..]);
                mm *= 0.1 / (k as f64).sqrt();
                for i in 0..k {
                    mm[[i, i]] += 1.0;
                }
            }
        }
        for bits in 0..8u8 {
            let p = FwdHMergeParams {
                state_v_first: bits & 1 != 0,
                output_final_state: bits & 2 != 0,
            };
            let h0 = (bits & 4 != 0).then(|| {
                if p.state_v_first {
                    rng.randn([counts.len(), hv, v, k])
                } else {
                    rng.randn([counts.len(), hv, k, v])
                }
            });
            let dtype = if bits & 1 != 0 && k == 64 {
                Dtype::F64
            } else {
                Dtype::F32
            };
            check_merge(gpu, &hm, &offsets, h0.as_ref(), &p, dtype);
        }
    }
}

fn merge_of_pre_scan_summaries_and_composition_equal_the_unsplit_run(gpu: &Gpu) {
    let mut rng = Rng::new(0x5eed_0104);
    for (dtype, gates) in [
        (Dtype::BF16, Gates::Gk),
        (Dtype::F32, Gates::G),
        (Dtype::F16, Gates::Both),
    ] {
        // two sequences (1000 and 1300 tokens), cut into 3 and 4 pieces at chunk boundaries
        let seq_cu = vec![0i64, 1000, 2300];
        let piece_cu = vec![0i64, 256, 512, 1000, 1064, 1576, 2024, 2300];
        let offsets = vec![0i64, 3, 7];
        let whole = Layout {
            b: 1,
            t: 2300,
            h: 2,
            hv: 2,
            k: 128,
            v: 64,
            bt: 64,
            cu: Some(seq_cu.clone()),
        };
        let inp = realistic(&mut rng, &whole, gates, false);
        let s0 = random_state(&mut rng, &whole, false);
        let up = Uploaded::new(gpu, &inp, Some(&s0), dtype, Dtype::F32, Dtype::F32);
        let bare = Uploaded::new(gpu, &inp, None, dtype, Dtype::F32, Dtype::F32);
        // summaries, then the chain
        let hm = pre_scan(gpu, &bare, Some(&piece_cu), 64);
        let p = FwdHMergeParams {
            state_v_first: false,
            output_final_state: true,
        };
        let (entering, _) = check_merge(gpu, &hm, &offsets, up.exact_h0.as_ref(), &p, Dtype::F32);
        // fwd_h on the pieces from the merged entering states, and on the whole sequences
        let fp = FwdHParams {
            output_final_state: true,
            ..FwdHParams::default()
        };
        let run = |cu: &[i64], h0: &DeviceTensor| {
            let mut t = bare.tensors();
            t.initial_state = Some(h0);
            let plan = FwdHPlan::new(gpu, &t, Some(cu), &fp).unwrap();
            let mut o = plan.alloc_outputs(gpu).unwrap();
            o.h.poison(gpu).unwrap();
            plan.run(gpu, &t, &mut o).unwrap();
            (
                download(gpu, &o.h),
                download(gpu, o.final_state.as_ref().unwrap()),
            )
        };
        let entering_d = DeviceTensor::from_array(gpu, entering.mapv(|x| x as f32).view()).unwrap();
        let (h_pieces, fin_pieces) = run(&piece_cu, &entering_d);
        let (h_whole, fin_whole) = run(&seq_cu, up.h0.as_ref().unwrap());
        let thr = if dtype == Dtype::F32 { 2e-5 } else { 1e-2 };
        assert_close(
            &format!("h pieces vs whole {dtype}"),
            &h_pieces,
            &h_whole,
            thr,
        );
        let last = fin_pieces.select(Axis(0), &[2, 6]);
        assert_close(
            &format!("final pieces vs whole {dtype}"),
            &last,
            &fin_whole,
            thr,
        );
    }
}

fn pre_scan_and_merge_are_deterministic(gpu: &Gpu) {
    let mut rng = Rng::new(0x5eed_0105);
    let cu = vec![0i64, 640, 1280, 2000];
    let lay = Layout {
        b: 1,
        t: 2000,
        h: 2,
        hv: 2,
        k: 128,
        v: 128,
        bt: 64,
        cu: Some(cu.clone()),
    };
    for dtype in [Dtype::BF16, Dtype::F32] {
        let inp = realistic(&mut rng, &lay, Gates::Gk, false);
        let up = Uploaded::new(gpu, &inp, None, dtype, Dtype::F32, Dtype::F32);
        let first = pre_scan(gpu, &up, Some(&cu), 64).into_dyn();
        for i in 1..100 {
            let again = pre_scan(gpu, &up, Some(&cu), 64).into_dyn();
            assert_bit_identical(&format!("hm {dtype} launch {i}"), &first, &again);
        }
        let hm = first.into_dimensionality::<Ix4>().unwrap();
        let p = FwdHMergeParams {
            state_v_first: false,
            output_final_state: true,
        };
        let (a, af) = check_merge(gpu, &hm, &[0, 3], None, &p, Dtype::F32);
        for i in 1..100 {
            let (b, bf) = check_merge(gpu, &hm, &[0, 3], None, &p, Dtype::F32);
            assert_bit_identical(&format!("initial_states launch {i}"), &a, &b);
            assert_bit_identical(
                &format!("final launch {i}"),
                af.as_ref().unwrap(),
                bf.as_ref().unwrap(),
            );
        }
    }
}

gpu_tests!(
    pre_scan_matches_reference,
    pre_scan_of_200_chunks_and_empty_pieces,
    summary_applied_to_a_state_equals_the_final_state,
    merge_chains_match_reference,
    merge_of_pre_scan_summaries_and_composition_equal_the_unsplit_run,
    pre_scan_and_merge_are_deterministic
);
