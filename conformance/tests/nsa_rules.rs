//! The NSA comparison rules wired into `verify` (`conformance/spec/ops-nsa.md` §3, §7, §9):
//! `block_indices` by the index rule with near-ties counted, the `-inf` rule of `lse`, and
//! `nsa_fwd`'s `o` computed from the candidate's own `block_indices`.

mod common;

use attn_conformance::verify::{verify_case, Row, Selection};
use attn_conformance::{Case, Tensor};
use attn_reference::Dtype;
use common::{fill_outputs, valid_cases, Rng};
use ndarray::{ArrayD, IxDyn};

fn case_of(op: &str, seed: u64) -> Case {
    valid_cases(seed).into_iter().find(|c| c.op == op).unwrap()
}

fn row<'a>(rows: &'a [Row], output: &str) -> &'a Row {
    rows.iter().find(|r| r.output == output).unwrap()
}

fn i32s(t: &Tensor) -> ArrayD<i32> {
    match t {
        Tensor::I32(a) => a.clone(),
        Tensor::I64(a) => a.mapv(|x| x as i32),
        _ => panic!("not an index tensor"),
    }
}

/// The reference's own outputs pass; a row with a different valid set fails; the same sets in
/// another order, and as int64, pass.
#[test]
fn select_blocks_rows_are_sets() {
    for seed in 0..4 {
        let mut c = case_of("nsa_select_blocks", seed);
        let rows = verify_case(&c, Selection::Cpu).unwrap();
        let r = row(&rows, "block_indices");
        assert!(r.pass && r.near_ties == Some(0), "{r:?}");
        let mut bi = i32s(&c.outputs["block_indices"]);
        // reverse the valid prefix of every row: same sets
        for mut lane in bi.lanes_mut(ndarray::Axis(3)) {
            let n = lane.iter().filter(|&&x| x >= 0).count();
            let v: Vec<i32> = lane.iter().take(n).rev().copied().collect();
            for (i, x) in v.into_iter().enumerate() {
                lane[i] = x;
            }
        }
        c.outputs
            .insert("block_indices".into(), Tensor::I64(bi.mapv(i64::from)));
        let rows = verify_case(&c, Selection::Cpu).unwrap();
        assert!(row(&rows, "block_indices").pass);
        // a row whose first valid entry becomes an unselected far-away block fails
        let mut bad = bi.clone();
        let t_last = bad.shape()[1] - 1;
        let ic = (t_last / 4) as i32; // block_size 4
        let sel: Vec<i32> = bad.slice(ndarray::s![0, t_last, 0, ..]).to_vec();
        let other = (0..=ic).find(|c| !sel.contains(c));
        if let Some(o) = other {
            bad[[0, t_last, 0, 0]] = o;
            c.outputs.insert("block_indices".into(), Tensor::I32(bad));
            let rows = verify_case(&c, Selection::Cpu).unwrap();
            let r = row(&rows, "block_indices");
            assert!(!r.pass, "{r:?}");
            assert_eq!(r.max_abs, 1.0, "one differing row");
        }
    }
}

/// `lse`: a finite candidate where the reference is `-inf` fails, and so does `-inf` where the
/// reference is finite.
#[test]
fn lse_neg_inf_positions_must_match() {
    let mut c = case_of("nsa_selection_attention", 3);
    // a zero quota for row (0, 5, 0): empty, lse = -inf in the reference
    let mut counts = ArrayD::<i32>::from_elem(IxDyn(&[1, 12, 1]), 2);
    counts[[0, 5, 0]] = 0;
    c.inputs.insert("block_counts".into(), Tensor::I32(counts));
    c.outputs.clear();
    fill_outputs(&mut c);
    let rows = verify_case(&c, Selection::Cpu).unwrap();
    assert!(rows.iter().all(|r| r.pass), "{rows:?}");
    let lse = c.outputs["lse"].widen_f64();
    assert_eq!(lse[[0, 5, 0]], f64::NEG_INFINITY);
    for (pos, value) in [([0, 5, 0], 0.0), ([0, 6, 1], f64::NEG_INFINITY)] {
        let mut bad = lse.clone();
        bad[pos] = value;
        let mut c2 = c.clone();
        c2.outputs
            .insert("lse".into(), Tensor::from_f64(&bad, Dtype::F32));
        let rows = verify_case(&c2, Selection::Cpu).unwrap();
        assert!(!row(&rows, "lse").pass, "{pos:?} = {value}");
    }
}

/// `nsa_fwd`: with the candidate's `block_indices` in the case, `o` is checked against the
/// reference computed from them; the indices themselves against the reference's selection.
#[test]
fn fwd_o_uses_the_candidates_indices() {
    let c = case_of("nsa_fwd", 5);
    let rows = verify_case(&c, Selection::Cpu).unwrap();
    assert!(rows.iter().all(|r| r.pass), "{rows:?}");
    // another valid selection: block 0 only in every row (not the reference's)
    let shape = c.outputs["block_indices"].shape().to_vec();
    let mine = ArrayD::<i32>::from_shape_fn(IxDyn(&shape), |i| if i[3] == 0 { 0 } else { -1 });
    let mut inputs = c.inputs.clone();
    inputs.insert("block_indices".into(), Tensor::I32(mine.clone()));
    let spec = attn_conformance::find("nsa_fwd").unwrap();
    let params = attn_conformance::registry::params_of(&c).unwrap();
    let o_given = (spec.cpu)(&inputs, &params).unwrap()["o"].widen_f64();
    let mut cand = c.clone();
    cand.outputs
        .insert("block_indices".into(), Tensor::I32(mine));
    cand.outputs
        .insert("o".into(), Tensor::from_f64(&o_given, Dtype::F32));
    let rows = verify_case(&cand, Selection::Cpu).unwrap();
    assert!(row(&rows, "o").pass, "{rows:?}");
    assert!(!row(&rows, "block_indices").pass, "{rows:?}");
    // the plain o of the case no longer matches those indices
    let mut stale = cand.clone();
    stale.outputs.insert("o".into(), c.outputs["o"].clone());
    let rows = verify_case(&stale, Selection::Cpu).unwrap();
    assert!(!row(&rows, "o").pass, "{rows:?}");
}

