//! `chunk_gated_delta_rule_fwd_h`, `fwd_h_pre_scan`, `fwd_h_merge` and
//! `chunk_gated_delta_rule_fwd_h_split` (`conformance/spec/ops-delta-rule.md` §2–§5) on random
//! realistic inputs (f64 unless stated).

mod delta_util;

use attn_reference::delta::{
    auto_subseq_cu_seqlens, chunk_gated_delta_rule_fwd_h, chunk_gated_delta_rule_fwd_h_split,
    fwd_h_merge, fwd_h_pre_scan, validate_chunk_gated_delta_rule_fwd_h_split, FwdHMergeInputs,
    FwdHMergeParams, FwdHPreScanParams, FwdHSplitInputs,
};
use delta_util::{
    assert_close, assert_same_outputs, bt, fwd_h_case, mode, params, random_split, transpose_state,
    Case, GateMode, Rng,
};
use ndarray::{s, Array2, Array4, Array5};
use proptest::prelude::*;

/// A random case (see [`delta_util::cases`]): sequences up to 150 tokens, `K, V <= 24`.
fn case() -> impl Strategy<Value = Case> {
    delta_util::cases(150, 24)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// `conformance/spec/ops-delta-rule.md` §3.6: `M · S0 + b` equals section 2's final state from
    /// `initial_state = S0` (f64, 1e-10); an empty (sub-)sequence summarises to `[0 | I]`.
    #[test]
    fn pre_scan_summary_is_affine_exit_map(c in case(), m in mode(), bt in bt()) {
        let fc = fwd_h_case(&c, m, bt);
        let hm = fwd_h_pre_scan(&fc.inputs(&c, None), &FwdHPreScanParams { chunk_size: bt as i64 }).unwrap().hm;
        let run = chunk_gated_delta_rule_fwd_h(&fc.inputs(&c, Some(&c.h0)), &params(bt, false)).unwrap();
        let fs = run.final_state.unwrap();
        for (n, &(_, bos, eos)) in c.seqs().iter().enumerate() {
            for hv in 0..c.hv {
                let b = hm.slice(s![n, hv, .., ..c.vd]);
                let mm = hm.slice(s![n, hv, .., c.vd..]);
                if bos == eos {
                    prop_assert!(b.iter().all(|&x| x == 0.0));
                    prop_assert_eq!(mm.to_owned(), Array2::<f64>::eye(c.kd));
                }
                let exit = mm.dot(&c.h0.slice(s![n, hv, .., ..])) + b;
                assert_close(&exit, &fs.slice(s![n, hv, .., ..]).to_owned(), 1e-10, "M S0 + b");
            }
        }
    }

    /// `conformance/spec/ops-delta-rule.md` §5.3: pre-scan + merge + fwd_h on random chunk-aligned
    /// split points equals the unsplit section 2 (f64, 1e-10), several split sequences in one batch
    /// included.
    #[test]
    fn split_equals_unsplit(c in case(), m in mode(), bt in bt(), p in 0.0f64..1.0, v_first: bool, h0: bool, seed: u64) {
        let fc = fwd_h_case(&c, m, bt);
        let h0t = h0.then(|| if v_first { transpose_state(c.h0.view()) } else { c.h0.clone() });
        let inp = fc.inputs(&c, h0t.as_ref());
        let split = random_split(&c, bt, p, &mut Rng::new(seed));
        let prm = params(bt, v_first);
        let whole = chunk_gated_delta_rule_fwd_h(&inp, &prm).unwrap();
        let parts = chunk_gated_delta_rule_fwd_h_split(
            &FwdHSplitInputs { fwd_h: inp.clone(), subseq_cu_seqlens: Some(&split), warmup_chunks: None }, &prm).unwrap();
        assert_same_outputs(&parts, &whole, 1e-10);
        // and with the automatic policy (which splits nothing this short)
        let auto = chunk_gated_delta_rule_fwd_h_split(&FwdHSplitInputs { fwd_h: inp, subseq_cu_seqlens: None, warmup_chunks: None }, &prm).unwrap();
        assert_same_outputs(&auto, &whole, 1e-10);
    }

    /// `state_v_first` equals the transposed key-first result
    /// (`conformance/spec/ops-delta-rule.md` §2.8; f64, 1e-12).
    #[test]
    fn fwd_h_state_v_first_is_the_transpose(c in case(), m in mode(), bt in bt()) {
        let fc = fwd_h_case(&c, m, bt);
        let h0t = transpose_state(c.h0.view());
        let kf = chunk_gated_delta_rule_fwd_h(&fc.inputs(&c, Some(&c.h0)), &params(bt, false)).unwrap();
        let vf = chunk_gated_delta_rule_fwd_h(&fc.inputs(&c, Some(&h0t)), &params(bt, true)).unwrap();
        let ht: Array5<f64> = vf.h.permuted_axes([0, 1, 2, 4, 3]).as_standard_layout().into_owned();
        assert_close(&ht, &kf.h, 1e-12, "h");
        assert_close(vf.v_new.as_ref().unwrap(), kf.v_new.as_ref().unwrap(), 1e-12, "v_new");
        assert_close(&transpose_state(vf.final_state.as_ref().unwrap().view()), kf.final_state.as_ref().unwrap(), 1e-12, "final_state");
    }

    /// f32 against the f64 oracle within the float32 thresholds
    /// (`conformance/spec/ops-delta-rule.md` §2.7: 1e-5).
    #[test]
    fn fwd_h_f32_within_float32_threshold(c in case(), m in mode(), bt in bt()) {
        // f32 inputs, and the same values widened for the f64 oracle (input rounding not counted)
        let fc = fwd_h_case(&c, m, bt);
        let f = |x: &Array4<f64>| x.mapv(|v| v as f32);
        let (k, w, u, h0) = (f(&fc.k), f(&fc.w), f(&fc.u), f(&c.h0));
        let g = fc.g.as_ref().map(|x| x.mapv(|v| v as f32));
        let gk = fc.gk.as_ref().map(f);
        let wide = |x: &Array4<f32>| x.mapv(f64::from);
        let (k64, w64, u64_, h064) = (wide(&k), wide(&w), wide(&u), wide(&h0));
        let g64 = g.as_ref().map(|x| x.mapv(f64::from));
        let gk64 = gk.as_ref().map(wide);
        let mut i64in = attn_reference::delta::FwdHInputs::new(k64.view(), w64.view(), u64_.view());
        i64in.g = g64.as_ref().map(|x| x.view());
        i64in.gk = gk64.as_ref().map(|x| x.view());
        i64in.initial_state = Some(h064.view());
        i64in.cu_seqlens = c.cu();
        let r64 = chunk_gated_delta_rule_fwd_h(&i64in, &params(bt, false)).unwrap();
        let mut i32in = attn_reference::delta::FwdHInputs::new(k.view(), w.view(), u.view());
        i32in.g = g.as_ref().map(|x| x.view());
        i32in.gk = gk.as_ref().map(|x| x.view());
        i32in.initial_state = Some(h0.view());
        i32in.cu_seqlens = c.cu();
        let r32 = chunk_gated_delta_rule_fwd_h(&i32in, &params(bt, false)).unwrap();
        assert_close(&r32.h.mapv(f64::from), &r64.h, 1e-5, "h");
        assert_close(&r32.v_new.unwrap().mapv(f64::from), r64.v_new.as_ref().unwrap(), 1e-5, "v_new");
        assert_close(&r32.final_state.unwrap().mapv(f64::from), r64.final_state.as_ref().unwrap(), 1e-5, "final_state");
    }

    /// `conformance/spec/ops-delta-rule.md` §4.4/§4.8: the merge chain against a direct fold, on
    /// random `M = I + 0.1·randn`, `b = randn`, chains of 0 to 40 summaries per sequence, with
    /// `state_v_first` equal to the transposed result (f64, 1e-12).
    #[test]
    fn merge_is_the_prefix_chain(seed: u64, counts in prop::collection::vec(0usize..=40, 1..4), hv in 1usize..=2, kd in 1usize..=12, vd in 1usize..=12, h0: bool) {
        let mut rng = Rng::new(seed);
        let s_total: usize = counts.iter().sum();
        let mut hm = rng.randn((s_total, hv, kd, vd + kd));
        for j in 0..s_total {
            for h in 0..hv {
                let mut mm = hm.slice_mut(s![j, h, .., vd..]);
                mm *= 0.1;
                mm += &Array2::<f64>::eye(kd);
            }
        }
        let mut offs = vec![0i64];
        for &c in &counts {
            offs.push(offs.last().unwrap() + c as i64);
        }
        let init = rng.randn((counts.len(), hv, kd, vd));
        let init_t = transpose_state(init.view());
        let run = |vf: bool| fwd_h_merge(
            &FwdHMergeInputs { hm: hm.view(), subseq_offsets: &offs, initial_state: h0.then(|| if vf { init_t.view() } else { init.view() }) },
            &FwdHMergeParams { state_v_first: vf, output_final_state: true },
        ).unwrap();
        let kf = run(false);
        let vf = run(true);
        for (n, w) in offs.windows(2).enumerate() {
            for h in 0..hv {
                let mut x = if h0 { init.slice(s![n, h, .., ..]).to_owned() } else { Array2::zeros((kd, vd)) };
                for j in w[0] as usize..w[1] as usize {
                    assert_close(&kf.initial_states.slice(s![j, h, .., ..]).to_owned(), &x, 1e-12, "initial_states");
                    x = hm.slice(s![j, h, .., vd..]).dot(&x) + hm.slice(s![j, h, .., ..vd]);
                }
                assert_close(&kf.final_state.as_ref().unwrap().slice(s![n, h, .., ..]).to_owned(), &x, 1e-12, "final_state");
            }
        }
        assert_close(&transpose_state(vf.initial_states.view()), &kf.initial_states, 1e-12, "initial_states (v-first)");
        assert_close(&transpose_state(vf.final_state.as_ref().unwrap().view()), kf.final_state.as_ref().unwrap(), 1e-12, "final_state (v-first)");
    }
}

