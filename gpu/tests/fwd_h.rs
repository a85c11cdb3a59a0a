//! `chunk_gated_delta_rule_fwd_h` on the GPU against the float64 reference
//! (`conformance/spec/ops-delta-rule.md` §2.7 thresholds): realistic KDA/GDN inputs over random
//! shapes, dtypes, chunk sizes, heads (GVA), gates and options; the
//! `conformance/spec/ops-delta-rule.md` §2.8 varlen layouts; every tensor-core tile variant;
//! hard-forget gates; `state_v_first` bit-identical to the transposed key-first result; long
//! sequences; and determinism over 100 launches. Outputs are poisoned with NaN before every launch,
//! so every element must have been written. Without a GPU each test says why and passes.

mod common;

use attn_gpu::delta::{FwdHDeviceOutputs, FwdHPlan, KernelChoice};
use attn_gpu::Gpu;
use attn_reference::delta::{self as d, FwdHParams};
use attn_reference::Dtype;
use common::delta::*;
use common::*;
use ndarray::ArrayD;
use proptest::prelude::any;
use proptest::test_runner::TestRunner;

/// One call's options.
#[derive(Clone, Copy, Debug)]
struct Opts {
    dtype: Dtype,
    gate_dtype: Dtype,
    state: Option<Dtype>,
    params: FwdHParams,
}

/// The downloaded outputs.
struct Got {
    h: ArrayD<f64>,
    v_new: Option<ArrayD<f64>>,
    final_state: Option<ArrayD<f64>>,
}

fn poison_all(gpu: &Gpu, o: &mut FwdHDeviceOutputs) {
    o.h.poison(gpu).unwrap();
    if let Some(t) = o.v_new.as_mut() {
        t.poison(gpu).unwrap();
    }
    if let Some(t) = o.final_state.as_mut() {
        t.poison(gpu).unwrap();
    }
}

/// Runs `up` with `plan` into freshly poisoned outputs.
fn launch(gpu: &Gpu, plan: &FwdHPlan, up: &Uploaded) -> Got {
    let mut o = plan.alloc_outputs(gpu).unwrap();
    poison_all(gpu, &mut o);
    plan.run(gpu, &up.tensors(), &mut o).unwrap();
    Got {
        h: download(gpu, &o.h),
        v_new: o.v_new.as_ref().map(|t| download(gpu, t)),
        final_state: o.final_state.as_ref().map(|t| download(gpu, t)),
    }
}

/// `conformance/spec/ops-delta-rule.md` §2.7: half `h`, `v_new` 1e-2, `final_state` 5e-3 (1e-2 when
/// some sequence is longer than 4096 tokens); float32 1e-5; float64 1e-10.
fn thresholds(dtype: Dtype, long: bool) -> (f64, f64) {
    match dtype {
        Dtype::F64 => (1e-10, 1e-10),
        Dtype::F32 => (1e-5, 1e-5),
        _ => (1e-2, if long { 1e-2 } else { 5e-3 }),
    }
}

/// Uploads `inp`, runs it on the GPU (with `choice` when given) and checks every output
/// against the reference. Returns what the GPU produced.
fn check(
    gpu: &Gpu,
    what: &str,
    lay: &Layout,
    inp: &Inputs,
    h0: Option<&ndarray::Array4<f64>>,
    o: Opts,
    choice: Option<KernelChoice>,
) -> Got {
    let up = Uploaded::new(
        gpu,
        inp,
        h0,
        o.dtype,
        o.gate_dtype,
        o.state.unwrap_or(Dtype::F32),
    );
    let cu = lay.cu.as_deref();
    let mut plan = FwdHPlan::new(gpu, &up.tensors(), cu, &o.params).unwrap();
    if let Some(c) = choice {
        plan = plan.with_choice(c).unwrap();
    }
    let got = launch(gpu, &plan, &up);
    let want = d::chunk_gated_delta_rule_fwd_h(&up.reference(cu), &o.params).unwrap();
    let long = lay.seqs().iter().any(|(a, e)| e - a > 4096);
    let (thr, thr_final) = thresholds(o.dtype, long);
    let tag = format!(
        "{what} {lay:?} {o:?} {:?} hopper {}",
        plan.choice(),
        plan.hopper()
    );
    assert_close(&format!("h {tag}"), &got.h, &want.h.into_dyn(), thr);
    match (&got.v_new, want.v_new) {
        (Some(g), Some(w)) => assert_close(&format!("v_new {tag}"), g, &w.into_dyn(), thr),
        (None, None) => {}
        _ => panic!("v_new presence differs: {tag}"),
    }
    match (&got.final_state, want.final_state) {
        (Some(g), Some(w)) => {
            assert_close(&format!("final_state {tag}"), g, &w.into_dyn(), thr_final)
        }
        (None, None) => {}
        _ => panic!("final_state presence differs: {tag}"),
    }
    got
}

