//! `attn-case/1` files (`conformance/spec/fixture-format.md`): one call of one op, its inputs
//! `in.<arg>`, its parameters and the outputs `out.<name>` some implementation produced, in one
//! safetensors file whose `__metadata__` holds `format`, `op`, `params`, `source`, `tolerance` and
//! `note`.
//!
//! This layer knows nothing of ops: it reads and writes the format and hands back named tensors,
//! parameters and metadata. Binding a case to its op is [`crate::registry`]'s.

use crate::error::{Problem, Result};
use crate::tensor::{from_st_dtype, to_st_dtype, Tensor};
use safetensors::tensor::{SafeTensors, TensorView};
use serde_json::{Map, Value};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// The value of the `format` metadata key.
pub const FORMAT: &str = "attn-case/1";
const KNOWN_KEYS: [&str; 6] = ["format", "op", "params", "source", "tolerance", "note"];

/// Named tensors (inputs or outputs), without their `in.`/`out.` prefix.
pub type Tensors = BTreeMap<String, Tensor>;

/// One case: an op call and the outputs some implementation produced for it.
#[derive(Debug, Clone, PartialEq)]
pub struct Case {
    /// Where it was read from (empty for a case built in memory).
    pub path: PathBuf,
    pub op: String,
    /// The `params` object as given; absent keys take the op's defaults ([`Case::params`]).
    pub params: Map<String, Value>,
    /// Who computed the outputs: a JSON object with at least a string `impl`.
    pub source: Value,
    /// Per-output threshold overrides.
    pub tolerance: BTreeMap<String, f64>,
    pub note: Option<String>,
    /// Metadata keys this format does not define: kept (and written back), otherwise ignored.
    pub extra: BTreeMap<String, String>,
    pub inputs: Tensors,
    pub outputs: Tensors,
}

impl Case {
    /// A case with no tensors, parameters or overrides, whose outputs came from `impl_name`.
    pub fn new(op: &str, impl_name: &str) -> Case {
        Case {
            path: PathBuf::new(),
            op: op.into(),
            params: Map::new(),
            source: serde_json::json!({ "impl": impl_name }),
            tolerance: BTreeMap::new(),
            note: None,
            extra: BTreeMap::new(),
            inputs: Tensors::new(),
            outputs: Tensors::new(),
        }
    }

    /// The metadata key `known_failure` (this project's generators write it on a fixture whose
    /// upstream outputs fail the check and are kept to show it, e.g. FlashQLA's): why it fails.
    /// Like every key this format does not define, `verify` ignores it; the test suite requires
    /// such a fixture to keep failing.
    pub fn known_failure(&self) -> Option<&str> {
        self.extra.get("known_failure").map(String::as_str)
    }

    /// `source.impl`.
    pub fn impl_name(&self) -> Option<&str> {
        self.source.get("impl").and_then(Value::as_str)
    }

