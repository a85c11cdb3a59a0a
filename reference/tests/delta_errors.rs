//! Bad input of the delta-rule ops
//! (`conformance/spec/ops-delta-rule.md` §1.5, §2.6, §3.4, §4.6, §5.6, §6.7, §7.6, §8.7): every
//! case is refused before any work with the expected `ErrorKind` and the spec's argument name.

use attn_reference::delta::{
    auto_subseq_cu_seqlens, chunk_gated_delta_rule_fwd_h, fwd_h_merge, fwd_h_pre_scan,
    gdn_fwd_chunked, kda_fwd, kda_intra, subseq_offsets, validate_chunk_gated_delta_rule_fwd_h,
    validate_chunk_gated_delta_rule_fwd_h_split, validate_delta_dtypes, validate_fwd_h_merge,
    validate_fwd_h_pre_scan, validate_gdn_fwd, validate_kda_fwd, validate_kda_intra, DeltaDtypes,
    FwdHInputs, FwdHMergeInputs, FwdHMergeParams, FwdHMergeShapes, FwdHParams, FwdHPreScanParams,
    FwdHShapes, GdnFwdInputs, GdnFwdParams, GdnFwdShapes, Geometry, KdaFwdInputs, KdaFwdParams,
    KdaFwdShapes, KdaIntraInputs, KdaIntraParams, KdaIntraShapes,
};
use attn_reference::varlen::Seq;
use attn_reference::{Dtype, Error, ErrorKind};
use ndarray::{Array1, Array3, Array4};
use rstest::rstest;
use ErrorKind::{CuSeqlens, Dtype as DtypeK, Missing, Param, Shape};

/// B = 1, T = 10, H = 2, HV = 4, K = 8, V = 6, N = 1.
const B: usize = 1;
const T: usize = 10;
const H: usize = 2;
const HV: usize = 4;
const K: usize = 8;
const V: usize = 6;

fn expect(r: Result<impl std::fmt::Debug, Error>, kind: ErrorKind, arg: &str) {
    let e = r.expect_err("the call must be refused");
    assert_eq!((e.kind, e.arg.as_str()), (kind, arg), "{e}");
    assert!(!e.expected.is_empty() && !e.got.is_empty(), "{e}");
}

/// Owned shapes and options of a section 2 / 3 / 5 call.
#[derive(Clone)]
struct Fh {
    k: Vec<usize>,
    w: Vec<usize>,
    u: Vec<usize>,
    g: Option<Vec<usize>>,
    gk: Option<Vec<usize>>,
    h0: Option<Vec<usize>>,
    cu: Option<Vec<i64>>,
    p: FwdHParams,
    subseq: Option<Vec<i64>>,
}

impl Fh {
    fn ok() -> Fh {
        Fh {
            k: vec![B, T, H, K],
            w: vec![B, T, HV, K],
            u: vec![B, T, HV, V],
            g: Some(vec![B, T, HV]),
            gk: Some(vec![B, T, HV, K]),
            h0: Some(vec![1, HV, K, V]),
            cu: None,
            p: FwdHParams {
                chunk_size: 16,
                ..FwdHParams::default()
            },
            subseq: None,
        }
    }
    fn shapes(&self) -> FwdHShapes<'_> {
        FwdHShapes {
            k: &self.k,
            w: &self.w,
            u: &self.u,
            g: self.g.as_deref(),
            gk: self.gk.as_deref(),
            initial_state: self.h0.as_deref(),
        }
    }
}

