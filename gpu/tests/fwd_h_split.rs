//! `chunk_gated_delta_rule_fwd_h_split` on the GPU (`conformance/spec/ops-delta-rule.md` §5):
//! explicit splits of §5.8 against the float64 §2 reference at §5.7's thresholds (including two
//! and three split sequences in one batch, the layout FLA 0.6.0 gets wrong), long cases against the
//! reference and against our serial kernel (5e-3), the auto policy against the serial kernel,
//! determinism over 100 launches of one plan and workspace, and every bad split of §5.6 a typed
//! error. Outputs and the workspace are poisoned with NaN before every launch. Without a GPU each
//! test says why and passes.

mod common;

use attn_gpu::delta::{FwdHDeviceOutputs, FwdHPlan, FwdHSplitPlan, SplitMode};
use attn_gpu::{Gpu, GpuError};
use attn_reference::delta::{self as d, FwdHParams};
use attn_reference::Dtype;
use common::delta::*;
use common::*;
use ndarray::ArrayD;

/// The downloaded outputs.
struct Got {
    h: ArrayD<f64>,
    v_new: Option<ArrayD<f64>>,
    final_state: Option<ArrayD<f64>>,
}

fn poison_all(gpu: &Gpu, o: &mut FwdHDeviceOutputs) {
    o.h.poison(gpu).unwrap();
    for t in [o.v_new.as_mut(), o.final_state.as_mut()]
        .into_iter()
        .flatten()
    {
        t.poison(gpu).unwrap();
    }
}

fn fetch(gpu: &Gpu, o: &FwdHDeviceOutputs) -> Got {
    Got {
        h: download(gpu, &o.h),
        v_new: o.v_new.as_ref().map(|t| download(gpu, t)),
        final_state: o.final_state.as_ref().map(|t| download(gpu, t)),
    }
}

/// Runs `plan` on `up` into poisoned outputs with a fresh workspace.
fn launch(gpu: &Gpu, plan: &FwdHSplitPlan, up: &Uploaded) -> Got {
    let mut ws = plan.alloc_workspace(gpu).unwrap();
    let mut o = plan.alloc_outputs(gpu).unwrap();
    poison_all(gpu, &mut o);
    plan.run(gpu, &up.tensors(), &mut ws, &mut o).unwrap();
    fetch(gpu, &o)
}

/// Our serial kernel on `up`.
fn serial(gpu: &Gpu, up: &Uploaded, cu: Option<&[i64]>, p: &FwdHParams) -> Got {
    let plan = FwdHPlan::new(gpu, &up.tensors(), cu, p).unwrap();
    let mut o = plan.alloc_outputs(gpu).unwrap();
    poison_all(gpu, &mut o);
    plan.run(gpu, &up.tensors(), &mut o).unwrap();
    fetch(gpu, &o)
}

/// Every output of `got` against `want` at `thr`.
fn compare(tag: &str, got: &Got, want: &Got, thr: f64) {
    assert_close(&format!("h {tag}"), &got.h, &want.h, thr);
    for (name, g, w) in [
        ("v_new", &got.v_new, &want.v_new),
        ("final_state", &got.final_state, &want.final_state),
    ] {
        match (g, w) {
            (Some(g), Some(w)) => assert_close(&format!("{name} {tag}"), g, w, thr),
            (None, None) => {}
            _ => panic!("{name} presence differs: {tag}"),
        }
    }
}

/// The float64 section-2 reference on the exact device values.
fn reference(up: &Uploaded, cu: Option<&[i64]>, p: &FwdHParams) -> Got {
    let o = d::chunk_gated_delta_rule_fwd_h(&up.reference(cu), p).unwrap();
    Got {
        h: o.h.into_dyn(),
        v_new: o.v_new.map(|a| a.into_dyn()),
        final_state: o.final_state.map(|a| a.into_dyn()),
    }
}