const KS: [usize; 6] = [16, 60, 64, 100, 128, 256];
const VS: [usize; 6] = [16, 60, 64, 100, 128, 200];
const HEADS: [(usize, usize); 4] = [(1, 1), (2, 2), (1, 4), (2, 4)];
const TS: [usize; 9] = [0, 1, 15, 63, 64, 65, 77, 1000, 2048];
const DTYPES: [Dtype; 3] = [Dtype::F32, Dtype::BF16, Dtype::F16];
/// `conformance/spec/ops-delta-rule.md` §2.8's varlen layouts.
const VARLEN: [&[i64]; 6] = [
    &[0, 15],
    &[0, 256, 500, 1000],
    &[0, 15, 100, 300, 1200, 2000],
    &[0, 31, 96, 160],
    &[0, 0, 64, 64, 130, 131],
    &[0, 1, 2, 3],
];

#[allow(clippy::too_many_arguments)]
fn layout(
    b: usize,
    t: usize,
    heads: (usize, usize),
    k: usize,
    v: usize,
    bt: usize,
    cu: Option<&[i64]>,
) -> Layout {
    Layout {
        b: if cu.is_some() { 1 } else { b },
        t: cu.map_or(t, |c| *c.last().unwrap() as usize),
        h: heads.0,
        hv: heads.1,
        k,
        v,
        bt,
        cu: cu.map(<[i64]>::to_vec),
    }
}

fn params(bt: usize, bits: u8) -> FwdHParams {
    FwdHParams {
        chunk_size: bt as i64,
        output_final_state: bits & 1 != 0,
        save_new_value: bits & 2 != 0,
        state_v_first: bits & 4 != 0,
    }
}

fn realistic_inputs_match_reference(gpu: &Gpu) {
    let s = (
        (0..3usize, 0..3usize, 0..6usize, 0..6usize, 0..4usize),
        (0..4usize, 0..9usize, 0..8usize, any::<u8>(), any::<bool>()),
        any::<u64>(),
    );
    TestRunner::new(cases(40))
        .run(
            &s,
            |((di, bi, ki, vi, hi), (gi, ti, li, bits, h0), seed)| {
                let mut rng = Rng::new(seed);
                let bt = [16, 32, 64][bi];
                // li < 6: a varlen layout of `conformance/spec/ops-delta-rule.md` §2.8; else B = 1
                // or 2 rows of T tokens
                let cu = (li < 6).then(|| VARLEN[li]);
                let b = if li >= 6 { li - 5 } else { 1 };
                let lay = layout(b, TS[ti], HEADS[hi], KS[ki], VS[vi], bt, cu);
                let inp = realistic(&mut rng, &lay, GATES[gi], false);
                let vf = bits & 4 != 0;
                let state = h0.then(|| random_state(&mut rng, &lay, vf));
                let o = Opts {
                    dtype: DTYPES[di],
                    gate_dtype: if bits & 8 != 0 {
                        Dtype::BF16
                    } else {
                        Dtype::F32
                    },
                    state: Some([Dtype::F32, Dtype::F64, Dtype::BF16][(bits as usize >> 4) % 3]),
                    params: params(bt, bits),
                };
                check(gpu, "realistic", &lay, &inp, state.as_ref(), o, None);
                Ok(())
            },
        )
        .unwrap();
}