#[rstest]
#[case::k_rank(|f: &mut Fh| f.k = vec![B, T, H], Shape, "k")]
#[case::k_batch_zero(|f: &mut Fh| f.k[0] = 0, Shape, "k")]
#[case::k_heads_zero(|f: &mut Fh| f.k[2] = 0, Shape, "k")]
#[case::k_dim_zero(|f: &mut Fh| f.k[3] = 0, Shape, "k")]
#[case::k_dim_257(|f: &mut Fh| { f.k[3] = 257; f.w[3] = 257; f.gk = None; f.h0 = None; }, Shape, "k")]
#[case::u_rank(|f: &mut Fh| f.u = vec![B, T, HV * V], Shape, "u")]
#[case::u_time(|f: &mut Fh| f.u[1] = T + 1, Shape, "u")]
#[case::u_heads_not_multiple(|f: &mut Fh| f.u[2] = 3, Shape, "u")]
#[case::u_heads_zero(|f: &mut Fh| f.u[2] = 0, Shape, "u")]
#[case::u_dim_zero(|f: &mut Fh| f.u[3] = 0, Shape, "u")]
#[case::w_rank(|f: &mut Fh| f.w = vec![B, T, HV], Shape, "w")]
#[case::w_heads(|f: &mut Fh| f.w[2] = H, Shape, "w")]
#[case::w_dim(|f: &mut Fh| f.w[3] = K + 1, Shape, "w")]
#[case::g_rank(|f: &mut Fh| f.g = Some(vec![B, T, HV, 1]), Shape, "g")]
#[case::g_heads(|f: &mut Fh| f.g = Some(vec![B, T, H]), Shape, "g")]
#[case::gk_dim(|f: &mut Fh| f.gk = Some(vec![B, T, HV, K - 1]), Shape, "gk")]
#[case::gk_rank(|f: &mut Fh| f.gk = Some(vec![B, T, HV]), Shape, "gk")]
#[case::chunk_128(|f: &mut Fh| f.p.chunk_size = 128, Param, "chunk_size")]
#[case::chunk_8(|f: &mut Fh| f.p.chunk_size = 8, Param, "chunk_size")]
#[case::chunk_48(|f: &mut Fh| f.p.chunk_size = 48, Param, "chunk_size")]
#[case::chunk_negative(|f: &mut Fh| f.p.chunk_size = -16, Param, "chunk_size")]
#[case::cu_short(|f: &mut Fh| f.cu = Some(vec![0]), CuSeqlens, "cu_seqlens")]
#[case::cu_start(|f: &mut Fh| f.cu = Some(vec![1, 10]), CuSeqlens, "cu_seqlens")]
#[case::cu_decreasing(|f: &mut Fh| f.cu = Some(vec![0, 6, 4, 10]), CuSeqlens, "cu_seqlens")]
#[case::cu_end(|f: &mut Fh| f.cu = Some(vec![0, 4, 9]), CuSeqlens, "cu_seqlens")]
#[case::cu_with_batch(|f: &mut Fh| { f.k[0] = 2; f.w[0] = 2; f.u[0] = 2; f.g = None; f.gk = None; f.cu = Some(vec![0, 10]); }, Shape, "cu_seqlens")]
#[case::h0_sequences(|f: &mut Fh| f.h0 = Some(vec![2, HV, K, V]), Shape, "initial_state")]
#[case::h0_rank(|f: &mut Fh| f.h0 = Some(vec![HV, K, V]), Shape, "initial_state")]
#[case::h0_v_first_layout(|f: &mut Fh| f.p.state_v_first = true, Shape, "initial_state")]
#[case::h0_varlen_count(|f: &mut Fh| f.cu = Some(vec![0, 3, 10]), Shape, "initial_state")]
fn fwd_h_refuses(#[case] m: fn(&mut Fh), #[case] kind: ErrorKind, #[case] arg: &str) {
    let mut f = Fh::ok();
    validate_chunk_gated_delta_rule_fwd_h(&f.shapes(), f.cu.as_deref(), &f.p).unwrap();
    m(&mut f);
    expect(
        validate_chunk_gated_delta_rule_fwd_h(&f.shapes(), f.cu.as_deref(), &f.p),
        kind,
        arg,
    );
    // the same checks refuse the split op (5.6) and, without the state, the pre-scan (3.4)
    expect(
        validate_chunk_gated_delta_rule_fwd_h_split(&f.shapes(), f.cu.as_deref(), None, &f.p),
        kind,
        arg,
    );
    if arg != "initial_state" {
        let mut s = f.shapes();
        s.initial_state = None;
        let pp = FwdHPreScanParams {
            chunk_size: f.p.chunk_size,
        };
        expect(validate_fwd_h_pre_scan(&s, f.cu.as_deref(), &pp), kind, arg);
    }
}

