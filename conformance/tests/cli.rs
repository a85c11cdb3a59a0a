//! Drives the real `attn-conform` binary on cases written in a temporary folder.

mod common;

use attn_conformance::fixtures::{sha256_hex, Manifest, ManifestEntry, MANIFEST, MANIFEST_FORMAT};
use attn_conformance::registry::gpu_status;
use attn_conformance::{Case, Tensor, OPS};
use attn_reference::Dtype;
use common::{conform, stderr, stdout, valid_cases, write_case, Rng};
use serde_json::json;
use std::path::Path;

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// Perturbs one element of a float output far beyond any threshold.
fn perturb(t: &mut Tensor, at: usize) {
    let mut a = t.widen_f64();
    let n = a.len();
    let v = a.iter_mut().nth(at % n).unwrap();
    *v += 1.0 + 10.0 * v.abs();
    *t = Tensor::from_f64(&a, t.dtype());
}

#[test]
fn reference_outputs_pass_and_a_changed_value_fails() {
    let dir = tempfile::tempdir().unwrap();
    let cases = valid_cases(11);
    for c in &cases {
        write_case(dir.path(), "ok", c);
    }
    let o = conform(&["verify", p(dir.path())]);
    let rows: usize = cases.iter().map(common::rows_of).sum();
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).contains(&format!("{rows} passed, 0 failed")),
        "{}",
        stdout(&o)
    );

    let mut rng = Rng::new(5);
    for c in &cases {
        let mut bad = c.clone();
        let (name, t) = bad.outputs.iter_mut().next().unwrap();
        let name = name.clone();
        perturb(t, rng.below(1 << 20) as usize);
        let f = write_case(dir.path(), "bad", &bad);
        let o = conform(&["verify", p(&f)]);
        assert_eq!(o.status.code(), Some(1), "{}: {}", c.op, stdout(&o));
        let out = stdout(&o);
        // an output with parts (`hm` → `hm.b`, `hm.M`) fails in the part holding the change
        let failed = out
            .lines()
            .filter(|l| l.contains(&format!(" {name} ")) || l.contains(&format!(" {name}.")))
            .any(|l| l.contains("FAIL"));
        assert!(failed, "{}: {out}", c.op);
        assert!(out.contains("1 failed"), "{out}");
        std::fs::remove_file(f).unwrap();
    }
}

#[test]
fn json_rows_parse_and_match_the_cases() {
    let dir = tempfile::tempdir().unwrap();
    let cases = valid_cases(23);
    for c in &cases {
        write_case(dir.path(), "ok", c);
    }
    let o = conform(&["verify", "--json", p(dir.path())]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let rows: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), cases.iter().map(common::rows_of).sum::<usize>());
    for c in &cases {
        for name in c.outputs.keys() {
            let parts = attn_conformance::find(&c.op)
                .unwrap()
                .output(name)
                .unwrap()
                .parts;
            let row_names: Vec<&str> = match parts {
                [] => vec![name.as_str()],
                parts => parts.iter().map(|p| p.name).collect(),
            };
            for row_name in row_names {
                let r = rows
                    .iter()
                    .find(|r| r["op"] == c.op.as_str() && r["output"] == row_name)
                    .unwrap_or_else(|| panic!("no row for {}.{row_name}", c.op));
                assert_eq!(r["pass"], true);
                assert_eq!(r["device"], "cpu");
                if parts.is_empty() {
                    assert_eq!(r["shape"], json!(c.outputs[name].shape()));
                }
                assert!(r["ratio"].as_f64().unwrap() >= 0.0);
            }
        }
    }
    let kv = rows.iter().find(|r| r["op"] == "kv_cache_update").unwrap();
    assert!(kv["threshold"].is_null(), "kv_cache_update is exact");
}