fn small_random_inputs_with_gva_and_key_gates_match_reference(gpu: &Gpu) {
    let s = (
        (
            0..3usize,
            0..3usize,
            0..6usize,
            0..6usize,
            0..4usize,
            0..4usize,
        ),
        (1..300usize, 1..3usize, any::<u8>(), any::<u64>()),
    );
    TestRunner::new(cases(24))
        .run(&s, |((di, bi, ki, vi, hi, gi), (t, b, bits, seed))| {
            let mut rng = Rng::new(seed);
            let bt = [16, 32, 64][bi];
            let lay = layout(b, t, HEADS[hi], KS[ki], VS[vi], bt, None);
            let inp = small_random(&mut rng, &lay, GATES[gi]);
            let state = random_state(&mut rng, &lay, bits & 4 != 0);
            let o = Opts {
                dtype: DTYPES[di],
                gate_dtype: Dtype::F32,
                state: Some(Dtype::F32),
                params: params(bt, bits | 3),
            };
            check(gpu, "small random", &lay, &inp, Some(&state), o, None);
            Ok(())
        })
        .unwrap();
}

fn spec_varlen_layouts_every_chunk_size_and_gate(gpu: &Gpu) {
    let mut rng = Rng::new(0x5eed_0001);
    for (li, cu) in VARLEN.iter().enumerate() {
        for (bi, bt) in [16usize, 32, 64].into_iter().enumerate() {
            let dtype = DTYPES[(li + bi) % 3];
            let gates = GATES[(li + 2 * bi) % 4];
            let lay = layout(1, 0, (2, 2), 128, 100, bt, Some(cu));
            let inp = realistic(&mut rng, &lay, gates, false);
            let state = random_state(&mut rng, &lay, false);
            let o = Opts {
                dtype,
                gate_dtype: Dtype::F32,
                state: Some(Dtype::F32),
                params: params(bt, 3),
            };
            check(gpu, "varlen", &lay, &inp, Some(&state), o, None);
        }
    }
}

fn every_tensor_core_tile_variant_matches_reference(gpu: &Gpu) {
    let mut rng = Rng::new(0x5eed_0002);
    for (kp, bv) in [
        (64, 16),
        (64, 32),
        (64, 64),
        (128, 16),
        (128, 32),
        (128, 64),
        (256, 16),
        (256, 32),
    ] {
        // chunk 64 with K = kp and whole column blocks: the fast path's full chunks and its
        // partial last chunks (77 = 64 + 13, 223 = 3 x 64 + 31)
        for (k, v, dtype, bt) in [
            (kp / 2 + 4, 100, Dtype::BF16, 32),
            (kp, 64, Dtype::F16, 32),
            (kp, 128, Dtype::BF16, 64),
        ] {
            let lay = layout(1, 0, (1, 2), k, v, bt, Some(&[0, 77, 77, 300]));
            let inp = realistic(&mut rng, &lay, Gates::Both, false);
            let state = random_state(&mut rng, &lay, false);
            let o = Opts {
                dtype,
                gate_dtype: Dtype::F32,
                state: Some(Dtype::F32),
                params: params(bt, 3),
            };
            check(
                gpu,
                "tile",
                &lay,
                &inp,
                Some(&state),
                o,
                Some(KernelChoice::Mma { kp, bv }),
            );
        }
    }
}

fn hard_forget_gates_stay_finite_and_match(gpu: &Gpu) {
    let mut rng = Rng::new(0x5eed_0003);
    for dtype in DTYPES {
        for gates in [Gates::G, Gates::Gk, Gates::Both] {
            let lay = layout(2, 333, (2, 2), 64, 64, 64, None);
            let inp = realistic(&mut rng, &lay, gates, true);
            assert!(
                inp.g
                    .iter()
                    .flatten()
                    .chain(inp.gk.iter().flatten())
                    .any(|&x| x < -1000.0),
                "the case has hard-forget gates"
            );
            let state = random_state(&mut rng, &lay, false);
            let o = Opts {
                dtype,
                gate_dtype: Dtype::F32,
                state: Some(Dtype::F32),
                params: params(64, 3),
            };
            check(gpu, "hard forget", &lay, &inp, Some(&state), o, None);
        }
    }
}

/// Swaps the last two axes.
fn transposed(a: &ArrayD<f64>) -> ArrayD<f64> {
    let n = a.ndim();
    let mut t = a.view();
    t.swap_axes(n - 2, n - 1);
    t.as_standard_layout().into_owned()
}