#[test]
fn fwd_h_compute_refuses_before_work() {
    let (k, w, u) = (
        Array4::<f64>::ones((1, 5, 1, 4)),
        Array4::<f64>::ones((1, 5, 1, 3)),
        Array4::<f64>::ones((1, 5, 1, 2)),
    );
    let inp = FwdHInputs::new(k.view(), w.view(), u.view());
    expect(
        chunk_gated_delta_rule_fwd_h(&inp, &FwdHParams::default()),
        Shape,
        "w",
    );
    let w = Array4::<f64>::ones((1, 5, 1, 4));
    let mut inp = FwdHInputs::new(k.view(), w.view(), u.view());
    let h0 = Array4::<f64>::zeros((1, 1, 4, 2));
    inp.initial_state = Some(h0.view());
    expect(
        fwd_h_pre_scan(&inp, &FwdHPreScanParams::default()),
        Missing,
        "initial_state",
    );
}

#[rstest]
#[case::misaligned_inner(vec![0, 10, 20, 30], vec![0, 16, 20, 30], "subseq_cu_seqlens")]
#[case::piece_crosses_sequence(vec![0, 20, 30], vec![0, 16, 24, 30], "subseq_cu_seqlens")]
#[case::missing_sequence_boundary(vec![0, 20, 30], vec![0, 16, 30], "subseq_cu_seqlens")]
#[case::empty_piece_in_sequence(vec![0, 20, 30], vec![0, 16, 16, 20, 30], "subseq_cu_seqlens")]
#[case::wrong_last_value(vec![0, 20, 30], vec![0, 16, 20, 31], "subseq_cu_seqlens")]
#[case::short_of_the_end(vec![0, 20, 30], vec![0, 16, 20], "subseq_cu_seqlens")]
#[case::trailing_pieces(vec![0, 20, 30], vec![0, 20, 30, 30], "subseq_cu_seqlens")]
#[case::not_from_zero(vec![0, 20, 30], vec![4, 20, 30], "subseq_cu_seqlens")]
#[case::too_short(vec![0, 30], vec![0], "subseq_cu_seqlens")]
#[case::zero_length_needs_one_empty_piece(vec![0, 0, 30], vec![0, 30], "subseq_cu_seqlens")]
#[case::zero_length_two_empty_pieces(vec![0, 0, 30], vec![0, 0, 0, 30], "subseq_cu_seqlens")]
fn split_refuses_invalid_pieces(#[case] cu: Vec<i64>, #[case] subseq: Vec<i64>, #[case] arg: &str) {
    let t = *cu.last().unwrap() as usize;
    let mut f = Fh::ok();
    f.k[1] = t;
    f.w[1] = t;
    f.u[1] = t;
    f.g = None;
    f.gk = None;
    f.h0 = None;
    f.cu = Some(cu);
    f.subseq = Some(subseq);
    expect(
        validate_chunk_gated_delta_rule_fwd_h_split(
            &f.shapes(),
            f.cu.as_deref(),
            f.subseq.as_deref(),
            &f.p,
        ),
        CuSeqlens,
        arg,
    );
}

#[rstest]
#[case::valid_with_empty_sequence(vec![0, 0, 30], vec![0, 0, 16, 30])]
#[case::valid_whole(vec![0, 20, 30], vec![0, 20, 30])]
fn split_accepts_valid_pieces(#[case] cu: Vec<i64>, #[case] subseq: Vec<i64>) {
    let t = *cu.last().unwrap() as usize;
    let mut f = Fh::ok();
    (f.k[1], f.w[1], f.u[1]) = (t, t, t);
    (f.g, f.gk, f.h0) = (None, None, None);
    let plan =
        validate_chunk_gated_delta_rule_fwd_h_split(&f.shapes(), Some(&cu), Some(&subseq), &f.p)
            .unwrap();
    assert_eq!(plan.subseq_cu_seqlens, subseq);
}

