//! The spec is in the repository (`conformance/spec/`) and every citation of it resolves in the
//! clone: the documentation, the sources, the kernels, the Python package and the tools name
//! spec files by paths that exist from the repository root (`conformance/spec/ops-nsa.md`; the
//! spec's own files may name each other by file name), never the steering repository's shared
//! copy outside the clone, and every `§N` / `§N.M` written on the same line as an `ops-*.md`
//! file name is a numbered heading (`## N.` or `### N.M`) of that file. A failure names
//! `file:line` and the citation.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The folders and files walked, relative to the repository root.
const ROOTS: &[&str] = &[
    "README.md",
    "NOTES.md",
    "conformance",
    "reference",
    "gpu",
    "tools",
    "testkit",
];
/// Text files by extension; everything else (case files, JSON results, ...) is skipped.
const TEXT: &[&str] = &["rs", "md", "py", "pyi", "sh", "toml", "cu", "cuh"];
/// Folders never walked: build outputs, the binary fixtures, recorded benchmark output.
const SKIP_DIRS: &[&str] = &["target", "fixtures", "bench-results", "__pycache__"];
/// This file: its documentation describes the forms it rejects.
const SELF: &str = "conformance/tests/spec_citations.rs";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The repository's text files below [`ROOTS`], as paths relative to `root`.
fn text_files(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo: Vec<PathBuf> = ROOTS.iter().map(PathBuf::from).collect();
    while let Some(rel) = todo.pop() {
        let path = root.join(&rel);
        if path.is_dir() {
            for e in std::fs::read_dir(&path).unwrap() {
                let name = e.unwrap().file_name().to_string_lossy().into_owned();
                if !name.starts_with('.') && !SKIP_DIRS.contains(&name.as_str()) {
                    todo.push(rel.join(name));
                }
            }
        } else if rel
            .extension()
            .is_some_and(|x| TEXT.iter().any(|t| x == *t))
        {
            out.push(rel);
        }
    }
    out.sort();
    out
}

/// The files of the spec folder (`ops-cumsum.md`, `anchors.md`, ...), `README.md` aside: a
/// citation outside the folder must name them by their path from the root.
fn spec_files(spec: &Path) -> BTreeSet<String> {
    std::fs::read_dir(spec)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md") && n != "README.md")
        .collect()
}

/// Section numbers of every `ops-*.md` in `spec`: `"2"` for `## 2. ...`, `"4.1"` for
/// `### 4.1 ...`.
fn headings(spec: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(spec).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        if !(name.starts_with("ops-") && name.ends_with(".md")) {
            continue;
        }
        let text = std::fs::read_to_string(spec.join(&name)).unwrap();
        let numbers = text
            .lines()
            .filter_map(|l| l.strip_prefix("### ").or_else(|| l.strip_prefix("## ")))
            .filter_map(|rest| rest.split_whitespace().next())
            .map(|w| w.trim_end_matches('.'))
            .filter(|w| !w.is_empty() && w.chars().all(|c| c.is_ascii_digit() || c == '.'))
            .map(String::from)
            .collect();
        out.insert(name, numbers);
    }
    out
}

fn path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '-')
}

/// The path-like words of `line` (runs of [`path_char`]) with their byte offsets, trailing dots
/// (sentence ends) removed.
fn words(line: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in line.char_indices().chain([(line.len(), ' ')]) {
        match (path_char(c), start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                out.push((s, line[s..i].trim_end_matches('.')));
                start = None;
            }
            _ => {}
        }
    }
    out
}

/// What the checker knows of the spec folder.
struct Spec {
    /// Its files but `README.md` ([`spec_files`]).
    files: BTreeSet<String>,
    /// The section numbers of its `ops-*.md` files ([`headings`]).
    sections: BTreeMap<String, BTreeSet<String>>,
}

impl Spec {
    fn read(root: &Path) -> Spec {
        let dir = root.join("conformance/spec");
        Spec {
            files: spec_files(&dir),
            sections: headings(&dir),
        }
    }
}