fn state_v_first_is_the_transposed_key_first_result(gpu: &Gpu) {
    let mut rng = Rng::new(0x5eed_0004);
    for (dtype, k, v) in [
        (Dtype::BF16, 128, 128),
        (Dtype::F16, 60, 100),
        (Dtype::F32, 100, 60),
    ] {
        let lay = layout(1, 0, (1, 2), k, v, 64, Some(&[0, 100, 100, 400]));
        let inp = realistic(&mut rng, &lay, Gates::Gk, false);
        let s_kf = random_state(&mut rng, &lay, false);
        let s_vf = {
            let mut t = s_kf.view();
            t.swap_axes(2, 3);
            t.as_standard_layout().into_owned()
        };
        let o = |vf| Opts {
            dtype,
            gate_dtype: Dtype::F32,
            state: Some(Dtype::F32),
            params: params(64, if vf { 7 } else { 3 }),
        };
        let a = check(gpu, "key-first", &lay, &inp, Some(&s_kf), o(false), None);
        let b = check(gpu, "v-first", &lay, &inp, Some(&s_vf), o(true), None);
        assert_bit_identical("h", &transposed(&a.h), &b.h);
        assert_bit_identical(
            "v_new",
            a.v_new.as_ref().unwrap(),
            b.v_new.as_ref().unwrap(),
        );
        assert_bit_identical(
            "final_state",
            &transposed(a.final_state.as_ref().unwrap()),
            b.final_state.as_ref().unwrap(),
        );
    }
}

fn long_sequences_match_reference_with_long_thresholds(gpu: &Gpu) {
    let mut rng = Rng::new(0x5eed_0005);
    for (t, dtype, gates) in [
        (8192, Dtype::BF16, Gates::Gk),
        (8192, Dtype::F32, Gates::G),
        (32768, Dtype::BF16, Gates::Gk),
        (32768, Dtype::F16, Gates::G),
    ] {
        let lay = layout(1, t, (1, 1), 128, 128, 64, None);
        let inp = realistic(&mut rng, &lay, gates, false);
        let state = random_state(&mut rng, &lay, false);
        let o = Opts {
            dtype,
            gate_dtype: Dtype::F32,
            state: Some(Dtype::F32),
            params: params(64, 3),
        };
        check(gpu, "long", &lay, &inp, Some(&state), o, None);
    }
}

fn hundred_launches_are_bit_identical(gpu: &Gpu) {
    let mut rng = Rng::new(0x5eed_0006);
    for dtype in [Dtype::BF16, Dtype::F32] {
        let lay = layout(
            1,
            0,
            (2, 4),
            128,
            128,
            64,
            Some(&[0, 15, 100, 300, 1200, 2000]),
        );
        let inp = realistic(&mut rng, &lay, Gates::G, false);
        let state = random_state(&mut rng, &lay, false);
        let up = Uploaded::new(gpu, &inp, Some(&state), dtype, Dtype::F32, Dtype::F32);
        let p = params(64, 3);
        let plan = FwdHPlan::new(gpu, &up.tensors(), lay.cu.as_deref(), &p).unwrap();
        let first = launch(gpu, &plan, &up);
        for i in 1..100 {
            let again = launch(gpu, &plan, &up);
            assert_bit_identical(&format!("h, launch {i}"), &first.h, &again.h);
            assert_bit_identical(
                &format!("v_new, launch {i}"),
                first.v_new.as_ref().unwrap(),
                again.v_new.as_ref().unwrap(),
            );
            assert_bit_identical(
                &format!("final_state, launch {i}"),
                first.final_state.as_ref().unwrap(),
                again.final_state.as_ref().unwrap(),
            );
        }
    }
}

fn float64_inputs_match_reference_to_1e_10(gpu: &Gpu) {
    let mut rng = Rng::new(0x5eed_0007);
    for (li, gates) in GATES.into_iter().enumerate() {
        let cu = VARLEN[li + 1];
        let lay = layout(
            1,
            0,
            (1, 2),
            [60, 128, 100, 256][li],
            [100, 64, 60, 16][li],
            [16, 32, 64, 64][li],
            Some(cu),
        );
        let inp = realistic(&mut rng, &lay, gates, li == 3);
        let vf = li % 2 == 1;
        let state = random_state(&mut rng, &lay, vf);
        let o = Opts {
            dtype: Dtype::F64,
            gate_dtype: Dtype::F64,
            state: Some(Dtype::F64),
            params: params(lay.bt, if vf { 7 } else { 3 }),
        };
        let got = check(gpu, "float64", &lay, &inp, Some(&state), o, None);
        assert!(got.final_state.is_some(), "final_state asked for");
    }
}

