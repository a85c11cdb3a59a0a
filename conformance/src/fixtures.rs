//! Locating fixtures at run time, and `fixtures/MANIFEST.json`:
//! `{"format":"attn-fixtures/1","files":[{"path":"<op>/<case>.safetensors","sha256":"<hex>",
//! "op":"<op>","impl":"<source.impl>","description":"..."}]}`, paths relative to the manifest's
//! folder. A file whose sha256 differs from its manifest entry is corrupted.

use crate::error::{Problem, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The manifest's file name, in the fixtures folder.
pub const MANIFEST: &str = "MANIFEST.json";
/// The value of the manifest's `format`.
pub const MANIFEST_FORMAT: &str = "attn-fixtures/1";
/// The environment variable naming the fixtures folder.
pub const FIXTURES_ENV: &str = "ATTN_FIXTURES";

/// Where `run` and `report` look for the fixtures folder, in words (their `--help` and the
/// not-found message say the same).
pub const FIXTURES_HELP: &str = "The fixtures folder (default: $ATTN_FIXTURES when set, else \
     $CARGO_MANIFEST_DIR/../fixtures when cargo runs the command in a checkout, else ./fixtures)";

/// One place the fixtures folder is looked for: where the path comes from, in words, and the
/// path (`None`: the variable it comes from is not set).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    pub from: &'static str,
    pub path: Option<PathBuf>,
}

/// The places [`fixtures_dir`] looks, in order: only `cli` when given, else only
/// `$ATTN_FIXTURES` when set, else `$CARGO_MANIFEST_DIR/../fixtures` (set when cargo runs the
/// command) and `./fixtures`.
pub fn fixtures_places(cli: Option<&Path>) -> Vec<Place> {
    if let Some(p) = cli {
        return vec![Place {
            from: "given by --fixtures",
            path: Some(p.to_path_buf()),
        }];
    }
    if let Some(p) = std::env::var_os(FIXTURES_ENV).filter(|p| !p.is_empty()) {
        return vec![Place {
            from: "from $ATTN_FIXTURES",
            path: Some(PathBuf::from(p)),
        }];
    }
    vec![
        Place {
            from: "$CARGO_MANIFEST_DIR/../fixtures, beside the crate",
            path: std::env::var_os("CARGO_MANIFEST_DIR")
                .map(|dir| Path::new(&dir).join("..").join("fixtures")),
        },
        Place {
            from: "./fixtures, in the working directory",
            path: Some(PathBuf::from("fixtures")),
        },
    ]
}

/// No fixtures folder at any of the places looked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct NotFound(pub Vec<Place>);

impl std::fmt::Display for NotFound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("fixtures folder not found; looked in:")?;
        for p in &self.0 {
            match &p.path {
                Some(path) => write!(f, "\n  {} ({}): not a folder", path.display(), p.from)?,
                None => write!(f, "\n  {}: $CARGO_MANIFEST_DIR is not set", p.from)?,
            }
        }
        write!(
            f,
            "\npass --fixtures DIR or set {FIXTURES_ENV}=DIR (the fixtures/ folder of a checkout)"
        )
    }
}

/// The first of [`fixtures_places`] that is a folder, and where it came from in words.
pub fn fixtures_lookup(cli: Option<&Path>) -> Result<(PathBuf, &'static str), NotFound> {
    let places = fixtures_places(cli);
    places
        .iter()
        .find_map(|p| {
            p.path
                .as_ref()
                .filter(|d| d.is_dir())
                .map(|d| (d.clone(), p.from))
        })
        .ok_or(NotFound(places))
}

/// The fixtures folder ([`fixtures_lookup`]), or the last place looked when none exists.
pub fn fixtures_dir(cli: Option<&Path>) -> PathBuf {
    fixtures_lookup(cli).map_or_else(
        |NotFound(places)| {
            places
                .into_iter()
                .rev()
                .find_map(|p| p.path)
                .unwrap_or_else(|| PathBuf::from("fixtures"))
        },
        |(dir, _)| dir,
    )
}