/// Writes `case` and checks that `verify` refuses it with exit 2 and `needle` on stderr.
fn refused(case: &Case, needle: &str) {
    let dir = tempfile::tempdir().unwrap();
    let f = write_case(dir.path(), "case", case);
    let o = conform(&["verify", p(&f)]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{needle}: {}{err}", stdout(&o));
    assert!(err.contains(needle), "expected {needle:?} in {err}");
    assert!(err.contains(p(&f)), "the file is named: {err}");
}

#[test]
fn unusable_cases_exit_2_naming_the_problem() {
    let base = valid_cases(3).remove(0); // cumsum
    let mut unknown_op = base.clone();
    unknown_op.op = "cumsum_v2".into();
    refused(&unknown_op, "unknown op `cumsum_v2`");

    let mut missing = base.clone();
    missing.inputs.remove("x");
    refused(&missing, "missing required input `in.x`");

    let mut unknown_param = base.clone();
    unknown_param.params.insert("axis".into(), json!(0));
    refused(&unknown_param, "unknown parameter `axis`");

    let mut wrong_type = base.clone();
    wrong_type.params.insert("reverse".into(), json!("yes"));
    refused(&wrong_type, "parameter `reverse`");

    let mut bad_dim = base.clone();
    bad_dim.params.insert("dim".into(), json!(7));
    refused(&bad_dim, "`dim`");

    let mut extra = base.clone();
    extra.inputs.insert(
        "y".into(),
        Tensor::F32(ndarray::ArrayD::zeros(ndarray::IxDyn(&[1]))),
    );
    refused(&extra, "unexpected tensor `in.y`");

    let mut no_impl = base.clone();
    no_impl.source = json!({"device": "cpu"});
    refused(&no_impl, "`impl`");

    let mut bad_tol = base.clone();
    bad_tol.tolerance.insert("h".into(), 0.01);
    refused(&bad_tol, "`tolerance`");

    let mut int_input = base.clone();
    int_input.inputs.insert(
        "x".into(),
        Tensor::I32(ndarray::ArrayD::zeros(ndarray::IxDyn(&[3]))),
    );
    refused(&int_input, "`x`");

    // kv_cache_update needs one dtype for caches and new tokens
    let mut kv = valid_cases(3).remove(5);
    let k32 = Tensor::from_f64(&kv.inputs["k"].widen_f64(), Dtype::F32);
    kv.inputs.insert("k".into(), k32);
    refused(&kv, "bad dtype for `k`");

    // shapes that contradict each other: cu_seqlens does not end at T
    let mut bad_cu = valid_cases(3).remove(1);
    bad_cu
        .inputs
        .insert("cu_seqlens".into(), common::idx(&[0, 4, 19], Dtype::I32));
    refused(&bad_cu, "cu_seqlens");
}

#[test]
fn files_that_are_not_cases_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.safetensors");
    std::fs::write(&junk, b"this is not a safetensors file at all").unwrap();
    let o = conform(&["verify", p(&junk)]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("not a safetensors file"),
        "{}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("junk.safetensors"), "{}", stderr(&o));

    // a valid safetensors file without the case metadata
    let mut c = valid_cases(4).remove(0);
    let bytes = c.to_bytes().unwrap();
    let plain = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let views: Vec<_> = plain.tensors();
    let raw = dir.path().join("plain.safetensors");
    std::fs::write(&raw, safetensors::serialize(views, None).unwrap()).unwrap();
    let o = conform(&["verify", p(&raw)]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("no `format`"), "{}", stderr(&o));

    c.extra.insert("format_note".into(), "kept".into());
    let f = write_case(dir.path(), "extra", &c);
    assert_eq!(Case::read(&f).unwrap().extra["format_note"], "kept");
    assert_eq!(
        conform(&["verify", p(&f)]).status.code(),
        Some(0),
        "unknown metadata keys are ignored"
    );

    let o = conform(&["verify", p(&dir.path().join("absent.safetensors"))]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("absent.safetensors"));
}

fn manifest_for(dir: &Path, files: &[(&Path, &Case)]) {
    let m = Manifest {
        format: MANIFEST_FORMAT.into(),
        files: files
            .iter()
            .map(|(f, c)| ManifestEntry {
                path: f.strip_prefix(dir).unwrap().to_str().unwrap().into(),
                sha256: sha256_hex(&std::fs::read(f).unwrap()),
                op: c.op.clone(),
                impl_name: c.impl_name().unwrap().into(),
                description: "test case".into(),
            })
            .collect(),
    };
    std::fs::write(dir.join(MANIFEST), serde_json::to_string(&m).unwrap()).unwrap();
}

#[test]
fn manifest_sha256_mismatch_and_missing_files_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let cases = valid_cases(8);
    let files: Vec<_> = cases
        .iter()
        .map(|c| write_case(dir.path(), "m", c))
        .collect();
    let pairs: Vec<_> = files
        .iter()
        .map(|f| f.as_path())
        .zip(cases.iter())
        .collect();
    manifest_for(dir.path(), &pairs);
    assert_eq!(conform(&["verify", p(dir.path())]).status.code(), Some(0));
    let r = conform(&["run", "--fixtures", p(dir.path())]);
    assert_eq!(r.status.code(), Some(0), "{}{}", stdout(&r), stderr(&r));

    // flip one byte of the last tensor payload: still a readable case, but not the listed one
    let mut bytes = std::fs::read(&files[0]).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    std::fs::write(&files[0], &bytes).unwrap();
    for o in [
        conform(&["verify", p(&files[0])]),
        conform(&["run", "--fixtures", p(dir.path())]),
    ] {
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(stderr(&o).contains("corrupted"), "{}", stderr(&o));
    }

    std::fs::remove_file(&files[0]).unwrap();
    let o = conform(&["run", "--fixtures", p(dir.path())]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("listed in"), "{}", stderr(&o));
}