/// Whether this device runs bf16 calls with `K = 128`, `V` a multiple of 64 and chunks of 64 on
/// the Hopper kernel `chunk_gated_delta_rule_fwd_h_wg_bf16`: an sm_90 device, unless
/// `$ATTN_GDN_WG=0` or `$ATTN_FWD_H_WG=0`.
fn hopper(gpu: &Gpu) -> bool {
    gpu.arch() == (9, 0)
        && std::env::var("ATTN_GDN_WG").as_deref() != Ok("0")
        && std::env::var("ATTN_FWD_H_WG").as_deref() != Ok("0")
}

/// The Hopper kernel's cases (bf16, `K = 128`, `V` 64 / 128 / 256, chunks of 64) over varlen
/// layouts with empty, one-token and partial sequences, `B = 2` rows with a partial last chunk,
/// GVA, every gate kind (per-key gates too, fp32 or bf16), no / fp32 / fp64 / bf16
/// `initial_state` and every output option (`state_v_first` too): each call asserts that the
/// default plan takes the Hopper kernel on an sm_90 device, then checks it against the float64
/// reference and against the `mma.sync` kernel (`kp` 128, `bv` 64) at §2.7's thresholds.
fn hopper_kernel_matches_reference_and_mma(gpu: &Gpu) {
    let layouts: [(usize, usize, Option<&[i64]>); 6] = [
        (1, 0, Some(VARLEN[4])),
        (1, 0, Some(VARLEN[2])),
        (2, 77, None),
        (2, 1000, None),
        (1, 2048, None),
        (1, 0, Some(VARLEN[5])),
    ];
    let mut rng = Rng::new(0x5eed_0f4a);
    let mma = KernelChoice::Mma { kp: 128, bv: 64 };
    for (i, &(b, t, cu)) in layouts.iter().enumerate() {
        for (j, v) in [64, 128, 256].into_iter().enumerate() {
            let case = 3 * i + j;
            let lay = layout(b, t, HEADS[case % 4], 128, v, 64, cu);
            let inp = realistic(&mut rng, &lay, GATES[(i + 2 * j) % 4], false);
            // final state, v_new, state_v_first and bf16 gates in turn over the 18 cases
            let bits = ((case * 5) % 16) as u8;
            let vf = bits & 4 != 0;
            let state = (case % 4 != 3).then(|| random_state(&mut rng, &lay, vf));
            let o = Opts {
                dtype: Dtype::BF16,
                gate_dtype: if bits & 8 != 0 {
                    Dtype::BF16
                } else {
                    Dtype::F32
                },
                state: Some([Dtype::F32, Dtype::F64, Dtype::BF16][case % 3]),
                params: params(64, bits),
            };
            let up = Uploaded::new(gpu, &inp, state.as_ref(), o.dtype, o.gate_dtype, Dtype::F32);
            let plan = FwdHPlan::new(gpu, &up.tensors(), cu, &o.params).unwrap();
            assert_eq!(
                plan.hopper(),
                hopper(gpu),
                "the Hopper kernel: {lay:?} {o:?}"
            );
            let got = check(gpu, "hopper", &lay, &inp, state.as_ref(), o, None);
            let twin = check(gpu, "mma twin", &lay, &inp, state.as_ref(), o, Some(mma));
            let (thr, thr_final) = thresholds(Dtype::BF16, false);
            let tag = format!("hopper vs mma {lay:?} {o:?}");
            assert_close(&format!("h {tag}"), &got.h, &twin.h, thr);
            if let (Some(g), Some(m)) = (&got.v_new, &twin.v_new) {
                assert_close(&format!("v_new {tag}"), g, m, thr);
            }
            if let (Some(g), Some(m)) = (&got.final_state, &twin.final_state) {
                assert_close(&format!("final_state {tag}"), g, m, thr_final);
            }
        }
    }
}

gpu_tests!(
    hopper_kernel_matches_reference_and_mma,
    realistic_inputs_match_reference,
    small_random_inputs_with_gva_and_key_gates_match_reference,
    spec_varlen_layouts_every_chunk_size_and_gate,
    every_tensor_core_tile_variant_matches_reference,
    hard_forget_gates_stay_finite_and_match,
    state_v_first_is_the_transposed_key_first_result,
    long_sequences_match_reference_with_long_thresholds,
    hundred_launches_are_bit_identical,
    float64_inputs_match_reference_to_1e_10
);
