//! Where a user reads an op's contract and its errors (issue 27): every input and output has a
//! layout and dtypes in the registry, `list` and `list OP` print them with the spec section, and
//! a table pins the messages of the common mistakes (rank, heads, batch, output dtype).

mod common;

use attn_conformance::registry::OPS;
use attn_conformance::{Case, Tensor};
use attn_reference::Dtype;
use common::{conform, stderr, stdout, valid_cases, write_case, Rng};

/// The spec files an op may cite.
const SPEC_FILES: [&str; 4] = [
    "conformance/spec/ops-cumsum.md",
    "conformance/spec/ops-decode.md",
    "conformance/spec/ops-delta-rule.md",
    "conformance/spec/ops-nsa.md",
];

#[test]
fn every_input_and_output_has_a_layout_and_dtypes_and_every_op_a_section() {
    for op in OPS {
        let (file, section) = op.section.split_once(" §").expect(op.section);
        assert!(SPEC_FILES.contains(&file), "{}: {file}", op.id);
        assert!(section.parse::<u32>().is_ok(), "{}: §{section}", op.id);
        for i in op.inputs {
            assert!(!i.dtype.is_empty(), "{}.{}", op.id, i.name);
            // every input but `cumsum`'s `x` (any rank) has a bracketed layout
            let any_rank = (op.id, i.name) == ("cumsum", "x");
            assert_eq!(i.ranks().is_empty(), any_rank, "{}.{}", op.id, i.name);
        }
        for o in op.outputs {
            assert!(
                !o.shape.is_empty() && !o.dtype.is_empty(),
                "{}.{}",
                op.id,
                o.name
            );
            assert!(!o.present.is_empty(), "{}.{}", op.id, o.name);
        }
    }
}

/// Each valid case's inputs have one of the ranks their layouts allow (the layouts are not
/// looser or stricter than the reference).
#[test]
fn valid_cases_have_the_ranks_of_the_layouts() {
    for case in valid_cases(5) {
        let op = attn_conformance::find(&case.op).unwrap();
        for (name, t) in &case.inputs {
            let r = op.input(name).unwrap().ranks();
            assert!(
                r.is_empty() || r.contains(&t.shape().len()),
                "{}.{name}: {:?} vs {r:?}",
                case.op,
                t.shape()
            );
        }
    }
}

#[test]
fn list_shows_every_input_with_its_layout_and_dtype() {
    let o = conform(&["list"]);
    assert_eq!(o.status.code(), Some(0));
    let out = stdout(&o);
    for op in OPS {
        for i in op.inputs {
            let opt = if i.required { "" } else { "?" };
            let line = format!("{}{opt} {}  {}", i.name, i.shape, i.dtype);
            assert!(out.contains(&line), "{}: `{line}` in\n{out}", op.id);
        }
        assert!(out.contains(&op.citation()), "{}", op.id);
    }
    assert!(out.contains("    inputs:  k [B, T, H, K]  float (k, w, u share one dtype)\n             w [B, T, HV, K]  float, as k\n"), "{out}");
    assert!(out.contains("cu_seqlens? [N + 1]  int32|int64"), "{out}");
    assert!(
        out.contains("v_new [B, T, HV, V]  dtype of u (when save_new_value)"),
        "{out}"
    );
}