#[test]
fn run_summarizes_per_op_and_fails_on_a_bad_case() {
    let dir = tempfile::tempdir().unwrap();
    for seed in [1, 2] {
        for c in valid_cases(seed) {
            write_case(dir.path(), &format!("s{seed}"), &c);
        }
    }
    let o = conform(&[
        "run",
        "--fixtures",
        p(dir.path()),
        "--device",
        "cpu",
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let rows: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), OPS.len());
    for r in rows {
        assert_eq!(
            (r["cases"].as_u64(), r["passed"].as_u64()),
            (Some(2), Some(2)),
            "{r}"
        );
    }

    let mut bad = valid_cases(9).remove(3); // kda_gate
    perturb(bad.outputs.get_mut("y").unwrap(), 17);
    write_case(dir.path(), "bad", &bad);
    let o = conform(&["run", "--fixtures", p(dir.path()), "--device", "cpu"]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    let out = stdout(&o);
    let line = out.lines().find(|l| l.starts_with("kda_gate ")).unwrap();
    assert!(
        line.contains(" 3 ") && line.contains(" 2 ") && line.contains("FAIL"),
        "{out}"
    );

    // the fixtures folder comes from ATTN_FIXTURES when --fixtures is absent
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_attn-conform"))
        .args(["run", "--device", "cpu"])
        .env("ATTN_FIXTURES", dir.path())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
}

#[test]
fn gpu_without_runner_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let f = write_case(dir.path(), "g", &valid_cases(2).remove(0));
    let o = conform(&["verify", "--device", "gpu", p(&f)]);
    if gpu_status().is_err() {
        assert_eq!(o.status.code(), Some(2));
        assert!(stderr(&o).contains("no GPU"), "{}", stderr(&o));
        // `all` checks what there is
        assert_eq!(
            conform(&["verify", "--device", "all", p(&f)]).status.code(),
            Some(0)
        );
    } else {
        eprintln!("a GPU runner exists: the no-GPU answer is not tested here");
    }
}

#[test]
fn list_shows_every_op_with_defaults() {
    let o = conform(&["list"]);
    assert_eq!(o.status.code(), Some(0));
    let out = stdout(&o);
    for op in OPS {
        assert!(
            out.lines().any(|l| l.starts_with(&format!("{}  ", op.id))),
            "{} in {out}",
            op.id
        );
    }
    assert!(out.contains("dim=-1"), "{out}");
    assert!(out.contains("chunk_size (required)"), "{out}");
    let o = conform(&["list", "--json"]);
    let ops: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let ops = ops.as_array().unwrap();
    assert_eq!(ops.len(), OPS.len());
    let decode = ops.iter().find(|o| o["op"] == "decode_attention").unwrap();
    let causal = decode["params"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "causal")
        .unwrap();
    assert_eq!(causal["default"], true);
    assert!(decode["devices"]
        .as_array()
        .unwrap()
        .contains(&json!("cpu")));
    // both decode ops have a GPU runner
    for op in ["decode_attention", "kv_cache_update"] {
        let entry = ops.iter().find(|o| o["op"] == op).unwrap();
        assert_eq!(entry["devices"], json!(["cpu", "gpu"]), "{op}");
    }
}

