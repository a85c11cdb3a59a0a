//! Registry entries of the delta-rule ops against `conformance/spec/ops-delta-rule.md`: output
//! classes and thresholds by comparison class (1.6, 2.7, 3.5, 4.7, 5.7, 6.8, 7.7, 8.8, "long"),
//! `hm` compared as `hm.b` and `hm.M`, and bad dtypes refused by the runners.

mod common;

use attn_conformance::compare::Rule;
use attn_conformance::verify::{verify_case, Selection};
use attn_conformance::{find, OpSpec, Params, Problem, Tensor, Tensors};
use attn_reference::{Dtype, DtypeClass, ErrorKind};
use ndarray::{ArrayD, IxDyn};
use rstest::rstest;
use serde_json::{json, Value};

fn zeros(shape: &[usize], dtype: Dtype) -> Tensor {
    Tensor::from_f64(&ArrayD::zeros(IxDyn(shape)), dtype)
}

/// The registry entry of `op`, `inputs` by name, and the default parameters.
fn call(op: &str, inputs: &[(&str, Tensor)]) -> (&'static OpSpec, Tensors, Params) {
    let spec = find(op).unwrap();
    let inputs: Tensors = inputs
        .iter()
        .map(|(n, t)| (n.to_string(), t.clone()))
        .collect();
    let p = Params::resolve(op, spec.params, json!({}).as_object().unwrap()).unwrap();
    (spec, inputs, p)
}

/// `(class, rule)` of output `out` of `op` for a candidate of `class`.
fn rule(op: &str, inputs: &[(&str, Tensor)], out: &str, class: DtypeClass) -> (DtypeClass, Rule) {
    let (spec, inputs, p) = call(op, inputs);
    let o = spec.output(out).unwrap();
    (
        (o.class)(&inputs, &p).unwrap(),
        (o.rule)(&inputs, &p, class),
    )
}

/// The rule of part `part` of output `out`.
fn part_rule(
    op: &str,
    inputs: &[(&str, Tensor)],
    out: &str,
    part: &str,
    class: DtypeClass,
) -> Rule {
    let (spec, inputs, p) = call(op, inputs);
    let pt = spec
        .output(out)
        .unwrap()
        .parts
        .iter()
        .find(|p| p.name == part)
        .unwrap();
    (pt.rule)(&inputs, &p, class)
}