/// `conformance/spec/ops-delta-rule.md` §5.7: half 1e-2, float32 5e-5, float64 1e-10.
fn split_threshold(dtype: Dtype) -> f64 {
    match dtype {
        Dtype::F64 => 1e-10,
        Dtype::F32 => 5e-5,
        _ => 1e-2,
    }
}

/// `subseq_cu_seqlens` cutting sequence `n` (of `lens[n]` tokens) after the chunk counts
/// `cuts[n]` (pieces of those many chunks, the rest of the sequence the last piece).
fn split_by_chunks(lens: &[usize], cuts: &[&[usize]], bt: usize) -> Vec<i64> {
    let mut out = vec![0i64];
    let mut bos = 0usize;
    for (&len, c) in lens.iter().zip(cuts) {
        let mut at = bos;
        for &chunks in c.iter() {
            at += chunks * bt;
            if at < bos + len {
                out.push(at as i64);
            }
        }
        bos += len;
        out.push(bos as i64);
    }
    out
}

fn cu_of(lens: &[usize]) -> Vec<i64> {
    let mut c = vec![0i64];
    for &l in lens {
        c.push(c.last().unwrap() + l as i64);
    }
    c
}

/// One explicit-split case of `conformance/spec/ops-delta-rule.md` §5.8.
struct Case {
    what: &'static str,
    lens: Vec<usize>,
    /// `None`: no `cu_seqlens`, `B = lens.len()` rows of `lens[0]` tokens.
    varlen: bool,
    cuts: Vec<&'static [usize]>,
}

fn explicit_cases() -> Vec<Case> {
    let c = |what, lens: Vec<usize>, cuts: Vec<&'static [usize]>| Case {
        what,
        lens,
        varlen: true,
        cuts,
    };
    let every: &'static [usize] = &[1; 40];
    vec![
        c("every chunk its own piece", vec![700], vec![every]),
        c(
            "pieces of 1, 3, 4, 8 chunks and a remainder",
            vec![1300],
            vec![&[1, 3, 4, 8]],
        ),
        c("33 pieces", vec![33 * 64 + 5], vec![&[1; 33]]),
        c(
            "one split, one unsplit",
            vec![1000, 500],
            vec![&[4, 2], &[]],
        ),
        c(
            "two split sequences",
            vec![800, 900],
            vec![&[3, 5], &[2, 2, 2]],
        ),
        c(
            "three split sequences between unsplit ones",
            vec![700, 200, 900, 130, 650],
            vec![&[2, 3], &[], &[1, 5, 2], &[], &[4]],
        ),
        c(
            "zero-length and one-token sequences",
            vec![0, 1, 600, 0, 700, 1],
            vec![&[], &[], &[2, 2], &[], &[3], &[]],
        ),
        Case {
            what: "no cu_seqlens, B = 2",
            lens: vec![500, 500],
            varlen: false,
            cuts: vec![&[2], &[1, 3]],
        },
    ]
}