#[test]
fn a_missing_required_output_fails_and_an_optional_one_is_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let mut cases = valid_cases(41);
    let mut no_y = cases.remove(0); // cumsum
    no_y.outputs.remove("y");
    let f = write_case(dir.path(), "no_y", &no_y);
    let o = conform(&["verify", p(&f)]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(
        stdout(&o).contains("missing from the candidate"),
        "{}",
        stdout(&o)
    );

    let at = cases
        .iter()
        .position(|c| c.op == "decode_attention")
        .unwrap();
    let mut no_lse = cases.remove(at); // decode_attention: SDPA returns no lse
    no_lse.outputs.remove("lse");
    let f = write_case(dir.path(), "no_lse", &no_lse);
    let o = conform(&["verify", p(&f)]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert!(stdout(&o).contains("1 passed, 0 failed"), "{}", stdout(&o));
}

#[test]
fn the_fixtures_folder_is_found_at_run_time() {
    // <root>/crate stands for the conformance crate, <root>/fixtures for the fixtures folder
    let root = tempfile::tempdir().unwrap();
    let fixtures = root.path().join("fixtures");
    let mut bad = valid_cases(12).remove(0);
    perturb(bad.outputs.get_mut("y").unwrap(), 3);
    write_case(&fixtures, "bad", &bad);
    std::fs::create_dir_all(root.path().join("crate")).unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let run = |manifest_dir: Option<&Path>, cwd: &Path| {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_attn-conform"));
        c.args(["run", "--device", "cpu"])
            .env_remove("ATTN_FIXTURES")
            .current_dir(cwd);
        match manifest_dir {
            Some(d) => c.env("CARGO_MANIFEST_DIR", d),
            None => c.env_remove("CARGO_MANIFEST_DIR"),
        };
        c.output().unwrap()
    };
    // $CARGO_MANIFEST_DIR/../fixtures, read when the command runs
    let o = run(Some(&root.path().join("crate")), elsewhere.path());
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("cumsum"), "{}", stdout(&o));
    // else ./fixtures
    let o = run(None, root.path());
    assert_eq!(o.status.code(), Some(1), "{}{}", stdout(&o), stderr(&o));
    // nothing there: exit 2, naming the folder it looked for
    let o = run(None, elsewhere.path());
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("fixtures folder not found"),
        "{}",
        stderr(&o)
    );
}

/// `verify --gpus N`: 0 is refused by the parser naming the flag; a group that cannot be opened
/// (no GPU, no NCCL, more GPUs than the host has) is exit 2 naming `--gpus` before any case
/// runs; where one GPU and NCCL answer, the context-parallel rows (`gpus=1`) appear for the ops
/// that have the path and the other ops' cases are reported skipped.
#[test]
fn verify_gpus_names_the_flag_and_skips_ops_without_the_path() {
    let dir = tempfile::tempdir().unwrap();
    for c in &valid_cases(3) {
        write_case(dir.path(), "ok", c);
    }
    let o = conform(&["verify", "--gpus", "0", p(dir.path())]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--gpus"), "{}", stderr(&o));
    // more GPUs than any host has: refused whatever the machine
    let o = conform(&["verify", "--gpus", "4096", p(dir.path())]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("error: --gpus 4096:"), "{}", stderr(&o));
    assert!(stdout(&o).is_empty(), "no case runs: {}", stdout(&o));
    let o = conform(&["verify", "--gpus", "1", p(dir.path())]);
    if attn_gpu::cp::CpGroup::open(1).is_err() {
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(stderr(&o).contains("error: --gpus 1:"), "{}", stderr(&o));
    } else {
        let (out, err) = (stdout(&o), stderr(&o));
        for op in ["kda_fwd", "gdn_fwd", "chunk_gated_delta_rule_fwd_h"] {
            assert!(
                out.lines().any(|l| l.contains(op) && l.contains("gpus=1")),
                "{op}: {out}"
            );
        }
        assert!(
            err.contains("skipped:") && err.contains("`cumsum`"),
            "{err}"
        );
        assert!(out.contains("skipped (no context-parallel path)"), "{out}");
    }
    // `list` names the path among the devices of the ops that have it only
    assert!(stdout(&conform(&["list", "kda_fwd"])).contains("devices: cpu, gpu, gpus"));
    assert!(!stdout(&conform(&["list", "cumsum"])).contains("gpus"));
}