#[test]
fn list_op_prints_the_whole_contract() {
    let o = conform(&["list", "chunk_gated_delta_rule_fwd_h"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    let has_row = |cells: &[&str]| {
        out.lines().any(|l| {
            let words: Vec<&str> = l
                .split("  ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .collect();
            words == cells
        })
    };
    assert!(
        has_row(&["w", "[B, T, HV, K]", "float, as k", "yes"]),
        "{out}"
    );
    assert!(
        has_row(&["cu_seqlens", "[N + 1]", "int32|int64", "no"]),
        "{out}"
    );
    assert!(has_row(&["chunk_size", "an integer", "64"]), "{out}");
    assert!(
        has_row(&[
            "v_new",
            "[B, T, HV, V]",
            "dtype of u",
            "when save_new_value"
        ]),
        "{out}"
    );
    assert!(
        out.contains("spec:    conformance/spec/ops-delta-rule.md §2"),
        "{out}"
    );
    assert!(out.contains("devices: cpu, gpu"), "{out}");
    // the optional `lse` of decode_attention says a case may leave it out
    let o = conform(&["list", "decode_attention"]);
    assert!(
        stdout(&o).contains("a case may leave it out"),
        "{}",
        stdout(&o)
    );
    // one op as JSON: the entry of `list --json`
    let o = conform(&["list", "kda_gate", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["op"], "kda_gate");
    assert_eq!(v["inputs"][2]["shape"], "[HV * K]");
    assert_eq!(v["outputs"][0]["dtype"], "float32");
    assert_eq!(v["spec"], "conformance/spec/ops-cumsum.md §4");
    let o = conform(&["list", "no_such_op"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("unknown op `no_such_op`"),
        "{}",
        stderr(&o)
    );
}

/// The valid case of `op` from `valid_cases`.
fn case_of(op: &str) -> Case {
    valid_cases(3).into_iter().find(|c| c.op == op).unwrap()
}

fn with_input(op: &str, name: &str, t: Tensor) -> Case {
    let mut c = case_of(op);
    c.inputs.insert(name.into(), t);
    c
}

/// What a mistake gives: the exit status, and a line that must appear (stderr for an unusable
/// case, stdout for a failed comparison).
struct Message {
    what: &'static str,
    case: Case,
    status: i32,
    says: &'static str,
}

fn messages() -> Vec<Message> {
    let mut r = Rng::new(9);
    let mut half_out = case_of("chunk_local_cumsum");
    let o = half_out.outputs["o"].widen_f64();
    half_out
        .outputs
        .insert("o".into(), Tensor::from_f64(&o, Dtype::F16));
    let mut extra = case_of("cumsum");
    extra
        .inputs
        .insert("wk".into(), r.tensor(&[2], Dtype::F32, 1.0));
    vec![
        Message {
            what: "a rank error names the layout",
            case: with_input("chunk_gated_delta_rule_fwd_h", "k", r.tensor(&[20, 1, 4], Dtype::F32, 1.0)),
            status: 2,
            says: "bad shape for `k`: expected rank 4 [B, T, H, K], got [20, 1, 4]",
        },
        Message {
            what: "a rank error of an input with two layouts names both",
            case: with_input("chunk_local_cumsum", "g", r.tensor(&[20, 2], Dtype::F32, 1.0)),
            status: 2,
            says: "bad shape for `g`: expected rank 3 or 4 [B, T, H] or [B, T, H, S], got [20, 2]",
        },
        Message {
            what: "a head mismatch names k and u",
            case: with_input("chunk_gated_delta_rule_fwd_h", "k", r.tensor(&[1, 20, 3, 4], Dtype::F32, 1.0)),
            status: 2,
            says: "bad shape for `u`: expected HV a multiple of H = 3 (`k` is [B, T, H, K] = [1, 20, 3, 4]), got [1, 20, 2, 3]",
        },
        Message {
            what: "a batch of 2 with cu_seqlens is not quoted",
            case: with_input("chunk_local_cumsum", "g", r.tensor(&[2, 20, 2], Dtype::F32, 1.0)),
            status: 2,
            says: "bad shape for `cu_seqlens`: expected batch size B == 1 when cu_seqlens is given, got B = 2",
        },
        Message {
            what: "a float16 output of a float32 case names the dtypes and output_dtype",
            case: half_out,
            status: 1,
            says: "FAIL (dtype float16, expected float32 (or float64) (set by the parameter output_dtype = \"float32\"; it takes \"float32\" | \"float64\" | null, null meaning the input's dtype))",
        },
        Message {
            what: "a case file's unknown tensor is named as in the file",
            case: extra,
            status: 2,
            says: "unexpected tensor `in.wk` (inputs of `cumsum`: x)",
        },
    ]
}

#[test]
fn each_mistake_gives_its_message() {
    let dir = tempfile::tempdir().unwrap();
    for (n, m) in messages().into_iter().enumerate() {
        let f = write_case(dir.path(), &format!("m{n}"), &m.case);
        let o = conform(&["verify", f.to_str().unwrap()]);
        let text = format!("{}{}", stdout(&o), stderr(&o));
        assert_eq!(o.status.code(), Some(m.status), "{}: {text}", m.what);
        assert!(
            text.contains(m.says),
            "{}: `{}` not in\n{text}",
            m.what,
            m.says
        );
        assert!(!text.contains("\"B = "), "{}: {text}", m.what);
    }
}
