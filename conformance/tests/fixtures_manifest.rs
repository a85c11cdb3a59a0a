//! Every fixture the manifest lists exists, is intact and passes `verify` on the CPU (except a
//! fixture marked `known_failure`, which must fail: it shows an upstream implementation's
//! failure); every fixture file is listed; and a committed fixture with one expected value
//! changed fails.

use attn_conformance::app::verify_file;
use attn_conformance::fixtures::{case_files, fixtures_dir, Manifest, Manifests};
use attn_conformance::verify::Selection;
use attn_conformance::{Case, Tensor};

#[test]
fn committed_fixtures_pass_verify() {
    let dir = fixtures_dir(None);
    let manifest = Manifest::read(&dir)
        .unwrap()
        .unwrap_or_else(|| panic!("no {}/MANIFEST.json: fixtures are missing", dir.display()));
    assert!(!manifest.files.is_empty(), "the manifest lists no fixture");
    let mut manifests = Manifests::default();
    let mut failures = Vec::new();
    let mut known = Vec::new();
    for e in &manifest.files {
        let path = dir.join(&e.path);
        assert!(
            path.is_file(),
            "{} is listed in the manifest but missing",
            path.display()
        );
        let known_failure = Case::read(&path)
            .ok()
            .and_then(|c| c.known_failure().map(str::to_string));
        match verify_file(&path, &mut manifests, Selection::Cpu) {
            Err(err) => failures.push(err.to_string()),
            Ok((op, rows)) => {
                assert_eq!(op, e.op, "{}: manifest op", e.path);
                assert!(!rows.is_empty(), "{}: no output compared", e.path);
                let failed: Vec<_> = rows.iter().filter(|r| !r.pass).collect();
                match (&known_failure, failed.is_empty()) {
                    (Some(_), true) => failures.push(format!(
                        "{}: marked known_failure but passes now: regenerate it \
                         (tools/gen_fixtures.py) or drop the mark",
                        e.path
                    )),
                    (Some(why), false) => known.push(format!("{}: {why}", e.path)),
                    (None, _) => failures.extend(failed.iter().map(|r| format!("{r:?}"))),
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    eprintln!(
        "{} fixtures of {} pass verify, {} of them known failures (they fail, as marked)",
        manifest.files.len() - known.len(),
        dir.display(),
        known.len()
    );
    for k in &known {
        eprintln!("known failure: {k}");
    }
    for f in case_files(std::slice::from_ref(&dir)).unwrap() {
        let rel = f.strip_prefix(&dir).unwrap();
        assert!(
            manifest.entry(rel).is_some(),
            "{} is not in the manifest",
            f.display()
        );
    }
}

/// One committed fixture of every op that has fixtures, with one element of one float output
/// moved far beyond any threshold (and the manifest out of the way), fails `verify`.
#[test]
fn a_changed_committed_fixture_fails_verify() {
    let dir = fixtures_dir(None);
    let manifest = Manifest::read(&dir)
        .unwrap()
        .expect("fixtures/MANIFEST.json");
    let tmp = tempfile::tempdir().unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for (i, e) in manifest.files.iter().enumerate() {
        if !seen.insert(e.op.clone()) {
            continue;
        }
        let mut case = Case::read(dir.join(&e.path)).unwrap();
        let Some((name, t)) = case
            .outputs
            .iter_mut()
            .find(|(_, t)| t.dtype().is_float() && !t.is_empty())
        else {
            continue;
        };
        let name = name.clone();
        let mut a = t.widen_f64();
        let at = (i * 7919) % a.len();
        let v = a.iter_mut().nth(at).unwrap();
        *v = if v.is_finite() {
            *v + 1.0 + 10.0 * v.abs()
        } else {
            0.0
        };
        *t = Tensor::from_f64(&a, t.dtype());
        let bad = tmp.path().join(format!("{}.safetensors", e.op));
        case.write(&bad).unwrap();
        let (_, rows) = verify_file(&bad, &mut Manifests::default(), Selection::Cpu).unwrap();
        let failed: Vec<_> = rows.iter().filter(|r| !r.pass).collect();
        assert!(
            !failed.is_empty(),
            "{}: changing {name}[{at}] still passes",
            e.path
        );
    }
    assert!(seen.len() >= 7, "fixtures cover only {} ops", seen.len());
}
