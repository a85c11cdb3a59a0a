//! The kernel author's view of a failure and of `run` (issue 17): diagnostics in the table and
//! in `--json`, `verify --dump-reference`, and the `run` fixes (the worst ratio is the worst,
//! an empty fixtures folder is exit 2, a missing GPU under `--device all` says why, a missing
//! fixtures folder says where it looked).

mod common;

use attn_conformance::app::summarize;
use attn_conformance::compare::unravel;
use attn_conformance::registry::{self, gpu_status};
use attn_conformance::verify::{declared_outputs, Device, Row};
use attn_conformance::{Case, Tensor};
use common::{conform, stderr, stdout, valid_cases, write_case, Rng};
use std::path::Path;

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// The `cumsum` case of `valid_cases(seed)` (x `[3, 7, 4]` float32) with `delta` added to its
/// output at the row-major position `at`; returns the case, the index and the value planted.
fn planted(seed: u64, at: usize, delta: f64) -> (Case, Vec<usize>, f64) {
    let mut case = valid_cases(seed).remove(0);
    assert_eq!(case.op, "cumsum");
    let y = case.outputs.get_mut("y").unwrap();
    let mut a = y.widen_f64();
    let index = unravel(at, a.shape());
    a[index.as_slice()] += delta;
    let value = f64::from(a[index.as_slice()] as f32);
    *y = Tensor::from_f64(&a, y.dtype());
    (case, index, value)
}

/// A planted error at a random index is reported at that index, with the reference and candidate
/// values there, in `--json` and in the table.
#[test]
fn a_planted_error_is_reported_where_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng::new(41);
    for trial in 0..4 {
        let at = rng.below(3 * 7 * 4) as usize;
        let (case, index, value) = planted(trial, at, 3.0);
        let f = write_case(dir.path(), &format!("t{trial}"), &case);
        let o = conform(&["verify", "--json", p(&f)]);
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        let rows: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        let d = &rows[0]["diagnostics"];
        let want: Vec<serde_json::Value> = index.iter().map(|&i| i.into()).collect();
        assert_eq!(d["worst"]["index"].as_array().unwrap(), &want, "{d}");
        assert_eq!(d["worst"]["candidate"].as_f64(), Some(value), "{d}");
        let reference = registry::read(&f).unwrap();
        let spec = registry::spec_of(&reference).unwrap();
        let params = registry::check(&reference).unwrap();
        let r = (spec.cpu)(&reference.inputs, &params).unwrap()["y"].widen_f64();
        assert_eq!(d["worst"]["reference"].as_f64(), Some(r[index.as_slice()]));
        // a cumsum output is a reversed scan here: one changed output element is one error
        assert_eq!(d["over_threshold"].as_u64(), Some(1), "{d}");
        assert_eq!(d["elements"].as_u64(), Some(84));
        assert!(d["nonfinite"].is_null());

        let o = conform(&["verify", p(&f)]);
        let out = stdout(&o);
        assert!(
            out.contains(&format!("worst {index:?}: reference"))
                && out.contains("1 of 84 elements: |ref - x| > threshold × RMS(ref)"),
            "{out}"
        );
    }
}

#[test]
fn a_non_finite_mismatch_names_its_multi_dimensional_index_and_count() {
    let dir = tempfile::tempdir().unwrap();
    let (case, index, _) = planted(3, 28 + 5 * 4 + 2, f64::NAN); // [1, 5, 2] of [3, 7, 4]
    let f = write_case(dir.path(), "nan", &case);
    let o = conform(&["verify", "--json", p(&f)]);
    let rows: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let n = &rows[0]["diagnostics"]["nonfinite"];
    assert_eq!(index, [1, 5, 2]);
    assert_eq!(n["count"].as_u64(), Some(1), "{n}");
    assert_eq!(n["first_index"], serde_json::json!([1, 5, 2]));
    assert_eq!(n["candidate"], "NaN");
    assert!(rows[0]["reason"].as_str().unwrap().contains("[1, 5, 2]"));
}

