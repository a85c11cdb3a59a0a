//! The op registry against the spec: parameters validated per entry, output classes and
//! thresholds as the op files set them, and the CPU runner of every op exercised.

mod common;

use attn_conformance::compare::Rule;
use attn_conformance::{find, registry, Case, ParamType, Params, Tensor, Tensors, OPS};
use attn_reference::{Dtype, DtypeClass};
use ndarray::{ArrayD, IxDyn};
use serde_json::{json, Map, Value};
use std::collections::BTreeSet;

#[test]
fn every_op_has_a_valid_case_whose_runner_gives_exactly_its_outputs() {
    let cases = common::valid_cases(99);
    let covered: BTreeSet<_> = cases.iter().map(|c| c.op.as_str()).collect();
    let ops: BTreeSet<_> = OPS.iter().map(|o| o.id).collect();
    assert_eq!(
        covered, ops,
        "tests/common/mod.rs needs a valid case for every registered op"
    );
    for c in &cases {
        let spec = registry::spec_of(c).unwrap();
        let out = (spec.cpu)(&c.inputs, &registry::check(c).unwrap()).unwrap();
        // `<output>.<aux>` tensors (the index rule's `block_indices.scores`) are not outputs
        let names: BTreeSet<_> = out
            .keys()
            .map(String::as_str)
            .filter(|n| !n.contains('.'))
            .collect();
        let declared: BTreeSet<_> = spec.outputs.iter().map(|o| o.name).collect();
        assert_eq!(names, declared, "{}", c.op);
    }
}

fn wrong_value(ty: ParamType) -> Value {
    match ty {
        ParamType::Int => json!(1.5),
        ParamType::Bool => json!(1),
        ParamType::OptFloat | ParamType::OptInt => json!("0.5"),
        ParamType::Str(_) | ParamType::OptStr(_) => json!("no-such-choice"),
    }
}

#[test]
fn params_are_validated_per_entry() {
    for op in OPS {
        let required: Map<String, Value> = op
            .params
            .iter()
            .filter(|p| p.default.is_none())
            .map(|p| (p.name.to_string(), json!(16)))
            .collect();
        let p = Params::resolve(op.id, op.params, &required).unwrap();
        assert_eq!(
            p.as_map().len(),
            op.params.len(),
            "{}: every key filled",
            op.id
        );

        let mut unknown = required.clone();
        unknown.insert("not_a_param".into(), json!(0));
        let e = Params::resolve(op.id, op.params, &unknown)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`not_a_param`"), "{}: {e}", op.id);

        for spec in op.params {
            let mut wrong = required.clone();
            wrong.insert(spec.name.into(), wrong_value(spec.ty));
            let e = Params::resolve(op.id, op.params, &wrong)
                .unwrap_err()
                .to_string();
            assert!(e.contains(&format!("`{}`", spec.name)), "{}: {e}", op.id);
            if spec.default.is_none() {
                let mut missing = required.clone();
                missing.remove(spec.name);
                let e = Params::resolve(op.id, op.params, &missing)
                    .unwrap_err()
                    .to_string();
                assert!(e.contains(&format!("`{}`", spec.name)), "{}: {e}", op.id);
            }
        }
    }
}

#[test]
fn defaults_are_the_spec_s() {
    let defaults = |op: &str| -> Value {
        let spec = find(op).unwrap();
        let given: Map<String, Value> = spec
            .params
            .iter()
            .filter(|p| p.default.is_none())
            .map(|p| (p.name.to_string(), json!(64)))
            .collect();
        Value::Object(
            Params::resolve(op, spec.params, &given)
                .unwrap()
                .as_map()
                .clone(),
        )
    };
    assert_eq!(
        defaults("cumsum"),
        json!({"dim": -1, "reverse": false, "output_dtype": null})
    );
    assert_eq!(
        defaults("chunk_local_cumsum"),
        json!({"chunk_size": 64, "reverse": false, "scale": null, "output_dtype": "float32"})
    );
    assert_eq!(
        defaults("chunk_global_cumsum"),
        json!({"reverse": false, "scale": null, "output_dtype": "float32"})
    );
    assert_eq!(defaults("kda_gate"), json!({"lower_bound": null}));
    assert_eq!(
        defaults("kda_gate_chunk_cumsum"),
        json!({"chunk_size": 64, "scale": null, "lower_bound": null, "output_dtype": "float32", "reverse": false})
    );
    assert_eq!(defaults("kv_cache_update"), json!({"cache_layout": "bshd"}));
    assert_eq!(
        defaults("decode_attention"),
        json!({"softmax_scale": null, "causal": true, "cache_layout": "bshd"})
    );
}

fn zeros(shape: &[usize], dtype: Dtype) -> Tensor {
    Tensor::from_f64(&ArrayD::zeros(IxDyn(shape)), dtype)
}

/// The class and rule of output `out` of `op` for the given inputs and params, for a candidate
/// of `class`.
fn rule(
    op: &str,
    inputs: Vec<(&str, Tensor)>,
    params: Value,
    out: &str,
    class: DtypeClass,
) -> (DtypeClass, Rule) {
    let spec = find(op).unwrap();
    let inputs: Tensors = inputs
        .into_iter()
        .map(|(n, t)| (n.to_string(), t))
        .collect();
    let p = Params::resolve(op, spec.params, params.as_object().unwrap()).unwrap();
    let o = spec.output(out).unwrap();
    (
        (o.class)(&inputs, &p).unwrap(),
        (o.rule)(&inputs, &p, class),
    )
}

