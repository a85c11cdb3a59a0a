//! What `verify`, `run` and `report` say at the end (issue 27): unusable files are counted in
//! the summary, a missing fixtures folder lists every place looked as `--help` does, the GPU note
//! never comes before the real error nor names a flag the user did not pass, and `report` tallies
//! cases per implementation and op as text, markdown and HTML.

mod common;

use attn_conformance::registry::gpu_status;
use attn_conformance::{Case, Tensor};
use common::{conform, stderr, stdout, valid_cases, write_case};
use std::path::Path;
use std::process::{Command, Output};

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// The valid `cumsum` case (one output row) from `source.impl` `implementation`.
fn cumsum_by(implementation: &str, seed: u64) -> Case {
    let mut c = valid_cases(seed).remove(0);
    assert_eq!(c.op, "cumsum");
    c.source["impl"] = implementation.into();
    c
}

/// `c` with its first output moved far beyond any threshold.
fn broken(mut c: Case) -> Case {
    let y = c.outputs.get_mut("y").unwrap();
    let a = y.widen_f64().mapv(|v| v + 1.0);
    *y = Tensor::from_f64(&a, y.dtype());
    c
}

/// The last line of stdout.
fn last_line(o: &Output) -> String {
    stdout(o).lines().last().unwrap_or_default().to_string()
}

