//! The module layout the README promises: inside `attn-gpu` and `attn-conformance` the modules
//! form a one-way stack (no module reaches, through `crate::` or `super::` paths, a module that
//! reaches it back), and every op family module under `conformance/src/ops/` holds the registry
//! entries of its ops beside their runners.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Module path (`ops::device`) -> source text without comment lines, for every `.rs` below `src`
/// except the crate roots.
fn modules(src: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p: PathBuf = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
                continue;
            }
            if p.extension().is_none_or(|x| x != "rs") {
                continue;
            }
            let rel = p.strip_prefix(src).unwrap().with_extension("");
            let name = rel.to_string_lossy().replace("/mod", "").replace('/', "::");
            if name == "lib" || name == "main" {
                continue;
            }
            let text = std::fs::read_to_string(&p).unwrap();
            let code = text.split("#[cfg(test)]").next().unwrap();
            let code: Vec<&str> = code
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .collect();
            out.insert(name, code.join("\n"));
        }
    }
    out
}

/// The modules each module names through `crate::a(::b)` or `super::b`.
fn edges(mods: &BTreeMap<String, String>) -> BTreeMap<String, BTreeSet<String>> {
    let resolve = |path: &str| -> Option<String> {
        let two: Vec<&str> = path.splitn(3, "::").take(2).collect();
        let full = two.join("::");
        [full, two[0].to_string()]
            .into_iter()
            .find(|c| mods.contains_key(c))
    };
    let mut g = BTreeMap::new();
    for (name, code) in mods {
        let parent = name.rsplit_once("::").map(|(p, _)| p.to_string());
        let mut deps = BTreeSet::new();
        for (prefix, base) in [("crate::", None), ("super::", parent.clone())] {
            for (i, _) in code.match_indices(prefix) {
                let before = code[..i].chars().last();
                if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                    continue;
                }
                let rest: String = code[i + prefix.len()..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
                    .collect();
                let path = match &base {
                    Some(p) => format!("{p}::{rest}"),
                    None if prefix == "super::" => continue,
                    None => rest,
                };
                // `use super::{a, b}` names the parent module itself
                let target = resolve(&path).or_else(|| base.clone());
                if let Some(t) = target.filter(|t| t != name) {
                    deps.insert(t);
                }
            }
        }
        g.insert(name.clone(), deps);
    }
    g
}

/// A circle of modules, if there is one.
fn circle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == n) {
            return Some(path[at..].to_vec());
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_string());
        for d in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(d, g, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    g.keys()
        .find_map(|n| visit(n, g, &mut Vec::new(), &mut done))
}

fn crate_src(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(name)
        .join("src")
}

#[test]
fn modules_form_a_one_way_stack() {
    for krate in ["gpu", "conformance", "reference"] {
        let g = edges(&modules(&crate_src(krate)));
        assert!(g.len() > 3, "{krate}: too few modules found");
        assert_eq!(circle(&g), None, "{krate}: import circle");
    }
}

#[test]
fn the_circle_finder_finds_a_planted_circle() {
    let mods: BTreeMap<String, String> = [
        ("a", "use crate::b::X;"),
        ("b", "use crate::c;"),
        ("c", "fn f() { crate::a::g() }"),
        ("d", "use crate::a;"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let c = circle(&edges(&mods)).expect("a circle");
    assert_eq!(c.len(), 3, "{c:?}");
    let mut without = mods.clone();
    without.insert("c".into(), "fn f() {}".into());
    assert_eq!(circle(&edges(&without)), None);
}

#[test]
fn every_family_module_holds_entries_and_runners_side_by_side() {
    let ops = modules(&crate_src("conformance"));
    let families: Vec<_> = ops
        .iter()
        .filter(|(n, _)| n.starts_with("ops::") && n.as_str() != "ops::device")
        .collect();
    assert!(families.len() >= 4);
    for (name, code) in families {
        assert!(
            code.contains("pub const OPS: &[OpSpec]"),
            "{name}: no OPS table"
        );
        for entry in code.split(": OpSpec = OpSpec {").skip(1) {
            let Some(id) = entry.split("id: \"").nth(1) else {
                continue;
            };
            let id = &id[..id.find('"').unwrap()];
            assert!(
                code.contains(&format!("fn {id}_cpu(")),
                "{name}: `{id}` has no CPU runner here"
            );
            if entry.contains("gpu: Some(") {
                assert!(
                    code.contains(&format!("fn {id}_gpu(")),
                    "{name}: `{id}`'s GPU runner is not here"
                );
            }
            if entry.contains("cp: Some(") {
                assert!(
                    code.contains(&format!("fn {id}_cp(")),
                    "{name}: `{id}`'s context-parallel runner is not here"
                );
            }
        }
    }
}