#[rstest]
#[case::hm_rank(vec![3, HV, K], None, vec![0, 3], false, Shape, "hm")]
#[case::hm_no_value_columns(vec![3, HV, K, K], None, vec![0, 3], false, Shape, "hm")]
#[case::hm_k_257(vec![3, HV, 257, 260], None, vec![0, 3], false, Shape, "hm")]
#[case::hm_heads_zero(vec![3, 0, K, K + V], None, vec![0, 3], false, Shape, "hm")]
#[case::offsets_short(vec![3, HV, K, K + V], None, vec![0], false, CuSeqlens, "subseq_offsets")]
#[case::offsets_start(vec![3, HV, K, K + V], None, vec![1, 3], false, CuSeqlens, "subseq_offsets")]
#[case::offsets_decreasing(vec![3, HV, K, K + V], None, vec![0, 2, 1, 3], false, CuSeqlens, "subseq_offsets")]
#[case::offsets_last(vec![3, HV, K, K + V], None, vec![0, 2], false, CuSeqlens, "subseq_offsets")]
#[case::h0_count(vec![3, HV, K, K + V], Some(vec![1, HV, K, V]), vec![0, 1, 3], false, Shape, "initial_state")]
#[case::h0_layout(vec![3, HV, K, K + V], Some(vec![1, HV, K, V]), vec![0, 3], true, Shape, "initial_state")]
#[case::h0_rank(vec![3, HV, K, K + V], Some(vec![HV, K, V]), vec![0, 3], false, Shape, "initial_state")]
fn merge_refuses(
    #[case] hm: Vec<usize>,
    #[case] h0: Option<Vec<usize>>,
    #[case] offs: Vec<i64>,
    #[case] v_first: bool,
    #[case] kind: ErrorKind,
    #[case] arg: &str,
) {
    let p = FwdHMergeParams {
        state_v_first: v_first,
        output_final_state: true,
    };
    let shapes = FwdHMergeShapes {
        hm: &hm,
        initial_state: h0.as_deref(),
    };
    expect(validate_fwd_h_merge(&shapes, &offs, &p), kind, arg);
}

#[test]
fn merge_compute_refuses_before_work() {
    let hm = Array4::<f64>::zeros((2, 1, 4, 6));
    let inp = FwdHMergeInputs {
        hm: hm.view(),
        subseq_offsets: &[0, 3],
        initial_state: None,
    };
    expect(
        fwd_h_merge(&inp, &FwdHMergeParams::default()),
        CuSeqlens,
        "subseq_offsets",
    );
}

/// Owned shapes of a `kda_fwd` / `kda_intra` / `gdn_fwd` call.
#[derive(Clone)]
struct Kd {
    q: Vec<usize>,
    k: Vec<usize>,
    v: Vec<usize>,
    g: Vec<usize>,
    beta: Vec<usize>,
    h0: Option<Vec<usize>>,
    a_log: Option<Vec<usize>>,
    dt_bias: Option<Vec<usize>>,
    cu: Option<Vec<i64>>,
    p: KdaFwdParams,
}

impl Kd {
    fn ok() -> Kd {
        Kd {
            q: vec![B, T, H, K],
            k: vec![B, T, H, K],
            v: vec![B, T, HV, V],
            g: vec![B, T, HV, K],
            beta: vec![B, T, HV],
            h0: Some(vec![1, HV, K, V]),
            a_log: None,
            dt_bias: None,
            cu: None,
            p: KdaFwdParams {
                chunk_size: 32,
                output_final_state: true,
                ..KdaFwdParams::default()
            },
        }
    }
    fn shapes(&self) -> KdaFwdShapes<'_> {
        KdaFwdShapes {
            q: &self.q,
            k: &self.k,
            v: &self.v,
            g: &self.g,
            beta: &self.beta,
            initial_state: self.h0.as_deref(),
            a_log: self.a_log.as_deref(),
            dt_bias: self.dt_bias.as_deref(),
        }
    }
    fn gated(mut self) -> Kd {
        self.p.use_gate_in_kernel = true;
        self.a_log = Some(vec![HV]);
        self.dt_bias = Some(vec![HV * K]);
        self
    }
}

