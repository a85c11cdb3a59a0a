//! Cases written by `Case::write` read back identical: every dtype, shape (rank 0 to 4, empty
//! extents included), NaN payloads, and every metadata key.

mod common;

use attn_conformance::{registry, Case, Tensor};
use attn_reference::Dtype;
use proptest::prelude::*;
use serde_json::json;

/// A random tensor of `dtype` whose bits cover the whole type (floats: any bit pattern,
/// NaN payloads and infinities included).
fn random_tensor(rng: &mut common::Rng, dtype: Dtype, shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let bits: Vec<u64> = (0..n).map(|_| rng.next_u64()).collect();
    let bytes: Vec<u8> = bits
        .iter()
        .flat_map(|b| b.to_le_bytes()[..dtype.size_bytes()].to_vec())
        .collect();
    Tensor::from_le_bytes("t", dtype, shape, &bytes).unwrap()
}

fn assert_same(a: &Case, b: &Case) {
    assert_eq!((&a.op, &a.params, &a.source), (&b.op, &b.params, &b.source));
    assert_eq!(
        (&a.tolerance, &a.note, &a.extra),
        (&b.tolerance, &b.note, &b.extra)
    );
    for (x, y) in [(&a.inputs, &b.inputs), (&a.outputs, &b.outputs)] {
        assert_eq!(x.keys().collect::<Vec<_>>(), y.keys().collect::<Vec<_>>());
        for (k, t) in x {
            assert!(t.bit_identical(&y[k]), "{k}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn written_cases_read_back_identical(
        seed in any::<u64>(),
        shapes in prop::collection::vec(prop::collection::vec(0usize..5, 0..5), 6..13),
        tol in 1e-9f64..1.0,
        note in prop::option::of("[ -~]{0,40}"),
    ) {
        let mut rng = common::Rng::new(seed);
        let mut case = Case::new("decode_attention", "fuzz");
        case.params = json!({"causal": rng.below(2) == 1, "softmax_scale": rng.uniform()})
            .as_object().unwrap().clone();
        case.source = json!({"impl": "fuzz", "seed": seed, "device": "cpu"});
        case.tolerance.insert("o".into(), tol);
        case.note = note;
        case.extra.insert("generator".into(), format!("tools/x.py seed={seed}"));
        for (i, shape) in shapes.iter().enumerate() {
            let dtype = Dtype::ALL[i % Dtype::ALL.len()];
            let t = random_tensor(&mut rng, dtype, shape);
            let side = if i % 2 == 0 { &mut case.inputs } else { &mut case.outputs };
            side.insert(format!("t{i}_{}", dtype.name()), t);
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.safetensors");
        case.write(&path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let back = Case::parse(&path, &bytes).unwrap();
        assert_same(&case, &back);
        prop_assert_eq!(&back.path, &path);
        // written again, it still reads back the same
        let again = Case::parse(&path, &back.to_bytes().unwrap()).unwrap();
        assert_same(&case, &again);
    }
}

#[test]
fn valid_cases_round_trip_through_the_checked_reader() {
    let dir = tempfile::tempdir().unwrap();
    for case in common::valid_cases(77) {
        let path = common::write_case(dir.path(), "rt", &case);
        let back = Case::read(&path).unwrap();
        assert_same(&case, &back);
    }
}

#[test]
fn metadata_keys_follow_the_format() {
    let mut case = common::valid_cases(5).remove(0);
    case.note = Some("a note".into());
    case.tolerance.insert("y".into(), 0.01);
    let bytes = case.to_bytes().unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let meta = meta.metadata().clone().unwrap();
    assert_eq!(meta["format"], "attn-case/1");
    assert_eq!(meta["op"], "cumsum");
    let params: serde_json::Value = serde_json::from_str(&meta["params"]).unwrap();
    assert_eq!(params, json!({"dim": 1, "reverse": true}));
    let tol: serde_json::Value = serde_json::from_str(&meta["tolerance"]).unwrap();
    assert_eq!(tol, json!({"y": 0.01}));
    assert_eq!(meta["note"], "a note");
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut names = st.names();
    names.sort();
    assert_eq!(names, vec!["in.x", "out.y"]);
    assert_eq!(st.tensor("in.x").unwrap().dtype(), safetensors::Dtype::F32);
}

#[test]
fn malformed_metadata_is_refused_with_its_key() {
    let base = common::valid_cases(6).remove(0);
    let bytes = base.to_bytes().unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let with_meta = |pairs: &[(&str, &str)]| {
        let meta = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let b = safetensors::serialize(st.tensors(), Some(meta)).unwrap();
        let path = std::path::Path::new("m.safetensors");
        Case::from_bytes(path, &b)
            .and_then(|c| registry::check(&c).map(|_| ()).map_err(|p| p.at(path)))
            .unwrap_err()
            .to_string()
    };
    let src = r#"{"impl":"x"}"#;
    let cases: [(&[(&str, &str)], &str); 7] = [
        (&[("op", "cumsum"), ("source", src)], "no `format`"),
        (
            &[("format", "attn-case/2"), ("op", "cumsum"), ("source", src)],
            "attn-case/2",
        ),
        (&[("format", "attn-case/1"), ("source", src)], "no `op`"),
        (
            &[("format", "attn-case/1"), ("op", "cumsum")],
            "no `source`",
        ),
        (
            &[
                ("format", "attn-case/1"),
                ("op", "cumsum"),
                ("source", "{impl"),
            ],
            "`source`",
        ),
        (
            &[
                ("format", "attn-case/1"),
                ("op", "cumsum"),
                ("source", src),
                ("params", "[1]"),
            ],
            "`params`",
        ),
        (
            &[
                ("format", "attn-case/1"),
                ("op", "cumsum"),
                ("source", src),
                ("tolerance", r#"{"y":"big"}"#),
            ],
            "`tolerance`",
        ),
    ];
    for (meta, needle) in cases {
        let e = with_meta(meta);
        assert!(
            e.contains(needle) && e.starts_with("m.safetensors: "),
            "{needle}: {e}"
        );
    }
    let e = with_meta(&[
        ("format", "attn-case/1"),
        ("op", "cumsum"),
        ("source", src),
        ("params", "{\"dim\": 1.5}"),
    ]);
    assert!(e.contains("`dim`"), "{e}");
}
