//! `attn-case/1` files (spec `fixture-format.md`): one call of one op, its inputs `in.<arg>`, its
//! parameters and the outputs `out.<name>` some implementation produced, in one safetensors file
//! whose `__metadata__` holds `format`, `op`, `params`, `source`, `tolerance` and `note`.

use crate::error::{Problem, Result};
use crate::params::Params;
use crate::registry::{self, InputKind, OpSpec};
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

    /// `source.impl`.
    pub fn impl_name(&self) -> Option<&str> {
        self.source.get("impl").and_then(Value::as_str)
    }

    /// The op's registry entry.
    pub fn spec(&self) -> Result<&'static OpSpec, Problem> {
        registry::find(&self.op).ok_or_else(|| Problem::UnknownOp(self.op.clone()))
    }

    /// The validated parameters, defaults filled in.
    pub fn params(&self) -> Result<Params, Problem> {
        Params::resolve(&self.op, self.spec()?.params, &self.params)
    }

    /// Checks everything the file format and the registry can tell without running the op:
    /// known op, parameters, `source.impl`, tolerance keys, input and output names, required
    /// inputs, and index-vs-float input dtypes. Shape agreement is the reference's to check
    /// when the op runs.
    pub fn check(&self) -> Result<Params, Problem> {
        let spec = self.spec()?;
        let params = self.params()?;
        if !self.source.is_object() {
            return Err(Problem::BadJson {
                key: "source",
                expected: "object",
                msg: format!("got {}", self.source),
            });
        }
        if self.impl_name().is_none() {
            return Err(Problem::NoImpl);
        }
        for (name, &t) in &self.tolerance {
            if !spec.compares(name) {
                return Err(Problem::BadTolerance(format!(
                    "`{name}` is not an output of `{}` (outputs: {})",
                    self.op,
                    spec.output_names()
                )));
            }
            if !(t.is_finite() && t > 0.0) {
                return Err(Problem::BadTolerance(format!(
                    "`{name}`: expected a positive number, got {t}"
                )));
            }
        }
        for (name, t) in &self.inputs {
            let Some(input) = spec.input(name) else {
                return Err(Problem::UnexpectedTensor {
                    name: format!("in.{name}"),
                    why: format!("inputs of `{}`: {}", self.op, spec.input_names()),
                });
            };
            let ok = match input.kind {
                InputKind::Float => t.dtype().is_float(),
                InputKind::Index => !t.dtype().is_float(),
            };
            if !ok {
                let expected = match input.kind {
                    InputKind::Float => "a float dtype",
                    InputKind::Index => "int32 or int64",
                };
                return Err(attn_reference::Error::dtype(
                    name.as_str(),
                    expected,
                    t.dtype().name(),
                )
                .into());
            }
        }
        if let Some(missing) = spec
            .inputs
            .iter()
            .find(|i| i.required && !self.inputs.contains_key(i.name))
        {
            return Err(Problem::MissingInput(missing.name.into()));
        }
        if let Some(name) = self.outputs.keys().find(|n| spec.output(n).is_none()) {
            return Err(Problem::UnexpectedTensor {
                name: format!("out.{name}"),
                why: format!("outputs of `{}`: {}", self.op, spec.output_names()),
            });
        }
        Ok(params)
    }

    /// Reads and [`check`](Case::check)s a case file; every error names the file.
    pub fn read(path: impl AsRef<Path>) -> Result<Case> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|e| Problem::Io(e).at(path))?;
        Self::from_bytes(path, &bytes)
    }

    /// [`parse`](Case::parse)s and [`check`](Case::check)s the bytes of the case file `path`.
    pub fn from_bytes(path: &Path, bytes: &[u8]) -> Result<Case> {
        let case = Self::parse(path, bytes).map_err(|p| p.at(path))?;
        case.check().map_err(|p| p.at(path))?;
        Ok(case)
    }

    /// Parses the bytes of a case file without [`check`](Case::check)ing it against the registry.
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

    /// The safetensors bytes of this case (written as is, without [`check`](Case::check)).
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
            Some(t) => Ok((k, t)),
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