/// A near-tie flip passes by the band and is counted in the row: with 2 slots, the forced
/// blocks {0, 1, 2} of position 11 (block size 4) all score 1, so {0, 2} ties {0, 1}.
#[test]
fn near_tie_rows_are_counted() {
    let mut r = Rng::new(1);
    let mut c = Case::new("nsa_select_blocks", "test");
    c.params = serde_json::json!({"block_size": 4, "block_counts": 2})
        .as_object()
        .unwrap()
        .clone();
    c.inputs
        .insert("q".into(), Tensor::F64(r.array(&[1, 16, 1, 2], 1.0)));
    c.inputs
        .insert("k_cmp".into(), Tensor::F64(r.array(&[1, 4, 1, 2], 1.0)));
    fill_outputs(&mut c);
    let mut bi = i32s(&c.outputs["block_indices"]);
    assert_eq!(bi.slice(ndarray::s![0, 11, 0, ..]).to_vec(), vec![0, 1]);
    bi[[0, 11, 0, 1]] = 2;
    c.outputs
        .insert("block_indices".into(), Tensor::I32(bi.clone()));
    let rows = verify_case(&c, Selection::Cpu).unwrap();
    let r = row(&rows, "block_indices");
    assert!(r.pass && r.near_ties == Some(1), "{r:?}");
    // block 3 is not a candidate at position 11: never within the band
    bi[[0, 11, 0, 1]] = 3;
    c.outputs.insert("block_indices".into(), Tensor::I32(bi));
    let rows = verify_case(&c, Selection::Cpu).unwrap();
    assert!(!row(&rows, "block_indices").pass);
}

/// `nsa_compress_kv` in every input dtype (`conformance/spec/ops-nsa.md` §2 "Suite must cover"):
/// the reference's own outputs rounded to the dtype pass under that dtype's threshold; one element
/// moved fails.
#[test]
fn compress_kv_every_dtype() {
    for dtype in [Dtype::F64, Dtype::F32, Dtype::BF16, Dtype::F16] {
        let mut r = Rng::new(7);
        let mut c = Case::new("nsa_compress_kv", "test");
        c.params = serde_json::json!({"block_size": 8})
            .as_object()
            .unwrap()
            .clone();
        c.inputs
            .insert("k".into(), r.tensor(&[1, 30, 2, 5], dtype, 1.0));
        c.inputs
            .insert("v".into(), r.tensor(&[1, 30, 2, 3], dtype, 1.0));
        fill_outputs(&mut c);
        assert_eq!(c.outputs["k_cmp"].dtype(), dtype);
        let rows = verify_case(&c, Selection::Cpu).unwrap();
        assert!(rows.iter().all(|r| r.pass), "{dtype}: {rows:?}");
        let mut bad = c.outputs["v_cmp"].widen_f64();
        bad[[0, 3, 1, 2]] += 0.5;
        c.outputs
            .insert("v_cmp".into(), Tensor::from_f64(&bad, dtype));
        let rows = verify_case(&c, Selection::Cpu).unwrap();
        assert!(!row(&rows, "v_cmp").pass, "{dtype}");
    }
}

/// The runners refuse inputs of differing float dtypes (`conformance/spec/ops-nsa.md` §1: one dtype
/// per call), naming the tensor; weights and the given gates of `nsa_gate_combine` may differ (they
/// are widened).
#[test]
fn runners_name_a_mismatched_dtype() {
    for (op, tensor) in [
        ("nsa_compress_kv", "v"),
        ("nsa_compression_attention", "v_cmp"),
        ("nsa_select_blocks", "k_cmp"),
        ("nsa_selection_attention", "k"),
        ("nsa_gate_combine", "o_swa"),
        ("nsa_fwd", "g_slc"),
    ] {
        let mut c = case_of(op, 11);
        let t = &c.inputs[tensor];
        let other = if t.dtype() == Dtype::F64 {
            Dtype::F32
        } else {
            Dtype::F64
        };
        let changed = Tensor::from_f64(&t.widen_f64(), other);
        c.inputs.insert(tensor.into(), changed);
        let err = verify_case(&c, Selection::Cpu).unwrap_err().to_string();
        assert!(err.contains(&format!("`{tensor}`")), "{op}: {err}");
    }
    // a gate weight of another dtype is widened, not refused
    let c = case_of("nsa_gate_combine", 11);
    assert_eq!(c.inputs["gate_proj_weight"].dtype(), Dtype::BF16);
    assert!(verify_case(&c, Selection::Cpu)
        .unwrap()
        .iter()
        .all(|r| r.pass));
}