    /// Reads a case file (the format only: binding it to its op is
    /// [`registry::check`](crate::registry::check)'s); every error names the file.
    pub fn read(path: impl AsRef<Path>) -> Result<Case> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|e| Problem::Io(e).at(path))?;
        Self::from_bytes(path, &bytes)
    }

    /// [`parse`](Case::parse)s the bytes of the case file `path`; the error names the file.
    pub fn from_bytes(path: &Path, bytes: &[u8]) -> Result<Case> {
        Self::parse(path, bytes).map_err(|p| p.at(path))
    }

    /// Parses the bytes of a case file and checks its format: the `format` key, a string `op`,
    /// a `params` object, a `source` object with a string `impl`, positive finite tolerances.
    /// Nothing here knows the ops.
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<Case, Problem> {
        let (_, header) = SafeTensors::read_metadata(bytes)
            .map_err(|e| Problem::NotSafetensors(e.to_string()))?;
        let st =
            SafeTensors::deserialize(bytes).map_err(|e| Problem::NotSafetensors(e.to_string()))?;
        let meta = header.metadata().clone().unwrap_or_default();
        let format = meta.get("format").ok_or(Problem::NoFormat)?;
        if format != FORMAT {
            return Err(Problem::WrongFormat(format.clone()));
        }
        let op = meta.get("op").ok_or(Problem::NoOp)?.clone();
        let params = match meta.get("params") {
            None => Map::new(),
            Some(text) => match json(text, "params", "object")? {
                Value::Object(m) => m,
                v => return Err(not_a("params", "object", &v)),
            },
        };
        let source = json(
            meta.get("source").ok_or(Problem::NoSource)?,
            "source",
            "object",
        )?;
        if !source.is_object() {
            return Err(not_a("source", "object", &source));
        }
        if source.get("impl").and_then(Value::as_str).is_none() {
            return Err(Problem::NoImpl);
        }
        let tolerance = match meta.get("tolerance") {
            None => BTreeMap::new(),
            Some(text) => parse_tolerance(json(text, "tolerance", "object")?)?,
        };
        let mut case = Case {
            path: path.to_path_buf(),
            op,
            params,
            source,
            tolerance,
            note: meta.get("note").cloned(),
            extra: meta
                .iter()
                .filter(|(k, _)| !KNOWN_KEYS.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            inputs: Tensors::new(),
            outputs: Tensors::new(),
        };
        for (name, view) in st.tensors() {
            let tensor = read_tensor(&name, &view)?;
            let slot = if let Some(arg) = name.strip_prefix("in.") {
                case.inputs.insert(arg.to_string(), tensor)
            } else if let Some(out) = name.strip_prefix("out.") {
                case.outputs.insert(out.to_string(), tensor)
            } else {
                return Err(Problem::UnexpectedTensor {
                    name,
                    why: "tensor names start with `in.` or `out.`".into(),
                });
            };
            debug_assert!(slot.is_none(), "safetensors names are unique");
        }
        Ok(case)
    }

    /// The safetensors bytes of this case (written as is, without [`check`](crate::registry::check)).
    /// The `safetensors` crate takes the metadata as a hash map, so the header's key order (and
    /// hence the file's sha256) may differ between two writes of the same case.
    pub fn to_bytes(&self) -> Result<Vec<u8>, Problem> {
        let mut meta: HashMap<String, String> = self.extra.clone().into_iter().collect();
        meta.insert("format".into(), FORMAT.into());
        meta.insert("op".into(), self.op.clone());
        meta.insert(
            "params".into(),
            Value::Object(self.params.clone()).to_string(),
        );
        meta.insert("source".into(), self.source.to_string());
        if !self.tolerance.is_empty() {
            let t: Map<String, Value> = self
                .tolerance
                .iter()
                .map(|(k, &v)| (k.clone(), Value::from(v)))
                .collect();
            meta.insert("tolerance".into(), Value::Object(t).to_string());
        }
        if let Some(note) = &self.note {
            meta.insert("note".into(), note.clone());
        }
        let payloads: Vec<(String, Tensor, Vec<u8>)> = self
            .inputs
            .iter()
            .map(|(n, t)| (format!("in.{n}"), t))
            .chain(self.outputs.iter().map(|(n, t)| (format!("out.{n}"), t)))
            .map(|(n, t)| (n, t.clone(), t.to_le_bytes()))
            .collect();
        let views = payloads
            .iter()
            .map(|(n, t, b)| {
                TensorView::new(to_st_dtype(t.dtype()), t.shape().to_vec(), b)
                    .map(|v| (n.clone(), v))
                    .map_err(|e| Problem::BadTensor {
                        name: n.clone(),
                        msg: e.to_string(),
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        safetensors::serialize(views, Some(meta))
            .map_err(|e| Problem::NotSafetensors(e.to_string()))
    }

    /// Writes this case to `path` (as is: a deliberately bad case can be written for a test).
    pub fn write(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let bytes = self.to_bytes().map_err(|p| p.at(path))?;
        std::fs::write(path, bytes).map_err(|e| Problem::Io(e).at(path))
    }
}

fn json(text: &str, key: &'static str, expected: &'static str) -> Result<Value, Problem> {
    serde_json::from_str(text).map_err(|e| Problem::BadJson {
        key,
        expected,
        msg: e.to_string(),
    })
}

fn not_a(key: &'static str, expected: &'static str, v: &Value) -> Problem {
    Problem::BadJson {
        key,
        expected,
        msg: format!("got {v}"),
    }
}

fn parse_tolerance(v: Value) -> Result<BTreeMap<String, f64>, Problem> {
    let Value::Object(m) = v else {
        return Err(not_a("tolerance", "object", &v));
    };
    m.into_iter()
        .map(|(k, v)| match v.as_f64() {
            Some(t) if t.is_finite() && t > 0.0 => Ok((k, t)),
            Some(t) => Err(Problem::BadTolerance(format!(
                "`{k}`: expected a positive number, got {t}"
            ))),
            None => Err(Problem::BadTolerance(format!(
                "`{k}`: expected a number, got {v}"
            ))),
        })
        .collect()
}

fn read_tensor(name: &str, view: &TensorView<'_>) -> Result<Tensor, Problem> {
    let dtype = from_st_dtype(view.dtype()).ok_or_else(|| Problem::BadTensor {
        name: name.into(),
        msg: format!(
            "dtype {:?} is not one of F64, F32, BF16, F16, I32, I64",
            view.dtype()
        ),
    })?;
    Tensor::from_le_bytes(name, dtype, view.shape(), view.data())
}