/// The sequence axis of a row's inputs.
#[derive(Debug, Clone, Copy)]
enum Seq {
    /// One sequence of `T` tokens.
    T(usize),
    /// Varlen: `cu_seqlens` as given, `T` its last entry.
    Varlen(&'static [i64]),
    /// No sequence axis (`fwd_h_merge` takes `hm` [2, 1, 4, 7]).
    NoT,
}
use Seq::*;

/// Zero inputs of `op` in `dtype` (K = 4, V = 3, one head).
fn inputs(op: &str, dtype: Dtype, seq: Seq) -> Vec<(&'static str, Tensor)> {
    let t = match seq {
        T(t) => t,
        Varlen(cu) => *cu.last().unwrap() as usize,
        NoT => 0,
    };
    let mut v = match op {
        "fwd_h_merge" => vec![("hm", zeros(&[2, 1, 4, 7], dtype))],
        "chunk_gated_delta_rule_fwd_h"
        | "fwd_h_pre_scan"
        | "chunk_gated_delta_rule_fwd_h_split" => {
            vec![
                ("k", zeros(&[1, t, 1, 4], dtype)),
                ("u", zeros(&[1, t, 1, 3], dtype)),
            ]
        }
        _ => vec![
            ("q", zeros(&[1, t, 1, 4], dtype)),
            ("k", zeros(&[1, t, 1, 4], dtype)),
            ("v", zeros(&[1, t, 1, 3], dtype)),
        ],
    };
    if let Varlen(cu) = seq {
        v.push(("cu_seqlens", common::idx(cu, Dtype::I32)));
    }
    v
}

use Dtype::{BF16, F16, F32, F64};
use DtypeClass::{Float32, Float64, Half};

/// One spec threshold per row: output (or part, `hm.b`) `out` of `op` on `dtype` inputs, compared
/// for a candidate of class `candidate`, has class `class` and threshold `threshold`.
#[rustfmt::skip]
#[rstest]
//     op                                    dtype T / varlen                out               candidate class    threshold
// section 2.7
#[case("chunk_gated_delta_rule_fwd_h",       BF16, T(8),                     "h",              Half,     Half,    1e-2)]
#[case("chunk_gated_delta_rule_fwd_h",       BF16, T(8),                     "v_new",          Half,     Half,    1e-2)]
#[case("chunk_gated_delta_rule_fwd_h",       BF16, T(8),                     "final_state",    Float32,  Float32, 5e-3)]
#[case("chunk_gated_delta_rule_fwd_h",       BF16, T(5000),                  "final_state",    Float32,  Float32, 1e-2)]
#[case("chunk_gated_delta_rule_fwd_h",       BF16, Varlen(&[0, 2500, 5000]), "final_state",    Float32,  Float32, 5e-3)]
#[case("chunk_gated_delta_rule_fwd_h",       F32,  T(8),                     "h",              Float32,  Float32, 1e-5)]
#[case("chunk_gated_delta_rule_fwd_h",       F64,  T(8),                     "final_state",    Float64,  Float64, 1e-10)]
// a float64 candidate (the oracle on half inputs) is held to float64
#[case("chunk_gated_delta_rule_fwd_h",       BF16, T(8),                     "h",              Float64,  Half,    1e-10)]
// section 3.5: hm compared as hm.b / hm.M
#[case("fwd_h_pre_scan",                     BF16, T(8),                     "hm.b",           Float32,  Float32, 5e-3)]
#[case("fwd_h_pre_scan",                     BF16, T(8),                     "hm.M",           Float32,  Float32, 1e-2)]
#[case("fwd_h_pre_scan",                     BF16, T(5000),                  "hm.b",           Float32,  Float32, 1e-2)]
#[case("fwd_h_pre_scan",                     F32,  T(8),                     "hm.b",           Float32,  Float32, 1e-5)]
#[case("fwd_h_pre_scan",                     F32,  T(8),                     "hm.M",           Float32,  Float32, 1e-5)]
#[case("fwd_h_pre_scan",                     F64,  T(8),                     "hm.b",           Float64,  Float64, 1e-10)]
#[case("fwd_h_pre_scan",                     F64,  T(8),                     "hm.M",           Float64,  Float64, 1e-10)]
// section 4.7
#[case("fwd_h_merge",                        F32,  NoT,                      "initial_states", Float32,  Float32, 2e-5)]
#[case("fwd_h_merge",                        F32,  NoT,                      "final_state",    Float32,  Float32, 2e-5)]
#[case("fwd_h_merge",                        F64,  NoT,                      "final_state",    Float64,  Float64, 1e-10)]
// section 5.7
#[case("chunk_gated_delta_rule_fwd_h_split", BF16, T(8),                     "h",              Float32,  Half,    1e-2)]
#[case("chunk_gated_delta_rule_fwd_h_split", BF16, T(8),                     "v_new",          Float32,  Half,    1e-2)]
#[case("chunk_gated_delta_rule_fwd_h_split", BF16, T(8),                     "final_state",    Float32,  Float32, 1e-2)]
#[case("chunk_gated_delta_rule_fwd_h_split", F32,  T(8),                     "h",              Float32,  Float32, 5e-5)]
#[case("chunk_gated_delta_rule_fwd_h_split", F32,  T(8),                     "v_new",          Float32,  Float32, 5e-5)]
#[case("chunk_gated_delta_rule_fwd_h_split", F32,  T(8),                     "final_state",    Float32,  Float32, 5e-5)]
// `conformance/spec/ops-delta-rule.md` §7.7: the spec README's defaults by q, classes by k / v
#[case("kda_intra",                          BF16, T(8),                     "w",              Half,     Half,    5e-3)]
#[case("kda_intra",                          BF16, T(8),                     "u",              Half,     Half,    5e-3)]
#[case("kda_intra",                          BF16, T(8),                     "kg",             Half,     Half,    5e-3)]
#[case("kda_intra",                          BF16, T(8),                     "Aqk",            Half,     Half,    5e-3)]
#[case("kda_intra",                          BF16, T(8),                     "Akk",            Half,     Half,    5e-3)]
#[case("kda_intra",                          F32,  T(8),                     "w",              Float32,  Float32, 1e-5)]
#[case("kda_intra",                          F32,  T(8),                     "u",              Float32,  Float32, 1e-5)]
#[case("kda_intra",                          F32,  T(8),                     "kg",             Float32,  Float32, 1e-5)]
#[case("kda_intra",                          F32,  T(8),                     "Aqk",            Float32,  Float32, 1e-5)]
#[case("kda_intra",                          F32,  T(8),                     "Akk",            Float32,  Float32, 1e-5)]
// section 6.8
#[case("kda_fwd",                            F16,  T(8),                     "o",              Half,     Half,    5e-3)]
#[case("kda_fwd",                            F16,  T(4097),                  "o",              Half,     Half,    1e-2)]
#[case("kda_fwd",                            BF16, T(8),                     "final_state",    Float32,  Float32, 5e-3)]
#[case("kda_fwd",                            F32,  T(8),                     "final_state",    Float32,  Float32, 1e-5)]
#[case("kda_fwd",                            F64,  T(8),                     "o",              Float64,  Float64, 1e-10)]
// section 8.8
#[case("gdn_fwd",                            F16,  T(8),                     "o",              Half,     Half,    5e-3)]
#[case("gdn_fwd",                            F16,  T(4097),                  "o",              Half,     Half,    1e-2)]
#[case("gdn_fwd",                            BF16, T(8),                     "final_state",    Float32,  Float32, 5e-3)]
#[case("gdn_fwd",                            F32,  T(8),                     "final_state",    Float32,  Float32, 1e-5)]
#[case("gdn_fwd",                            F64,  T(8),                     "o",              Float64,  Float64, 1e-10)]
fn spec_thresholds(
    #[case] op: &str,
    #[case] dtype: Dtype,
    #[case] seq: Seq,
    #[case] out: &str,
    #[case] candidate: DtypeClass,
    #[case] class: DtypeClass,
    #[case] threshold: f64,
) {
    let inputs = inputs(op, dtype, seq);
    let got = match out.split_once('.') {
        None => rule(op, &inputs, out, candidate),
        Some((whole, _)) => (
            rule(op, &inputs, whole, candidate).0,
            part_rule(op, &inputs, whole, out, candidate),
        ),
    };
    assert_eq!(got, (class, Rule::Threshold(threshold)));
}

/// A changed `b` hides behind a near-identity `M` when `hm` is compared whole; `hm.b` catches it.
#[test]
fn hm_is_compared_as_b_and_m() {
    let mut case = common::valid_cases(17)
        .into_iter()
        .find(|c| c.op == "fwd_h_pre_scan")
        .unwrap();
    let rows = verify_case(&case, Selection::Cpu).unwrap();
    let names: Vec<&str> = rows.iter().map(|r| r.output.as_str()).collect();
    assert_eq!(names, ["hm.b", "hm.M"]);
    assert!(rows.iter().all(|r| r.pass));
    let hm = case.outputs.get_mut("hm").unwrap();
    let mut a = hm.widen_f64();
    let k = a.shape()[2];
    let v = a.shape()[3] - k;
    // scale b by 1 + 2e-2: past hm.b's half threshold (5e-3); M is unchanged
    a.slice_mut(ndarray::s![.., .., .., ..v])
        .mapv_inplace(|x| x * 1.02);
    *hm = Tensor::from_f64(&a, hm.dtype());
    let rows = verify_case(&case, Selection::Cpu).unwrap();
    assert!(!rows[0].pass, "{:?}", rows[0]);
    assert!(rows[1].pass, "{:?}", rows[1]);
}

#[test]
fn runners_refuse_mixed_main_dtypes_and_half_states() {
    for (op, arg, to) in [
        ("chunk_gated_delta_rule_fwd_h", "w", Dtype::BF16),
        ("kda_fwd", "v", Dtype::F64),
        ("gdn_fwd", "initial_state", Dtype::F16),
        ("kda_intra", "k", Dtype::F32),
    ] {
        let mut case = common::valid_cases(5)
            .into_iter()
            .find(|c| c.op == op)
            .unwrap();
        let x = case.inputs.get_mut(arg).unwrap();
        *x = Tensor::from_f64(&x.widen_f64(), to);
        match verify_case(&case, Selection::Cpu) {
            Err(Problem::Reference(e)) => {
                assert_eq!(
                    (e.kind, e.arg.as_str()),
                    (ErrorKind::Dtype, arg),
                    "{op}: {e}"
                )
            }
            other => panic!("{op}: expected a dtype error, got {other:?}"),
        }
    }
}

#[test]
fn params_of_the_delta_ops_have_the_spec_defaults() {
    let defaults = |op: &str| {
        let spec = find(op).unwrap();
        Value::Object(
            Params::resolve(op, spec.params, json!({}).as_object().unwrap())
                .unwrap()
                .as_map()
                .clone(),
        )
    };
    assert_eq!(
        defaults("chunk_gated_delta_rule_fwd_h"),
        json!({"chunk_size": 64, "output_final_state": false, "save_new_value": true, "state_v_first": false})
    );
    assert_eq!(defaults("fwd_h_pre_scan"), json!({"chunk_size": 64}));
    assert_eq!(
        defaults("fwd_h_merge"),
        json!({"state_v_first": false, "output_final_state": false})
    );
    assert_eq!(
        defaults("chunk_gated_delta_rule_fwd_h_split"),
        defaults("chunk_gated_delta_rule_fwd_h")
    );
    assert_eq!(
        defaults("kda_intra"),
        json!({"scale": null, "chunk_size": 64, "safe_gate": false})
    );
    assert_eq!(
        defaults("kda_fwd"),
        json!({
            "scale": null, "output_final_state": false, "use_qk_l2norm_in_kernel": false,
            "use_gate_in_kernel": false, "lower_bound": null, "use_beta_sigmoid_in_kernel": false,
            "allow_neg_eigval": false, "safe_gate": false, "chunk_size": 64, "state_v_first": false
        })
    );
    assert_eq!(
        defaults("gdn_fwd"),
        json!({"scale": null, "output_final_state": false, "use_qk_l2norm_in_kernel": false, "chunk_size": 64, "state_v_first": false})
    );
    // FLA's gdn options that are not part of this op are unknown parameters
    // (`conformance/spec/ops-delta-rule.md` §8.2)
    let spec = find("gdn_fwd").unwrap();
    assert!(Params::resolve(
        "gdn_fwd",
        spec.params,
        json!({"use_gate_in_kernel": true}).as_object().unwrap()
    )
    .is_err());
}

/// A case's `tolerance` may name a part (`hm.b`) or the whole output (`hm`, both parts); an
/// unknown name is refused.
#[test]
fn tolerance_keys_may_name_parts() {
    let mut case = common::valid_cases(19)
        .into_iter()
        .find(|c| c.op == "fwd_h_pre_scan")
        .unwrap();
    let hm = case.outputs.get_mut("hm").unwrap();
    let mut a = hm.widen_f64();
    let v = a.shape()[3] - a.shape()[2];
    a.slice_mut(ndarray::s![.., .., .., ..v])
        .mapv_inplace(|x| x * 1.02);
    *hm = Tensor::from_f64(&a, hm.dtype());
    let thresholds = |case: &attn_conformance::Case| {
        verify_case(case, Selection::Cpu)
            .unwrap()
            .iter()
            .map(|r| (r.output.clone(), r.threshold.unwrap(), r.pass))
            .collect::<Vec<_>>()
    };
    case.tolerance.insert("hm.b".into(), 0.05);
    assert_eq!(
        thresholds(&case),
        [("hm.b".into(), 0.05, true), ("hm.M".into(), 1e-2, true)]
    );
    case.tolerance.clear();
    case.tolerance.insert("hm".into(), 1e-3);
    assert_eq!(
        thresholds(&case),
        [("hm.b".into(), 1e-3, false), ("hm.M".into(), 1e-3, true)]
    );
    case.tolerance.clear();
    case.tolerance.insert("hm.x".into(), 1e-3);
    assert!(matches!(
        verify_case(&case, Selection::Cpu),
        Err(Problem::BadTolerance(_))
    ));
}

/// `conformance/spec/ops-delta-rule.md` §5.9: `warmup_chunks` is an optional `[S]` index input of
/// `chunk_gated_delta_rule_fwd_h_split`; the CPU runner applies it (int32 and int64 alike; warm-ups
/// reaching the sequence start give the exact result, a shorter one changes it) and refuses a bad
/// one by name; the GPU runner takes them too (checked against the reference by
/// `gpu/tests/fwd_h_split.rs`) and refuses `warmup_chunks` without `subseq_cu_seqlens` before any
/// device work.
#[test]
fn split_takes_warmup_chunks_on_the_cpu_and_the_gpu() {
    let op = "chunk_gated_delta_rule_fwd_h_split";
    let spec = find(op).unwrap();
    let w = spec
        .inputs
        .iter()
        .find(|i| i.name == "warmup_chunks")
        .unwrap();
    assert!(!w.required);
    assert_eq!((w.shape, w.dtype), ("[S]", "int32|int64"));
    assert_eq!(w.ranks(), vec![1]);
    let case = common::valid_cases(7)
        .into_iter()
        .find(|c| c.op == op)
        .unwrap();
    let p = Params::resolve(op, spec.params, &case.params).unwrap();
    // pieces: [0,5) | [5,5) | [5,21) [21,37) [37,40) at chunk_size 16
    let run = |warm: Option<(&[i64], Dtype)>| {
        let mut inputs = case.inputs.clone();
        if let Some((w, dt)) = warm {
            inputs.insert("warmup_chunks".into(), common::idx(w, dt));
        }
        (spec.cpu)(&inputs, &p)
    };
    let state = |t: &Tensors| t["final_state"].widen_f64();
    let exact = run(None).unwrap();
    assert_eq!(run(Some((&[0, 0, 0, 0, 0], Dtype::I32))).unwrap(), exact);
    // reaching the sequence start (c0 = 1 with w = 1; c0 = 2 with w = 5): exact up to rounding
    let reach = run(Some((&[0, 0, 0, 1, 5], Dtype::I64))).unwrap();
    let d = (&state(&reach) - &state(&exact))
        .iter()
        .fold(0.0f64, |m, x| m.max(x.abs()));
    assert!(d < 1e-12, "{d:e}");
    // a warm-up of 1 chunk on the last piece (c0 = 2) truncates: the last state changes
    let w32 = run(Some((&[0, 0, 0, 0, 1], Dtype::I32))).unwrap();
    let w64 = run(Some((&[0, 0, 0, 0, 1], Dtype::I64))).unwrap();
    assert_eq!(w32, w64);
    let d = (&state(&w32) - &state(&exact))
        .iter()
        .fold(0.0f64, |m, x| m.max(x.abs()));
    assert!(d > 1e-6, "the warm-up was ignored ({d:e})");
    // bad warm-ups name the argument
    for (bad, kind) in [
        (&[1i64, 0, 0, 0, 0][..], ErrorKind::Index),
        (&[0, 0, 1, 0, 0][..], ErrorKind::Index),
        (&[0, 0, 0, -2, 0][..], ErrorKind::Index),
        (&[0, 0, 0, 1][..], ErrorKind::Shape),
    ] {
        match run(Some((bad, Dtype::I64))) {
            Err(Problem::Reference(e)) => {
                assert_eq!((e.kind, e.arg.as_str()), (kind, "warmup_chunks"), "{e}")
            }
            other => panic!("{bad:?}: expected a warmup_chunks error, got {other:?}"),
        }
    }
    let mut no_split = case.inputs.clone();
    no_split.remove("subseq_cu_seqlens");
    no_split.insert("warmup_chunks".into(), common::idx(&[0, 0, 0], Dtype::I32));
    match (spec.cpu)(&no_split, &p) {
        Err(Problem::Reference(e)) => assert_eq!(
            (e.kind, e.arg.as_str()),
            (ErrorKind::Missing, "warmup_chunks")
        ),
        other => panic!("expected a warmup_chunks error, got {other:?}"),
    }
    // the GPU split refuses warm-ups without pieces (with or without a GPU: before device work)
    match (spec.gpu.unwrap())(&no_split, &p) {
        Err(Problem::Reference(e)) => assert_eq!(
            (e.kind, e.arg.as_str()),
            (ErrorKind::Missing, "warmup_chunks")
        ),
        other => panic!("expected the GPU to refuse warm-ups without pieces, got {other:?}"),
    }
    use attn_conformance::ops::delta::warmups_need_pieces;
    assert!(warmups_need_pieces(false, false).is_ok());
    assert!(warmups_need_pieces(true, true).is_ok());
    assert!(warmups_need_pieces(false, true).is_err());
}

/// §6.8 / §8.8: `o` and `final_state` of a forward of 1024 tokens or more are "long" (1e-2) under
/// long-memory gates (every per-step log decay in `[−1e-3, 0]`, KDA's in-kernel gate evaluated),
/// and not when one decay leaves that range, nor below 1024 tokens.
#[test]
fn long_memory_gates_make_a_forward_long() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(68);
    // (op, T, g range, in-kernel gate's A_log, whether one decay is put at −2e-3, threshold)
    type Row = (&'static str, usize, (f64, f64), Option<f64>, bool, f64);
    let rows: [Row; 8] = [
        ("gdn_fwd", 2053, (-1e-3, 0.0), None, false, 1e-2),
        ("gdn_fwd", 1023, (-1e-3, 0.0), None, false, 5e-3),
        ("gdn_fwd", 2053, (-1e-3, 0.0), None, true, 5e-3),
        ("kda_fwd", 1024, (-1e-3, 0.0), None, false, 1e-2),
        ("kda_fwd", 2053, (-0.5, 0.0), None, false, 5e-3),
        ("kda_fwd", 2053, (-1e-3, 0.0), None, true, 5e-3),
        // in-kernel gate: -exp(A_log) softplus(g) with g in [-1, 1]: about -6e-5 at A_log = -10,
        // -0.3 .. -1.3 at A_log = 0
        ("kda_fwd", 2053, (-1.0, 1.0), Some(-10.0), false, 1e-2),
        ("kda_fwd", 2053, (-1.0, 1.0), Some(0.0), false, 5e-3),
    ];
    for (op, t, (lo, hi), a_log, spike, want) in rows {
        let spec = find(op).unwrap();
        let (k, hv) = (4, 2);
        let g_shape = if op == "kda_fwd" {
            vec![1, t, hv, k]
        } else {
            vec![1, t, hv]
        };
        let mut g = ArrayD::from_shape_fn(IxDyn(&g_shape), |_| rng.random_range(lo..=hi));
        if spike {
            *g.iter_mut().nth(t / 2).unwrap() = -2e-3;
        }
        let mut inputs = inputs(op, Dtype::BF16, T(t));
        inputs.push(("g", Tensor::from_f64(&g, Dtype::F32)));
        let mut given = serde_json::Map::new();
        if let Some(a) = a_log {
            given.insert("use_gate_in_kernel".into(), json!(true));
            inputs.push((
                "A_log",
                Tensor::from_f64(&ArrayD::from_elem(IxDyn(&[hv]), a), Dtype::F32),
            ));
            inputs.push(("dt_bias", zeros(&[hv * k], Dtype::F32)));
        }
        let p = Params::resolve(op, spec.params, &given).unwrap();
        let inputs: Tensors = inputs
            .into_iter()
            .map(|(n, x)| (n.to_string(), x))
            .collect();
        for (out, class) in [
            ("o", DtypeClass::Half),
            ("final_state", DtypeClass::Float32),
        ] {
            let rule = (spec.output(out).unwrap().rule)(&inputs, &p, class);
            assert_eq!(
                rule,
                Rule::Threshold(want),
                "{op} {out} T {t} g in [{lo}, {hi}] A_log {a_log:?} spike {spike}"
            );
        }
    }
}
