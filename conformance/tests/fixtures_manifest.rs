//! Every fixture the manifest lists exists, is intact and passes `verify` on the CPU; every
//! fixture file is listed. Without a manifest yet (no fixtures committed), says so and passes.

use attn_conformance::app::verify_file;
use attn_conformance::fixtures::{case_files, fixtures_dir, Manifest, Manifests};
use attn_conformance::verify::Selection;

#[test]
fn committed_fixtures_pass_verify() {
    let dir = fixtures_dir(None);
    let Some(manifest) = Manifest::read(&dir).unwrap() else {
        eprintln!(
            "no {}/MANIFEST.json yet: no fixture to check",
            dir.display()
        );
        return;
    };
    let mut manifests = Manifests::default();
    let mut failures = Vec::new();
    for e in &manifest.files {
        let path = dir.join(&e.path);
        assert!(
            path.is_file(),
            "{} is listed in the manifest but missing",
            path.display()
        );
        match verify_file(&path, &mut manifests, Selection::Cpu) {
            Err(err) => failures.push(err.to_string()),
            Ok((op, rows)) => {
                assert_eq!(op, e.op, "{}: manifest op", e.path);
                assert!(!rows.is_empty(), "{}: no output compared", e.path);
                failures.extend(rows.iter().filter(|r| !r.pass).map(|r| format!("{r:?}")));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    eprintln!(
        "{} fixtures of {} pass verify",
        manifest.files.len(),
        dir.display()
    );
    for f in case_files(std::slice::from_ref(&dir)).unwrap() {
        let rel = f.strip_prefix(&dir).unwrap();
        assert!(
            manifest.entry(rel).is_some(),
            "{} is not in the manifest",
            f.display()
        );
    }
}