#[rstest]
#[case::q_rank(|d: &mut Kd| d.q = vec![B, T, H], Shape, "q")]
#[case::q_k_257(|d: &mut Kd| { d.q[3] = 257; d.k[3] = 257; d.g[3] = 257; d.h0 = None; }, Shape, "q")]
#[case::k_differs_from_q(|d: &mut Kd| d.k[3] = K + 1, Shape, "k")]
#[case::v_batch(|d: &mut Kd| d.v[0] = 2, Shape, "v")]
#[case::v_heads(|d: &mut Kd| d.v[2] = 3, Shape, "v")]
#[case::v_dim_zero(|d: &mut Kd| d.v[3] = 0, Shape, "v")]
#[case::g_dim(|d: &mut Kd| d.g[3] = K - 1, Shape, "g")]
#[case::g_rank(|d: &mut Kd| d.g = vec![B, T, HV], Shape, "g")]
#[case::beta_heads(|d: &mut Kd| d.beta = vec![B, T, H], Shape, "beta")]
#[case::beta_rank(|d: &mut Kd| d.beta = vec![B, T, HV, 1], Shape, "beta")]
#[case::chunk_16(|d: &mut Kd| d.p.chunk_size = 16, Param, "chunk_size")]
#[case::chunk_128(|d: &mut Kd| d.p.chunk_size = 128, Param, "chunk_size")]
#[case::cu_end(|d: &mut Kd| d.cu = Some(vec![0, 11]), CuSeqlens, "cu_seqlens")]
#[case::h0_shape(|d: &mut Kd| d.h0 = Some(vec![1, HV, V, K]), Shape, "initial_state")]
#[case::gate_without_a_log_or_bound(|d: &mut Kd| { *d = d.clone().gated(); d.a_log = None; }, Missing, "A_log")]
#[case::a_log_shape(|d: &mut Kd| { *d = d.clone().gated(); d.a_log = Some(vec![H]); }, Shape, "A_log")]
#[case::dt_bias_shape(|d: &mut Kd| { *d = d.clone().gated(); d.dt_bias = Some(vec![HV]); }, Shape, "dt_bias")]
#[case::a_log_without_gate(|d: &mut Kd| d.a_log = Some(vec![HV]), Missing, "A_log")]
#[case::dt_bias_without_gate(|d: &mut Kd| d.dt_bias = Some(vec![HV * K]), Missing, "dt_bias")]
#[case::lower_bound_nan(|d: &mut Kd| { *d = d.clone().gated(); d.p.lower_bound = Some(f64::NAN); }, Param, "lower_bound")]
#[case::lower_bound_zero(|d: &mut Kd| { *d = d.clone().gated(); d.p.lower_bound = Some(0.0); }, Param, "lower_bound")]
#[case::lower_bound_positive(|d: &mut Kd| { *d = d.clone().gated(); d.p.lower_bound = Some(1.0); }, Param, "lower_bound")]
#[case::safe_gate_bound_too_low(|d: &mut Kd| { *d = d.clone().gated(); d.p.safe_gate = true; d.p.lower_bound = Some(-6.0); }, Param, "lower_bound")]
#[case::safe_gate_without_bound(|d: &mut Kd| { *d = d.clone().gated(); d.p.safe_gate = true; }, Param, "lower_bound")]
#[case::neg_eig_without_sigmoid(|d: &mut Kd| d.p.allow_neg_eigval = true, Param, "allow_neg_eigval")]
#[case::scale_inf(|d: &mut Kd| d.p.scale = Some(f64::INFINITY), Param, "scale")]
#[case::scale_nan(|d: &mut Kd| d.p.scale = Some(f64::NAN), Param, "scale")]
fn kda_fwd_refuses(#[case] m: fn(&mut Kd), #[case] kind: ErrorKind, #[case] arg: &str) {
    let mut d = Kd::ok();
    validate_kda_fwd(&d.shapes(), d.cu.as_deref(), &d.p).unwrap();
    validate_kda_fwd(&Kd::ok().gated().shapes(), None, &Kd::ok().gated().p).unwrap();
    m(&mut d);
    expect(
        validate_kda_fwd(&d.shapes(), d.cu.as_deref(), &d.p),
        kind,
        arg,
    );
}