fn explicit_splits_match_reference(gpu: &Gpu) {
    let mut rng = Rng::new(0x5eed_1401);
    let dtypes = [Dtype::BF16, Dtype::F32, Dtype::F16, Dtype::F64];
    let heads = [(1, 1), (2, 2), (1, 4), (2, 4)];
    let ks = [60, 128, 256];
    let cases = explicit_cases();
    let total = cases.len() * 3;
    for (i, case) in cases.into_iter().enumerate() {
        for round in 0..3 {
            let j = i * 3 + round;
            if !table_row_runs(j, total) {
                continue;
            }
            let bt = [16, 32, 64][round];
            // the cases are in tokens at 64-token chunks: scale for smaller chunks (the cuts
            // count chunks; one-token sequences stay)
            let scale = 64 / bt;
            let lens: Vec<usize> = case
                .lens
                .iter()
                .map(|&l| if l <= 1 { l } else { l / scale })
                .collect();
            let cuts: Vec<Vec<usize>> = case.cuts.iter().map(|c| c.to_vec()).collect();
            let cut_refs: Vec<&[usize]> = cuts.iter().map(Vec::as_slice).collect();
            let pieces = split_by_chunks(&lens, &cut_refs, bt);
            let dtype = dtypes[(i + round) % 4];
            let hv = heads[(i + round) % 4];
            let gates = GATES[(i + 2 * round) % 4];
            let cu = cu_of(&lens);
            let lay = Layout {
                b: if case.varlen { 1 } else { lens.len() },
                t: if case.varlen {
                    cu[cu.len() - 1] as usize
                } else {
                    lens[0]
                },
                h: hv.0,
                hv: hv.1,
                k: ks[(2 * i + round) % 3],
                v: [64, 100][j % 2],
                bt,
                cu: case.varlen.then(|| cu.clone()),
            };
            let bits = (j as u8).wrapping_mul(5);
            let p = FwdHParams {
                chunk_size: bt as i64,
                output_final_state: bits & 1 != 0 || round == 0,
                save_new_value: bits & 2 != 0 || round == 1,
                state_v_first: bits & 4 != 0,
            };
            let inp = realistic(&mut rng, &lay, gates, false);
            let h0 = (round != 2).then(|| random_state(&mut rng, &lay, p.state_v_first));
            let wide = if dtype == Dtype::F64 {
                Dtype::F64
            } else {
                Dtype::F32
            };
            let up = Uploaded::new(gpu, &inp, h0.as_ref(), dtype, wide, wide);
            let cu_arg = lay.cu.as_deref();
            let plan =
                FwdHSplitPlan::new(gpu, &up.tensors(), cu_arg, SplitMode::Pieces(&pieces), &p)
                    .unwrap();
            let n_seq = lens.len();
            assert!(
                plan.pieces().is_some() == (pieces.len() - 1 > n_seq),
                "{}: split used iff some sequence is cut",
                case.what
            );
            let got = launch(gpu, &plan, &up);
            let want = reference(&up, cu_arg, &p);
            let tag = format!("{} {lay:?} {dtype} {gates:?} {p:?} {pieces:?}", case.what);
            compare(&tag, &got, &want, split_threshold(dtype));
        }
    }
}

fn long_sequences_match_reference_and_the_serial_kernel(gpu: &Gpu) {
    let mut rng = Rng::new(0x5eed_1402);
    let mut long_tail = vec![131072];
    long_tail.extend([1024; 10]);
    let layouts = [
        vec![32768],
        vec![65536],
        vec![65536, 512, 256, 128],
        vec![32768, 256, 32768],
        long_tail,
    ];
    for (i, lens) in layouts.iter().enumerate() {
        for (j, heads) in [(1, 1), (4, 4), (4, 8)].into_iter().enumerate() {
            let cu = cu_of(lens);
            let lay = Layout {
                b: 1,
                t: cu[cu.len() - 1] as usize,
                h: heads.0,
                hv: heads.1,
                k: 128,
                v: 64,
                bt: 64,
                cu: Some(cu.clone()),
            };
            let p = FwdHParams {
                output_final_state: true,
                ..FwdHParams::default()
            };
            let gates = [Gates::Gk, Gates::G, Gates::Both][(i + j) % 3];
            let inp = realistic(&mut rng, &lay, gates, false);
            let h0 = random_state(&mut rng, &lay, false);
            let up = Uploaded::new(gpu, &inp, Some(&h0), Dtype::BF16, Dtype::F32, Dtype::F32);
            let plan =
                FwdHSplitPlan::new(gpu, &up.tensors(), Some(&cu), SplitMode::Split, &p).unwrap();
            assert!(plan.pieces().is_some(), "{lens:?} {heads:?}: forced split");
            let got = launch(gpu, &plan, &up);
            let tag = format!("long {:?} {heads:?} {gates:?}", &lens[..lens.len().min(4)]);
            compare(
                &format!("vs f64 {tag}"),
                &got,
                &reference(&up, Some(&cu), &p),
                1e-2,
            );
            let ser = serial(gpu, &up, Some(&cu), &p);
            compare(&format!("vs serial {tag}"), &got, &ser, 5e-3);
        }
    }
}