/// `verify --dump-reference DIR` writes a case with the same inputs and parameters and the
/// reference's outputs, which itself passes `verify`.
#[test]
fn dump_reference_writes_the_reference_as_a_case() {
    let dir = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let cases = valid_cases(12);
    for c in &cases {
        write_case(dir.path(), "d", c);
    }
    let o = conform(&["verify", "--dump-reference", p(out.path()), p(dir.path())]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    for c in &cases {
        let dumped = out.path().join(&c.op).join("d.safetensors");
        let d = registry::read(&dumped).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((&d.op, &d.params), (&c.op, &c.params));
        // bit for bit: the decode caches hold NaN
        assert_eq!(d.inputs.len(), c.inputs.len());
        for (name, t) in &c.inputs {
            assert!(d.inputs[name].bit_identical(t), "{} in.{name}", c.op);
        }
        assert_eq!(d.impl_name(), Some("attn-reference"));
        let spec = registry::spec_of(c).unwrap();
        let all = (spec.cpu)(&c.inputs, &registry::check(c).unwrap()).unwrap();
        // the op's outputs, without the reference's auxiliaries (`block_indices.scores`)
        let want = declared_outputs(spec, all);
        assert!(!want.is_empty() && want.keys().all(|n| spec.output(n).is_some()));
        assert_eq!(d.outputs.len(), want.len(), "{}", c.op);
        for (name, t) in &want {
            assert!(d.outputs[name].bit_identical(t), "{} {name}", c.op);
        }
    }
    let o = conform(&["verify", p(out.path())]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
}

/// Dumping never overwrites the case being verified, nor the reference of another case of the
/// same name written by the same command.
#[test]
fn dump_reference_does_not_overwrite() {
    let dir = tempfile::tempdir().unwrap();
    let case = valid_cases(13).remove(0);
    let f = write_case(dir.path(), "same", &case);
    let before = std::fs::read(&f).unwrap();
    let o = conform(&["verify", "--dump-reference", p(dir.path()), p(&f)]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("it is the case being verified"),
        "{}",
        stderr(&o)
    );
    assert_eq!(std::fs::read(&f).unwrap(), before);

    let other = tempfile::tempdir().unwrap();
    let g = write_case(other.path(), "same", &valid_cases(14).remove(0));
    let out = tempfile::tempdir().unwrap();
    let o = conform(&["verify", "--dump-reference", p(out.path()), p(&f), p(&g)]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("of the same name"), "{}", stderr(&o));
    // the first one written stands
    let d = registry::read(out.path().join("cumsum").join("same.safetensors")).unwrap();
    assert!(d.inputs["x"].bit_identical(&case.inputs["x"]));
}

fn row(file: &str, ratio: f64, threshold: Option<f64>, pass: bool) -> Row {
    Row {
        file: file.into(),
        op: "decode_attention".into(),
        device: Device::Cpu,
        output: "o".into(),
        shape: vec![4],
        dtype: "float32".into(),
        max_abs: ratio,
        ratio,
        threshold,
        pass,
        reason: (!pass).then(|| "planted".into()),
        near_ties: None,
        diagnostics: None,
    }
}

/// The worst ratio is the largest `ratio / threshold` whether its row failed or not; a failed
/// row whose ratio is small (a non-finite mismatch) does not hide it, and file order breaks ties
/// only between equal margins.
#[test]
fn worst_ratio_is_the_worst_failed_or_not() {
    let rows = [
        row("a", 1e-9, Some(1e-5), false), // non-finite mismatch: a small ratio, failed
        row("b", 3e-3, Some(1e-5), false),
        row("c", 2e-3, Some(1e-5), false),
        row("d", 8e-6, Some(1e-5), true),
        row("e", f64::NAN, Some(1e-5), false), // missing output: nothing measured
    ];
    let s = summarize(&rows);
    assert_eq!(s.len(), 1);
    assert_eq!((s[0].worst_ratio, s[0].worst_file.as_str()), (3e-3, "b"));
    assert_eq!((s[0].cases, s[0].passed), (5, 1));

    let s = summarize(&[rows[0].clone(), rows[3].clone()]);
    assert_eq!((s[0].worst_ratio, s[0].worst_file.as_str()), (8e-6, "d"));

    // a ratio held to a tighter threshold can be the worse one
    let s = summarize(&[
        row("x", 1e-4, Some(1e-3), true),
        row("y", 1e-9, Some(1e-10), false),
    ]);
    assert_eq!(s[0].worst_file, "y");

    // under the exact rule any difference is worst
    let s = summarize(&[
        row("p", 4e-3, Some(5e-3), true),
        row("q", 1e-7, None, false),
    ]);
    assert_eq!(s[0].worst_file, "q");

    let s = summarize(&[rows[4].clone()]);
    assert!(s[0].worst_ratio.is_nan() && s[0].worst_file.is_empty());
}

/// Through the command: two failing files, the worse one first in sort order.
#[test]
fn run_reports_the_worse_of_two_failing_files() {
    let dir = tempfile::tempdir().unwrap();
    let (big, _, _) = planted(5, 10, 50.0);
    let (small, _, _) = planted(5, 10, 0.5);
    write_case(dir.path(), "a_big", &big);
    write_case(dir.path(), "z_small", &small);
    let o = conform(&[
        "run",
        "--fixtures",
        p(dir.path()),
        "--device",
        "cpu",
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let s: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let worst = s[0]["worst_file"].as_str().unwrap();
    assert!(worst.ends_with("a_big.safetensors"), "{s}");
    let rows = conform(&["verify", "--json", worst]);
    let rows: serde_json::Value = serde_json::from_str(&stdout(&rows)).unwrap();
    assert_eq!(s[0]["worst_ratio"], rows[0]["ratio"]);
}

#[test]
fn run_on_an_empty_folder_exits_2_and_says_where_it_looked() {
    let dir = tempfile::tempdir().unwrap();
    let o = conform(&["run", "--fixtures", p(dir.path()), "--device", "cpu"]);
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
    let err = stderr(&o);
    assert!(
        err.contains("no .safetensors case file") && err.contains(p(dir.path())),
        "{err}"
    );
    assert!(
        err.contains("--fixtures") && err.contains("ATTN_FIXTURES"),
        "{err}"
    );
}

#[test]
fn a_missing_fixtures_folder_names_where_it_looked_and_how_to_point_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let gone = dir.path().join("no_such_folder");
    let o = conform(&["run", "--fixtures", p(&gone), "--device", "cpu"]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(
        err.contains(p(&gone)) && err.contains("given by --fixtures"),
        "{err}"
    );
    assert!(err.contains("ATTN_FIXTURES"), "{err}");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_attn-conform"))
        .args(["run", "--device", "cpu"])
        .env("ATTN_FIXTURES", &gone)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("from $ATTN_FIXTURES"), "{}", stderr(&o));
}

/// Without a GPU, `--device all` says so on one line of stderr, naming why; `--device cpu`
/// says nothing about GPUs.
#[test]
fn device_all_without_a_gpu_says_why_on_one_line() {
    let dir = tempfile::tempdir().unwrap();
    write_case(dir.path(), "g", &valid_cases(2).remove(0));
    let o = conform(&["run", "--fixtures", p(dir.path()), "--device", "all"]);
    let notes: Vec<String> = stderr(&o)
        .lines()
        .filter(|l| l.contains("--device all"))
        .map(String::from)
        .collect();
    match gpu_status() {
        Err(why) => {
            assert_eq!(notes.len(), 1, "{}", stderr(&o));
            assert!(notes[0].contains(&why), "{notes:?} vs {why}");
            eprintln!("no GPU here: {why}");
        }
        Ok(()) => assert!(notes.is_empty(), "{notes:?}"),
    }
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let o = conform(&["run", "--fixtures", p(dir.path()), "--device", "cpu"]);
    assert!(!stderr(&o).contains("GPU"), "{}", stderr(&o));
}