#[rstest]
#[case::q_rank(|d: &mut Kd| d.q = vec![B, T, H], Shape, "q")]
#[case::k_differs_from_q(|d: &mut Kd| d.k[2] = H + 1, Shape, "k")]
#[case::v_time(|d: &mut Kd| d.v[1] = T - 1, Shape, "v")]
#[case::gk_heads(|d: &mut Kd| d.g[2] = H, Shape, "gk")]
#[case::beta_time(|d: &mut Kd| d.beta[1] = T + 1, Shape, "beta")]
#[case::chunk_16(|d: &mut Kd| d.p.chunk_size = 16, Param, "chunk_size")]
#[case::cu_decreasing(|d: &mut Kd| d.cu = Some(vec![0, 5, 4, 10]), CuSeqlens, "cu_seqlens")]
#[case::scale_nan(|d: &mut Kd| d.p.scale = Some(f64::NAN), Param, "scale")]
fn kda_intra_refuses(#[case] m: fn(&mut Kd), #[case] kind: ErrorKind, #[case] arg: &str) {
    let mut d = Kd::ok();
    m(&mut d);
    let shapes = KdaIntraShapes {
        q: &d.q,
        k: &d.k,
        v: &d.v,
        gk: &d.g,
        beta: &d.beta,
    };
    let p = KdaIntraParams {
        scale: d.p.scale,
        chunk_size: d.p.chunk_size,
        safe_gate: false,
    };
    expect(validate_kda_intra(&shapes, d.cu.as_deref(), &p), kind, arg);
}

#[rstest]
#[case::q_rank(|d: &mut Kd| d.q = vec![B, T, H, K, 1], Shape, "q")]
#[case::k_differs_from_q(|d: &mut Kd| d.k[1] = T + 1, Shape, "k")]
#[case::v_heads(|d: &mut Kd| d.v[2] = 5, Shape, "v")]
#[case::g_per_key(|d: &mut Kd| d.g = vec![B, T, HV, K], Shape, "g")]
#[case::g_heads(|d: &mut Kd| d.g = vec![B, T, H], Shape, "g")]
#[case::beta_heads(|d: &mut Kd| d.beta = vec![B, T, 1], Shape, "beta")]
#[case::chunk_128(|d: &mut Kd| d.p.chunk_size = 128, Param, "chunk_size")]
#[case::cu_start(|d: &mut Kd| d.cu = Some(vec![2, 10]), CuSeqlens, "cu_seqlens")]
#[case::h0_shape(|d: &mut Kd| d.h0 = Some(vec![2, HV, K, V]), Shape, "initial_state")]
#[case::scale_nan(|d: &mut Kd| d.p.scale = Some(f64::NEG_INFINITY), Param, "scale")]
fn gdn_fwd_refuses(#[case] m: fn(&mut Kd), #[case] kind: ErrorKind, #[case] arg: &str) {
    let mut d = Kd::ok();
    d.g = vec![B, T, HV];
    m(&mut d);
    let shapes = GdnFwdShapes {
        q: &d.q,
        k: &d.k,
        v: &d.v,
        g: &d.g,
        beta: &d.beta,
        initial_state: d.h0.as_deref(),
    };
    let p = GdnFwdParams {
        scale: d.p.scale,
        chunk_size: d.p.chunk_size,
        ..GdnFwdParams::default()
    };
    expect(validate_gdn_fwd(&shapes, d.cu.as_deref(), &p), kind, arg);
}