fn auto_policy_on_long_sequences_equals_the_serial_kernel(gpu: &Gpu) {
    let mut rng = Rng::new(0x5eed_1403);
    let mut split_seen = false;
    for (lens, heads, dtype) in [
        (vec![32768], (1, 1), Dtype::BF16),
        (vec![65536, 512, 256, 128], (4, 4), Dtype::F16),
        (vec![40960, 1024, 8192], (2, 4), Dtype::BF16),
        (vec![16384], (1, 1), Dtype::F32),
        (vec![8192; 4], (4, 4), Dtype::BF16),
        (vec![300, 0, 77], (2, 2), Dtype::BF16),
    ] {
        let cu = cu_of(&lens);
        let lay = Layout {
            b: 1,
            t: cu[cu.len() - 1] as usize,
            h: heads.0,
            hv: heads.1,
            k: 128,
            v: 128,
            bt: 64,
            cu: Some(cu.clone()),
        };
        let p = FwdHParams {
            output_final_state: true,
            ..FwdHParams::default()
        };
        let inp = realistic(&mut rng, &lay, Gates::Gk, false);
        let h0 = random_state(&mut rng, &lay, false);
        let up = Uploaded::new(gpu, &inp, Some(&h0), dtype, Dtype::F32, Dtype::F32);
        let plan = FwdHSplitPlan::new(gpu, &up.tensors(), Some(&cu), SplitMode::Auto, &p).unwrap();
        let d = plan.decision().expect("auto consults the policy");
        assert_eq!(plan.pieces().is_some(), d.auto().is_some());
        split_seen |= plan.pieces().is_some();
        let got = launch(gpu, &plan, &up);
        let ser = serial(gpu, &up, Some(&cu), &p);
        let tag = format!("auto {lens:?} {heads:?} {dtype} split {:?}", plan.pieces());
        if plan.pieces().is_some() {
            compare(&tag, &got, &ser, 5e-3);
        } else {
            assert_bit_identical(&format!("h {tag}"), &got.h, &ser.h);
            let (a, b) = (got.final_state.unwrap(), ser.final_state.unwrap());
            assert_bit_identical(&format!("final {tag}"), &a, &b);
        }
    }
    assert!(
        split_seen,
        "the policy split none of the long single-head cases"
    );
}

fn split_hundred_launches_are_bit_identical(gpu: &Gpu) {
    let mut rng = Rng::new(0x5eed_1404);
    let lens = [3000usize, 100, 2500];
    let cu = cu_of(&lens);
    let pieces = split_by_chunks(&lens, &[&[8, 8, 8], &[], &[5, 10]], 64);
    let lay = Layout {
        b: 1,
        t: 5600,
        h: 2,
        hv: 2,
        k: 128,
        v: 128,
        bt: 64,
        cu: Some(cu.clone()),
    };
    let p = FwdHParams {
        output_final_state: true,
        ..FwdHParams::default()
    };
    for dtype in [Dtype::BF16, Dtype::F32] {
        let inp = realistic(&mut rng, &lay, Gates::Gk, false);
        let h0 = random_state(&mut rng, &lay, false);
        let up = Uploaded::new(gpu, &inp, Some(&h0), dtype, Dtype::F32, Dtype::F32);
        let plan = FwdHSplitPlan::new(
            gpu,
            &up.tensors(),
            Some(&cu),
            SplitMode::Pieces(&pieces),
            &p,
        )
        .unwrap();
        let mut ws = plan.alloc_workspace(gpu).unwrap();
        let mut o = plan.alloc_outputs(gpu).unwrap();
        let mut first: Option<Got> = None;
        for i in 0..100 {
            poison_all(gpu, &mut o);
            plan.run(gpu, &up.tensors(), &mut ws, &mut o).unwrap();
            let got = fetch(gpu, &o);
            match &first {
                None => first = Some(got),
                Some(f) => {
                    let tag = format!("{dtype} launch {i}");
                    assert_bit_identical(&format!("h {tag}"), &got.h, &f.h);
                    let (a, b) = (got.v_new.as_ref().unwrap(), f.v_new.as_ref().unwrap());
                    assert_bit_identical(&format!("v_new {tag}"), a, b);
                    let (a, b) = (got.final_state.unwrap(), f.final_state.as_ref().unwrap());
                    assert_bit_identical(&format!("final {tag}"), &a, b);
                }
            }
        }
    }
}