/// `conformance/spec/ops-delta-rule.md` §5.8: every chunk its own piece (more than FLA's cap of
/// 32), two and three split sequences in one batch, an unsplit one, zero-length and one-token
/// sequences.
#[test]
fn split_into_many_pieces_across_several_sequences() {
    let layouts: [&[i64]; 3] = [
        &[0, 600, 610, 1250],
        &[0, 0, 700, 701, 701, 1400, 1500],
        &[0, 1, 530, 1100, 1630],
    ];
    for (seed, cu) in layouts.iter().enumerate() {
        for (m, bt) in [
            (GateMode::Gdn, 16usize),
            (GateMode::Kda, 16),
            (GateMode::Both, 16),
        ] {
            let c = Case::build(seed as u64 + 40, Some(cu.to_vec()), 1, 0, 1, 2, 12, 10);
            let fc = fwd_h_case(&c, m, bt);
            let inp = fc.inputs(&c, Some(&c.h0));
            let split = random_split(&c, bt, 1.0, &mut Rng::new(1));
            let pieces_per_seq: Vec<usize> = c
                .seqs()
                .iter()
                .map(|&(_, b, e)| (e - b).div_ceil(bt))
                .collect();
            assert!(
                pieces_per_seq.iter().filter(|&&p| p > 32).count() >= 2,
                "{pieces_per_seq:?}"
            );
            let prm = params(bt, false);
            let whole = chunk_gated_delta_rule_fwd_h(&inp, &prm).unwrap();
            let parts = chunk_gated_delta_rule_fwd_h_split(
                &FwdHSplitInputs {
                    fwd_h: inp,
                    subseq_cu_seqlens: Some(&split),
                    warmup_chunks: None,
                },
                &prm,
            )
            .unwrap();
            assert_same_outputs(&parts, &whole, 1e-10);
        }
    }
}