#[test]
fn forwards_refuse_before_work() {
    let q = Array4::<f64>::ones((1, 4, 1, 3));
    let v = Array4::<f64>::ones((1, 4, 2, 2));
    let g = Array4::<f64>::zeros((1, 4, 2, 3));
    let gs = Array3::<f64>::zeros((1, 4, 2));
    let beta = Array3::<f64>::ones((1, 4, 2));
    let a_log = Array1::<f64>::zeros(2);
    let mut inp = KdaFwdInputs::new(q.view(), q.view(), v.view(), g.view(), beta.view());
    inp.a_log = Some(a_log.view());
    expect(kda_fwd(&inp, &KdaFwdParams::default()), Missing, "A_log");
    let gin = GdnFwdInputs::new(q.view(), q.view(), v.view(), gs.view(), beta.view());
    let p = GdnFwdParams {
        chunk_size: 8,
        ..GdnFwdParams::default()
    };
    expect(gdn_fwd_chunked(&gin, &p), Param, "chunk_size");
    let iin = KdaIntraInputs {
        q: q.view(),
        k: q.view(),
        v: v.view(),
        gk: g.view(),
        beta: gs.view(),
        cu_seqlens: Some(&[0, 5]),
    };
    expect(
        kda_intra(&iin, &KdaIntraParams::default()),
        CuSeqlens,
        "cu_seqlens",
    );
}

#[rstest]
#[case::main_mixed(vec![("k", Dtype::BF16), ("w", Dtype::F16)], vec![], vec![], vec![], "w")]
#[case::main_int(vec![("q", Dtype::I32)], vec![], vec![], vec![], "q")]
#[case::gate_int(vec![("k", Dtype::F32)], vec![("g", Dtype::I64)], vec![], vec![], "g")]
#[case::state_half(vec![("k", Dtype::F32)], vec![], vec![("initial_state", Dtype::BF16)], vec![], "initial_state")]
#[case::hm_int(vec![], vec![], vec![("hm", Dtype::I32)], vec![], "hm")]
#[case::index_float(vec![("k", Dtype::F32)], vec![], vec![], vec![("cu_seqlens", Dtype::F32)], "cu_seqlens")]
fn dtypes_refused(
    #[case] main: Vec<(&str, Dtype)>,
    #[case] float: Vec<(&str, Dtype)>,
    #[case] state: Vec<(&str, Dtype)>,
    #[case] index: Vec<(&str, Dtype)>,
    #[case] arg: &str,
) {
    let d = DeltaDtypes {
        main,
        float,
        state,
        index,
    };
    expect(validate_delta_dtypes(&d).map(|_| ()), DtypeK, arg);
}

#[test]
fn dtypes_accepted() {
    let d = DeltaDtypes {
        main: vec![("q", Dtype::BF16), ("k", Dtype::BF16), ("v", Dtype::BF16)],
        float: vec![("g", Dtype::F32), ("beta", Dtype::BF16)],
        state: vec![("initial_state", Dtype::F32)],
        index: vec![("cu_seqlens", Dtype::I32)],
    };
    validate_delta_dtypes(&d).unwrap();
}

/// The split helpers take the chunk size as `usize`: 0 is refused, never a division by zero.
#[rstest]
#[case::auto_split_chunk_0(|| auto_subseq_cu_seqlens(&[100, 5], HV, V, 0, 132).map(drop))]
#[case::offsets_chunk_0(|| subseq_offsets(&[0, 32, 64], &[(0, 64)], 0).map(drop))]
fn split_helpers_refuse_chunk_size_0(#[case] call: fn() -> Result<(), Error>) {
    expect(call(), Param, "chunk_size");
}

/// `Geometry`'s fields are public: its methods stay total on a hand-built (unvalidated) one.
#[rstest]
#[case::valid(2, 4, 16, 1, 3)]
#[case::no_key_heads(0, 4, 16, 0, 3)]
#[case::fewer_value_heads(4, 2, 16, 3, 3)]
#[case::chunk_size_0(2, 4, 0, 1, 40)]
fn geometry_methods_are_total(
    #[case] h: usize,
    #[case] hv: usize,
    #[case] bt: usize,
    #[case] kh_of_3: usize,
    #[case] nt: usize,
) {
    let seqs = vec![Seq {
        n: 0,
        batch: 0,
        bos: 0,
        eos: 40,
    }];
    let geo = Geometry {
        b: 1,
        t: 40,
        h,
        hv,
        k: K,
        v: V,
        bt,
        seqs,
    };
    assert_eq!(geo.kh(3), kh_of_3);
    assert_eq!((geo.nt(false), geo.nt(true)), (nt, nt));
    assert_eq!(geo.chunk_starts(true), vec![0, nt]);
}