#[test]
fn verify_counts_a_text_file_beside_a_good_case_as_unusable() {
    let dir = tempfile::tempdir().unwrap();
    let good = write_case(dir.path(), "good", &cumsum_by("x", 1));
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "not a case\n").unwrap();
    let o = conform(&["verify", p(&good), p(&text)]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        last_line(&o),
        "1 passed, 0 failed, 1 unusable",
        "{}",
        stdout(&o)
    );
    assert!(stderr(&o).contains(p(&text)), "{}", stderr(&o));
    // --json: the count on stderr
    let o = conform(&["verify", "--json", p(&good), p(&text)]);
    assert!(
        stderr(&o).contains("1 passed, 0 failed, 1 unusable"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn verify_of_a_missing_path_prints_no_empty_table_and_counts_it() {
    let dir = tempfile::tempdir().unwrap();
    let gone = dir.path().join("gone.safetensors");
    let o = conform(&["verify", p(&gone)]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(stdout(&o), "0 passed, 0 failed, 1 unusable\n");
    assert!(stderr(&o).contains(p(&gone)), "{}", stderr(&o));
}

#[test]
fn run_counts_unusable_cases() {
    let dir = tempfile::tempdir().unwrap();
    write_case(dir.path(), "good", &cumsum_by("x", 1));
    std::fs::write(dir.path().join("cumsum/bad.safetensors"), b"garbage").unwrap();
    let o = conform(&["run", "--fixtures", p(dir.path()), "--device", "cpu"]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        last_line(&o),
        "1 passed, 0 failed, 1 unusable",
        "{}",
        stdout(&o)
    );
}

/// The installed binary outside a checkout: no flag, no `$ATTN_FIXTURES`, no
/// `$CARGO_MANIFEST_DIR`, no `./fixtures`.
fn run_outside(args: &[&str]) -> Output {
    let cwd = tempfile::tempdir().unwrap();
    Command::new(env!("CARGO_BIN_EXE_attn-conform"))
        .args(args)
        .current_dir(cwd.path())
        .env_remove("ATTN_FIXTURES")
        .env_remove("CARGO_MANIFEST_DIR")
        .output()
        .unwrap()
}

#[test]
fn run_outside_a_checkout_lists_every_place_looked_as_help_does() {
    for device in [&[][..], &["--device", "all"][..], &["--device", "gpu"][..]] {
        let o = run_outside(&[&["run"][..], device].concat());
        assert_eq!(o.status.code(), Some(2));
        let err = stderr(&o);
        // the real error first: no GPU note or error before it
        assert!(
            err.starts_with("error: fixtures folder not found; looked in:"),
            "{device:?}: {err}"
        );
        assert!(!err.contains("note:") && !err.contains("GPU"), "{err}");
        for place in [
            "$CARGO_MANIFEST_DIR/../fixtures, beside the crate: $CARGO_MANIFEST_DIR is not set",
            "fixtures (./fixtures, in the working directory): not a folder",
            "pass --fixtures DIR or set ATTN_FIXTURES=DIR",
        ] {
            assert!(err.contains(place), "`{place}` in {err}");
        }
    }
    let help = stdout(&run_outside(&["run", "--help"]));
    for place in [
        "$ATTN_FIXTURES",
        "$CARGO_MANIFEST_DIR/../fixtures",
        "./fixtures",
    ] {
        assert!(help.contains(place), "`{place}` in {help}");
    }
    let o = run_outside(&["report", "no_such_folder"]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(stderr(&o), "error: no_such_folder: not a folder\n");
    let report = run_outside(&["report"]);
    assert_eq!(report.status.code(), Some(2));
    assert!(
        stderr(&report).contains("$CARGO_MANIFEST_DIR/../fixtures"),
        "{}",
        stderr(&report)
    );
}

#[test]
fn every_json_flag_has_help() {
    for cmd in ["verify", "run", "list"] {
        let help = stdout(&conform(&[cmd, "--help"]));
        let line = help
            .lines()
            .find(|l| l.trim_start().starts_with("--json"))
            .unwrap_or_else(|| panic!("{cmd}: {help}"));
        assert!(line.contains("JSON"), "{cmd}: {line}");
    }
}

/// Without a GPU, `run` without `--device` says no GPU kernel runs without naming a flag the
/// user did not pass; `verify` (default cpu) says nothing about GPUs.
#[test]
fn the_gpu_note_names_only_flags_the_user_passed() {
    let Err(why) = gpu_status() else {
        eprintln!("a GPU answers: the no-GPU note is not tested here");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let f = write_case(dir.path(), "good", &cumsum_by("x", 1));
    let o = conform(&["run", "--fixtures", p(dir.path())]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("note: no GPU kernel runs") && err.contains(&why),
        "{err}"
    );
    assert!(!err.contains("--device all"), "{err}");
    let o = conform(&["verify", p(&f)]);
    assert!(!stderr(&o).contains("GPU"), "{}", stderr(&o));
}

/// The cells of each row of a plain table (columns two or more spaces apart).
fn rows(table: &str) -> Vec<Vec<String>> {
    table
        .lines()
        .map(|l| {
            l.split("  ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(String::from)
                .collect()
        })
        .collect()
}

#[test]
fn report_tallies_cases_per_implementation_and_op() {
    let dir = tempfile::tempdir().unwrap();
    write_case(dir.path(), "a", &cumsum_by("fla-triton", 1));
    write_case(dir.path(), "b", &broken(cumsum_by("fla-triton", 2)));
    let mut scan = valid_cases(3).remove(1);
    assert_eq!(scan.op, "chunk_local_cumsum");
    scan.source["impl"] = "torch".into();
    write_case(dir.path(), "c", &scan);
    std::fs::write(dir.path().join("cumsum/z.safetensors"), b"garbage").unwrap();

    let o = conform(&["report", p(dir.path())]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let table = rows(&stdout(&o));
    assert_eq!(
        table[0],
        [
            "implementation",
            "op",
            "cases",
            "passed",
            "failed",
            "unusable",
            "worst ratio / threshold"
        ]
    );
    let line = |implementation: &str| {
        table
            .iter()
            .find(|r| r[0] == implementation)
            .unwrap_or_else(|| panic!("{implementation}: {table:?}"))
            .clone()
    };
    let fla = line("fla-triton");
    assert_eq!(fla[1..6], ["cumsum", "2", "1", "1", "0"], "{fla:?}");
    assert!(fla[6].parse::<f64>().unwrap() > 1.0, "{fla:?}");
    let torch = line("torch");
    assert_eq!(torch[1..6], ["chunk_local_cumsum", "1", "1", "0", "0"]);
    assert!(torch[6].parse::<f64>().unwrap_or(0.0) < 1.0, "{torch:?}");
    assert_eq!(line("?")[1..6], ["?", "1", "0", "0", "1"]);
    assert!(stderr(&o).contains("z.safetensors"), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("2 passed, 1 failed, 1 unusable"),
        "{}",
        stderr(&o)
    );

    let md = stdout(&conform(&["report", "--markdown", p(dir.path())]));
    assert!(md.starts_with("| implementation | op | cases |"), "{md}");
    assert!(md.lines().nth(1).unwrap().starts_with("| --- |"), "{md}");
    assert!(
        md.contains("| fla-triton | cumsum | 2 | 1 | 1 | 0 |"),
        "{md}"
    );
    let html = stdout(&conform(&["report", "--html", p(dir.path())]));
    assert!(html.starts_with("<!DOCTYPE html>"), "{html}");
    assert!(
        html.contains("<td>fla-triton</td><td>cumsum</td><td>2</td>"),
        "{html}"
    );
    // the default folder is the one `run` finds
    let o = Command::new(env!("CARGO_BIN_EXE_attn-conform"))
        .arg("report")
        .env("ATTN_FIXTURES", dir.path())
        .output()
        .unwrap();
    assert_eq!(rows(&stdout(&o)), table);
}

#[test]
fn report_of_passing_cases_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    write_case(dir.path(), "a", &cumsum_by("fla-naive", 4));
    let o = conform(&["report", p(dir.path())]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let table = rows(&stdout(&o));
    assert_eq!(table[1][..6], ["fla-naive", "cumsum", "1", "1", "0", "0"]);
}

/// README.md's "Conformance report" table is `report --markdown` of the committed fixtures
/// (regenerate it when they change).
#[test]
fn the_readme_shows_the_report_of_the_committed_fixtures() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let o = conform(&["report", "--markdown", p(&root.join("fixtures"))]);
    let table = stdout(&o);
    assert!(table.starts_with("| implementation |"), "{}", stderr(&o));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    assert!(
        readme.contains(&table),
        "README.md's report differs from `attn-conform report --markdown fixtures`:\n{table}"
    );
}
