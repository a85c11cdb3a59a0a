//! Registry entries of the delta-rule ops against `ops-delta-rule.md`: output classes and
//! thresholds by comparison class (1.6, 2.7, 3.5, 4.7, 5.7, 6.8, 7.7, 8.8, "long"), `hm` compared
//! as `hm.b` and `hm.M`, and bad dtypes refused by the runners.

mod common;

use attn_conformance::compare::Rule;
use attn_conformance::verify::{verify_case, Selection};
use attn_conformance::{find, OpSpec, Params, Problem, Tensor, Tensors};
use attn_reference::{Dtype, DtypeClass, ErrorKind};
use ndarray::{ArrayD, IxDyn};
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

fn t(x: f64) -> Rule {
    Rule::Threshold(x)
}

#[test]
fn fwd_h_pre_scan_and_split_thresholds() {
    use DtypeClass::*;
    let k = |d, t: usize| {
        vec![
            ("k", zeros(&[1, t, 1, 4], d)),
            ("u", zeros(&[1, t, 1, 3], d)),
        ]
    };
    // section 2.7
    assert_eq!(
        rule(
            "chunk_gated_delta_rule_fwd_h",
            &k(Dtype::BF16, 8),
            "h",
            Half
        ),
        (Half, t(1e-2))
    );
    assert_eq!(
        rule(
            "chunk_gated_delta_rule_fwd_h",
            &k(Dtype::BF16, 8),
            "v_new",
            Half
        ),
        (Half, t(1e-2))
    );
    assert_eq!(
        rule(
            "chunk_gated_delta_rule_fwd_h",
            &k(Dtype::BF16, 8),
            "final_state",
            Float32
        ),
        (Float32, t(5e-3))
    );
    assert_eq!(
        rule(
            "chunk_gated_delta_rule_fwd_h",
            &k(Dtype::BF16, 5000),
            "final_state",
            Float32
        )
        .1,
        t(1e-2)
    );
    let mut varlen = k(Dtype::BF16, 5000);
    varlen.push(("cu_seqlens", common::idx(&[0, 2500, 5000], Dtype::I32)));
    assert_eq!(
        rule(
            "chunk_gated_delta_rule_fwd_h",
            &varlen,
            "final_state",
            Float32
        )
        .1,
        t(5e-3)
    );
    assert_eq!(
        rule(
            "chunk_gated_delta_rule_fwd_h",
            &k(Dtype::F32, 8),
            "h",
            Float32
        ),
        (Float32, t(1e-5))
    );
    assert_eq!(
        rule(
            "chunk_gated_delta_rule_fwd_h",
            &k(Dtype::F64, 8),
            "final_state",
            Float64
        ),
        (Float64, t(1e-10))
    );
    // a float64 candidate (the oracle on half inputs) is held to float64
    assert_eq!(
        rule(
            "chunk_gated_delta_rule_fwd_h",
            &k(Dtype::BF16, 8),
            "h",
            Float64
        )
        .1,
        t(1e-10)
    );
    // section 3.5: hm.b / hm.M
    for (d, tb, tm) in [
        (Dtype::BF16, 5e-3, 1e-2),
        (Dtype::F32, 1e-5, 1e-5),
        (Dtype::F64, 1e-10, 1e-10),
    ] {
        let c = if d == Dtype::F64 { Float64 } else { Float32 };
        assert_eq!(
            part_rule("fwd_h_pre_scan", &k(d, 8), "hm", "hm.b", c),
            t(tb)
        );
        assert_eq!(
            part_rule("fwd_h_pre_scan", &k(d, 8), "hm", "hm.M", c),
            t(tm)
        );
        assert_eq!(rule("fwd_h_pre_scan", &k(d, 8), "hm", c).0, c);
    }
    assert_eq!(
        part_rule(
            "fwd_h_pre_scan",
            &k(Dtype::BF16, 5000),
            "hm",
            "hm.b",
            Float32
        ),
        t(1e-2)
    );
    // section 5.7
    for out in ["h", "v_new", "final_state"] {
        assert_eq!(
            rule(
                "chunk_gated_delta_rule_fwd_h_split",
                &k(Dtype::BF16, 8),
                out,
                Float32
            )
            .1,
            t(1e-2)
        );
        assert_eq!(
            rule(
                "chunk_gated_delta_rule_fwd_h_split",
                &k(Dtype::F32, 8),
                out,
                Float32
            )
            .1,
            t(5e-5)
        );
    }
}

#[test]
fn merge_intra_and_forward_thresholds() {
    use DtypeClass::*;
    // section 4.7
    let hm = |d| vec![("hm", zeros(&[2, 1, 4, 7], d))];
    assert_eq!(
        rule("fwd_h_merge", &hm(Dtype::F32), "initial_states", Float32),
        (Float32, t(2e-5))
    );
    assert_eq!(
        rule("fwd_h_merge", &hm(Dtype::F32), "final_state", Float32),
        (Float32, t(2e-5))
    );
    assert_eq!(
        rule("fwd_h_merge", &hm(Dtype::F64), "final_state", Float64),
        (Float64, t(1e-10))
    );
    // section 7.7: README defaults by q, classes by k / v
    let qkv = |d, t: usize| {
        vec![
            ("q", zeros(&[1, t, 1, 4], d)),
            ("k", zeros(&[1, t, 1, 4], d)),
            ("v", zeros(&[1, t, 1, 3], d)),
        ]
    };
    for out in ["w", "u", "kg", "Aqk", "Akk"] {
        assert_eq!(
            rule("kda_intra", &qkv(Dtype::BF16, 8), out, Half),
            (Half, t(5e-3))
        );
        assert_eq!(
            rule("kda_intra", &qkv(Dtype::F32, 8), out, Float32),
            (Float32, t(1e-5))
        );
    }
    // sections 6.8 and 8.8
    for op in ["kda_fwd", "gdn_fwd"] {
        assert_eq!(rule(op, &qkv(Dtype::F16, 8), "o", Half), (Half, t(5e-3)));
        assert_eq!(rule(op, &qkv(Dtype::F16, 4097), "o", Half).1, t(1e-2));
        assert_eq!(
            rule(op, &qkv(Dtype::BF16, 8), "final_state", Float32),
            (Float32, t(5e-3))
        );
        assert_eq!(
            rule(op, &qkv(Dtype::F32, 8), "final_state", Float32),
            (Float32, t(1e-5))
        );
        assert_eq!(
            rule(op, &qkv(Dtype::F64, 8), "o", Float64),
            (Float64, t(1e-10))
        );
    }
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
    // FLA's gdn options that are not part of this op are unknown parameters (spec 8.2)
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