/// One file of the manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestEntry {
    pub path: String,
    pub sha256: String,
    pub op: String,
    #[serde(rename = "impl")]
    pub impl_name: String,
    pub description: String,
}

/// `MANIFEST.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub files: Vec<ManifestEntry>,
}

impl Manifest {
    /// Reads `dir/MANIFEST.json`; `Ok(None)` when there is none.
    pub fn read(dir: &Path) -> Result<Option<Manifest>> {
        let path = dir.join(MANIFEST);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Problem::Io(e).at(&path)),
        };
        let m: Manifest = serde_json::from_str(&text)
            .map_err(|e| Problem::BadManifest(e.to_string()).at(&path))?;
        if m.format != MANIFEST_FORMAT {
            let msg = format!("`format` is {:?}, expected {MANIFEST_FORMAT:?}", m.format);
            return Err(Problem::BadManifest(msg).at(&path));
        }
        Ok(Some(m))
    }

    /// The entry of `rel` (a path relative to the manifest's folder).
    pub fn entry(&self, rel: &Path) -> Option<&ManifestEntry> {
        self.files.iter().find(|e| Path::new(&e.path) == rel)
    }
}

/// Lowercase hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Every `.safetensors` file under `paths` (folders walked recursively, files taken as given),
/// sorted within each folder.
pub fn case_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            walk(p, &mut out)?;
        } else {
            out.push(p.clone());
        }
    }
    Ok(out)
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let rd = std::fs::read_dir(dir).map_err(|e| Problem::Io(e).at(dir))?;
    let mut entries = rd
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<Vec<_>>>()
        .map_err(|e| Problem::Io(e).at(dir))?;
    entries.sort();
    for p in entries {
        if p.is_dir() {
            walk(&p, out)?;
        } else if p.extension().is_some_and(|e| e == "safetensors") {
            out.push(p);
        }
    }
    Ok(())
}

/// The manifests of the folders a run touches, each read once.
#[derive(Debug, Default)]
pub struct Manifests {
    by_dir: HashMap<PathBuf, Option<Manifest>>,
}

impl Manifests {
    fn get(&mut self, dir: &Path) -> Result<Option<&Manifest>> {
        if !self.by_dir.contains_key(dir) {
            let m = Manifest::read(dir)?;
            self.by_dir.insert(dir.to_path_buf(), m);
        }
        Ok(self.by_dir.get(dir).and_then(Option::as_ref))
    }

    /// Checks the bytes of case file `file` against the nearest manifest (in its folder or an
    /// ancestor): a sha256 different from the file's entry is [`Problem::Corrupted`]. A file that
    /// manifest does not list (a kernel author's own case) is not checked.
    pub fn check(&mut self, file: &Path, bytes: &[u8]) -> Result<()> {
        let abs = std::path::absolute(file).map_err(|e| Problem::Io(e).at(file))?;
        for dir in abs.ancestors().skip(1) {
            let Some(m) = self.get(dir)? else { continue };
            let Ok(rel) = abs.strip_prefix(dir) else {
                continue;
            };
            if let Some(e) = m.entry(rel) {
                let got = sha256_hex(bytes);
                if !got.eq_ignore_ascii_case(&e.sha256) {
                    let expected = e.sha256.clone();
                    return Err(Problem::Corrupted { expected, got }.at(file));
                }
            }
            return Ok(());
        }
        Ok(())
    }

    /// Files listed in `dir`'s manifest (if any) that are missing, as errors naming them.
    pub fn missing(&mut self, dir: &Path) -> Result<Vec<crate::Error>> {
        let manifest = dir.join(MANIFEST);
        let Some(m) = self.get(dir)? else {
            return Ok(Vec::new());
        };
        Ok(m.files
            .iter()
            .map(|e| dir.join(&e.path))
            .filter(|p| !p.is_file())
            .map(|p| {
                Problem::MissingFixture {
                    manifest: manifest.clone(),
                }
                .at(p)
            })
            .collect())
    }
}