fn bad_splits_are_typed_errors_naming_the_argument(gpu: &Gpu) {
    let mut rng = Rng::new(0x5eed_1405);
    let cu = vec![0i64, 300, 500];
    let lay = Layout {
        b: 1,
        t: 500,
        h: 1,
        hv: 1,
        k: 64,
        v: 32,
        bt: 64,
        cu: Some(cu.clone()),
    };
    let inp = small_random(&mut rng, &lay, Gates::Gk);
    let up = Uploaded::new(gpu, &inp, None, Dtype::BF16, Dtype::F32, Dtype::F32);
    let p = FwdHParams::default();
    let bad: [(&str, Vec<i64>); 7] = [
        ("misaligned inner boundary", vec![0, 100, 300, 500]),
        ("piece crossing a sequence boundary", vec![0, 256, 384, 500]),
        ("missing sequence boundary", vec![0, 128, 500]),
        ("empty piece inside a sequence", vec![0, 128, 128, 300, 500]),
        ("wrong last value", vec![0, 300, 499]),
        ("too long", vec![0, 300, 500, 500]),
        ("not starting at 0", vec![64, 300, 500]),
    ];
    for (what, pieces) in bad {
        let e = FwdHSplitPlan::new(
            gpu,
            &up.tensors(),
            Some(&cu),
            SplitMode::Pieces(&pieces),
            &p,
        )
        .unwrap_err();
        match e {
            GpuError::Input(e) => assert_eq!(e.arg, "subseq_cu_seqlens", "{what}: {e}"),
            other => panic!("{what}: not a typed input error: {other}"),
        }
    }
    // a workspace of another plan
    let good = vec![0i64, 128, 300, 500];
    let plan =
        FwdHSplitPlan::new(gpu, &up.tensors(), Some(&cu), SplitMode::Pieces(&good), &p).unwrap();
    let other = FwdHSplitPlan::new(gpu, &up.tensors(), Some(&cu), SplitMode::Serial, &p).unwrap();
    let mut ws = other.alloc_workspace(gpu).unwrap();
    let mut o = plan.alloc_outputs(gpu).unwrap();
    match plan.run(gpu, &up.tensors(), &mut ws, &mut o).unwrap_err() {
        GpuError::Input(e) => assert_eq!(e.arg, "workspace"),
        other => panic!("workspace: {other}"),
    }
    // section 2's checks still apply
    let mut t = up.tensors();
    t.w = &up.u;
    match FwdHSplitPlan::new(gpu, &t, Some(&cu), SplitMode::Auto, &p).unwrap_err() {
        GpuError::Input(e) => assert_eq!(e.arg, "w"),
        other => panic!("w: {other}"),
    }
}

gpu_tests!(
    explicit_splits_match_reference,
    long_sequences_match_reference_and_the_serial_kernel,
    auto_policy_on_long_sequences_equals_the_serial_kernel,
    split_hundred_launches_are_bit_identical,
    bad_splits_are_typed_errors_naming_the_argument
);