/// What is wrong with the spec citations of one line (empty when nothing is): paths with a
/// `spec/` component that do not exist from `root` (or leave the clone), a spec file named other
/// than by its path `conformance/spec/<name>` (allowed `in_spec`, inside the folder itself),
/// `ops-*.md` names that are not files of the folder, and `§` numbers that are not headings of
/// the `ops-*.md` named before them on the line (or, when none is before, of the first one
/// after).
fn line_problems(line: &str, root: &Path, spec: &Spec, in_spec: bool) -> Vec<String> {
    let sections = &spec.sections;
    let mut out = Vec::new();
    let shared = ["..", "shared", "spec"].join("/");
    if line.contains(&shared) || line.contains("shared/spec") {
        out.push("cites the shared spec outside the clone: cite conformance/spec/".to_string());
    }
    let mut ops = Vec::new();
    for (at, word) in words(line) {
        let is_spec_path = word.starts_with("spec/") || word.contains("/spec/");
        let is_spec_dir = word == "conformance/spec" || word == "conformance/spec/";
        if (is_spec_path || is_spec_dir)
            && !word.starts_with('/')
            && !word.contains("shared/spec")
            && (word.contains("..") || !root.join(word).exists())
        {
            out.push(format!("`{word}` does not exist in the clone"));
        }
        let name = word.rsplit('/').next().unwrap_or(word);
        let path = format!("conformance/spec/{name}");
        if !in_spec && spec.files.contains(name) && word != path {
            out.push(format!(
                "`{word}` is not a path in the clone: cite `{path}`"
            ));
        }
        if name.starts_with("ops-") && name.ends_with(".md") {
            if !sections.contains_key(name) {
                out.push(format!("`{name}` is not a file of conformance/spec/"));
            }
            ops.push((at, name));
        }
    }
    let Some(&(_, first)) = ops.first() else {
        return out;
    };
    for (at, _) in line.match_indices('§') {
        let rest = &line[at + '§'.len_utf8()..];
        let number: String = rest
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        let number = number.trim_end_matches('.');
        if number.is_empty() {
            continue;
        }
        let file = ops
            .iter()
            .rev()
            .find(|(o, _)| *o < at)
            .map_or(first, |&(_, n)| n);
        if sections.get(file).is_some_and(|s| !s.contains(number)) {
            out.push(format!("§{number} is not a section heading of `{file}`"));
        }
    }
    out
}

#[test]
fn every_spec_citation_resolves_in_the_clone() {
    let root = repo_root();
    let spec = Spec::read(&root);
    for f in [
        "ops-cumsum.md",
        "ops-decode.md",
        "ops-delta-rule.md",
        "ops-nsa.md",
    ] {
        assert!(
            spec.sections.contains_key(f),
            "conformance/spec/{f} is missing"
        );
    }
    for f in ["README.md", "fixture-format.md", "anchors.md"] {
        assert!(
            root.join("conformance/spec").join(f).is_file(),
            "conformance/spec/{f} is missing"
        );
    }
    let files = text_files(&root);
    assert!(
        files
            .iter()
            .any(|f| f.ends_with("conformance/src/compare.rs")),
        "the walk found no sources under {}",
        root.display()
    );
    let mut problems = Vec::new();
    for rel in files.iter().filter(|f| !f.ends_with(SELF)) {
        let text = std::fs::read_to_string(root.join(rel)).unwrap();
        let in_spec = rel.starts_with("conformance/spec");
        for (n, line) in text.lines().enumerate() {
            for p in line_problems(line, &root, &spec, in_spec) {
                problems.push(format!("{}:{}: {p}", rel.display(), n + 1));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{} bad spec citations:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// The checker itself, on lines with known faults and on good ones: each fault is reported,
/// and nothing else.
#[test]
fn the_checker_reports_each_kind_of_bad_citation() {
    let root = repo_root();
    let spec = Spec::read(&root);
    let check = |line: &str| line_problems(line, &root, &spec, false);
    let good = [
        "see `conformance/spec/ops-delta-rule.md` §6.4 and §2",
        "(spec `conformance/spec/ops-nsa.md` §2-§7, §9.)",
        "`conformance/spec/ops-cumsum.md` §4, then `conformance/spec/ops-nsa.md` §4.1",
        "the case format, `conformance/spec/fixture-format.md`.",
        "`crate::spec::OpSpec` and spec.loader are no paths; §99 without a file is not checked",
    ];
    for line in good {
        assert_eq!(check(line), Vec::<String>::new(), "{line}");
    }
    let shared = ["..", "shared", "spec", "fixture-format.md"].join("/");
    let bad = [
        (format!("`{shared}`"), "outside the clone"),
        ("`spec/fixture-format.md`".to_string(), "does not exist"),
        (
            "`conformance/spec/ops-foo.md`".to_string(),
            "does not exist",
        ),
        ("`ops-foo.md` §1".to_string(), "not a file of"),
        (
            "(spec `ops-nsa.md` §9)".to_string(),
            "cite `conformance/spec/ops-nsa.md`",
        ),
        (
            "`tools/anchors.md`".to_string(),
            "cite `conformance/spec/anchors.md`",
        ),
        ("`conformance/spec/ops-nsa.md` §4.7".to_string(), "§4.7"),
        (
            "`conformance/spec/ops-cumsum.md` §4, `conformance/spec/ops-delta-rule.md` §12".into(),
            "§12",
        ),
        ("§12 of `conformance/spec/ops-decode.md`".to_string(), "§12"),
    ];
    for (line, want) in bad {
        let got = check(&line);
        assert!(got.iter().any(|p| p.contains(want)), "{line}: {got:?}");
    }
    // inside the spec folder its files name each other by file name
    let in_spec = "as `ops-cumsum.md` §4 says; case files follow `fixture-format.md`";
    assert_eq!(
        line_problems(in_spec, &root, &spec, true),
        Vec::<String>::new()
    );
    assert!(!check(in_spec).is_empty());
}