/// `conformance/spec/ops-delta-rule.md` §5.4/§5.8: the automatic policy splits a long sequence when
/// the batch is small (and the result is unchanged), and splits nothing when the batch already
/// fills the device.
#[test]
fn auto_policy_splits_long_sequences_only_when_useful() {
    let bt = 16usize;
    let cu = vec![0i64, 5000, 5100];
    let c = Case::build(3, Some(cu.clone()), 1, 0, 1, 1, 8, 8);
    let fc = fwd_h_case(&c, GateMode::Gdn, bt);
    let inp = fc.inputs(&c, Some(&c.h0));
    let prm = params(bt, false);
    let plan =
        validate_chunk_gated_delta_rule_fwd_h_split(&inp.shapes(), inp.cu_seqlens, None, &prm)
            .unwrap();
    // 313 chunks: min(32, 313 / 64) = 4 pieces for the long sequence, 1 for the short one
    assert_eq!(plan.subseq_offsets, vec![0, 4, 5]);
    let whole = chunk_gated_delta_rule_fwd_h(&inp, &prm).unwrap();
    let auto = chunk_gated_delta_rule_fwd_h_split(
        &FwdHSplitInputs {
            fwd_h: inp,
            subseq_cu_seqlens: None,
            warmup_chunks: None,
        },
        &prm,
    )
    .unwrap();
    assert_same_outputs(&auto, &whole, 1e-10);
    // a full device (66 sequences of HV = 1, V = 64 is >= 132 / 2 units): no split
    let lens = vec![20_000usize; 66];
    let p = auto_subseq_cu_seqlens(&lens, 1, 64, 64, 132).unwrap();
    assert_eq!(p.len(), 67);
    // the budget caps the pieces: 2 heads of V = 200 (8 units a piece) on 132 SMs = 16 pieces
    let p = auto_subseq_cu_seqlens(&[1 << 20, 1 << 20], 2, 200, 64, 132).unwrap();
    assert_eq!(p.len() - 1, 16);
}