#[test]
fn thresholds_and_classes_follow_the_op_files() {
    use DtypeClass::*;
    let x = |n| vec![("x", zeros(&[2, n], Dtype::F32))];
    assert_eq!(
        rule("cumsum", x(1 << 16), json!({}), "y", Float32),
        (Float32, Rule::Threshold(1e-5))
    );
    assert_eq!(
        rule("cumsum", x((1 << 16) + 1), json!({}), "y", Float32).1,
        Rule::Threshold(1e-4)
    );
    assert_eq!(
        rule("cumsum", x((1 << 16) + 1), json!({"dim": 0}), "y", Float32).1,
        Rule::Threshold(1e-5)
    );
    let xb = vec![("x", zeros(&[4], Dtype::BF16))];
    assert_eq!(
        rule("cumsum", xb.clone(), json!({}), "y", Half),
        (Half, Rule::Threshold(5e-3))
    );
    assert_eq!(
        rule(
            "cumsum",
            xb,
            json!({"output_dtype": "float32"}),
            "y",
            Float32
        )
        .0,
        Float32
    );

    let g = || vec![("g", zeros(&[1, 8, 2], Dtype::BF16))];
    assert_eq!(
        rule(
            "chunk_local_cumsum",
            g(),
            json!({"chunk_size": 4}),
            "o",
            Float32
        ),
        (Float32, Rule::Threshold(1e-6))
    );
    assert_eq!(
        rule(
            "chunk_local_cumsum",
            g(),
            json!({"chunk_size": 4, "output_dtype": null}),
            "o",
            Half
        )
        .0,
        Half
    );
    let long = |cu: &[i64]| {
        vec![
            ("g", zeros(&[1, 70000, 1], Dtype::F32)),
            ("cu_seqlens", common::idx(cu, Dtype::I32)),
        ]
    };
    assert_eq!(
        rule(
            "chunk_global_cumsum",
            long(&[0, 70000]),
            json!({}),
            "o",
            Float32
        )
        .1,
        Rule::Threshold(1e-4)
    );
    assert_eq!(
        rule(
            "chunk_global_cumsum",
            long(&[0, 35000, 70000]),
            json!({}),
            "o",
            Float32
        )
        .1,
        Rule::Threshold(1e-5)
    );

    let gate = vec![
        ("g", zeros(&[1, 2, 2, 4], Dtype::BF16)),
        ("A_log", zeros(&[2], Dtype::F32)),
    ];
    assert_eq!(
        rule("kda_gate", gate.clone(), json!({}), "y", Float32),
        (Float32, Rule::Threshold(1e-5))
    );
    assert_eq!(
        rule(
            "kda_gate_chunk_cumsum",
            gate,
            json!({"chunk_size": 2}),
            "o",
            Float32
        )
        .1,
        Rule::Threshold(1e-5)
    );

    let kv = vec![("k_cache", zeros(&[1, 4, 1, 2], Dtype::F16))];
    assert_eq!(
        rule("kv_cache_update", kv, json!({}), "k_cache", Half),
        (Half, Rule::Exact)
    );

    let q = |d| vec![("q", zeros(&[1, 1, 2, 4], d))];
    assert_eq!(
        rule("decode_attention", q(Dtype::BF16), json!({}), "o", Half),
        (Half, Rule::Threshold(5e-3))
    );
    assert_eq!(
        rule(
            "decode_attention",
            q(Dtype::BF16),
            json!({}),
            "lse",
            Float32
        ),
        (Float32, Rule::Threshold(1e-3))
    );
    assert_eq!(
        rule("decode_attention", q(Dtype::F32), json!({}), "o", Float32),
        (Float32, Rule::Threshold(1e-5))
    );
    assert_eq!(
        rule("decode_attention", q(Dtype::F32), json!({}), "lse", Float32),
        (Float32, Rule::Threshold(1e-5))
    );
    assert_eq!(
        rule("decode_attention", q(Dtype::F64), json!({}), "lse", Float64),
        (Float32, Rule::Threshold(1e-10))
    );
}

#[test]
fn a_case_tolerance_overrides_the_default() {
    let dir = tempfile::tempdir().unwrap();
    let mut case = common::valid_cases(31).remove(0); // cumsum, fp32 output
    let y = case.outputs.get_mut("y").unwrap();
    let mut a = y.widen_f64();
    a.mapv_inplace(|v| v * (1.0 + 1e-3));
    *y = Tensor::from_f64(&a, Dtype::F32);
    let f = common::write_case(dir.path(), "tol", &case);
    assert_eq!(
        common::conform(&["verify", f.to_str().unwrap()])
            .status
            .code(),
        Some(1)
    );
    case.tolerance.insert("y".into(), 2e-3);
    let f = common::write_case(dir.path(), "tol", &case);
    let o = common::conform(&["verify", f.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", common::stdout(&o));
    assert!(common::stdout(&o).contains("2e-3"));
    assert!(Case::read(&f).is_ok());
}