/// `conformance/spec/ops-delta-rule.md` §1.5: `T = 0` and zero-length sequences are valid: no rows,
/// no chunks, and every final state equals the initial state.
#[test]
fn zero_tokens_pass_the_initial_state_through() {
    let mut rng = Rng::new(11);
    let h0: Array4<f64> = rng.randn((2, 2, 5, 3));
    for (b, cu) in [(2usize, None), (1, Some(vec![0i64, 0, 0]))] {
        let (k, w, u) = (
            Array4::<f64>::zeros((b, 0, 1, 5)),
            Array4::<f64>::zeros((b, 0, 2, 5)),
            Array4::<f64>::zeros((b, 0, 2, 3)),
        );
        let mut inp = attn_reference::delta::FwdHInputs::new(k.view(), w.view(), u.view());
        inp.initial_state = Some(h0.view());
        inp.cu_seqlens = cu.as_deref();
        let out = chunk_gated_delta_rule_fwd_h(&inp, &params(64, false)).unwrap();
        assert_eq!(out.h.shape(), &[b, 0, 2, 5, 3]);
        assert_eq!(out.v_new.as_ref().unwrap().shape(), &[b, 0, 2, 3]);
        assert_eq!(out.final_state.as_ref().unwrap(), &h0);
        let split = chunk_gated_delta_rule_fwd_h_split(
            &FwdHSplitInputs {
                fwd_h: inp.clone(),
                subseq_cu_seqlens: None,
                warmup_chunks: None,
            },
            &params(64, false),
        )
        .unwrap();
        assert_eq!(split.final_state.as_ref().unwrap(), &h0);
        inp.initial_state = None;
        let hm = fwd_h_pre_scan(&inp, &FwdHPreScanParams::default())
            .unwrap()
            .hm;
        for n in 0..2 {
            for hv in 0..2 {
                assert_eq!(
                    hm.slice(s![n, hv, .., 3..]).to_owned(),
                    Array2::<f64>::eye(5)
                );
                assert!(hm.slice(s![n, hv, .., ..3]).iter().all(|&x| x == 0.0));
            }
        }
        let q = Array4::<f64>::zeros((b, 0, 1, 5));
        let g = Array4::<f64>::zeros((b, 0, 2, 5));
        let beta = ndarray::Array3::<f64>::zeros((b, 0, 2));
        let mut kin = attn_reference::delta::KdaFwdInputs::new(
            q.view(),
            q.view(),
            u.view(),
            g.view(),
            beta.view(),
        );
        kin.initial_state = Some(h0.view());
        kin.cu_seqlens = cu.as_deref();
        let kp = attn_reference::delta::KdaFwdParams {
            output_final_state: true,
            ..Default::default()
        };
        for r in [
            attn_reference::delta::kda_fwd(&kin, &kp).unwrap(),
            attn_reference::delta::kda_fwd_chunked(&kin, &kp).unwrap(),
        ] {
            assert_eq!(r.o.shape(), &[b, 0, 2, 3]);
            assert_eq!(r.final_state.as_ref().unwrap(), &h0);
        }
    }
}
