//! The registry as a user reads it: every op's contract (inputs with their layouts and dtypes,
//! parameters with their types and defaults, outputs with their layouts, dtypes and when they
//! are present, devices, the spec section), as the JSON of `attn-conform list --json` and
//! `attn_conform.ops()`, and as the text of `attn-conform list [OP]`. Everything here is read from
//! the op entries ([`crate::spec::OpSpec`]); nothing is a second copy.

use crate::registry::OPS;
use crate::spec::{InputKind, OpSpec};
use crate::table;
use serde::Serialize;

/// One input of an op.
#[derive(Debug, Clone, Serialize)]
pub struct InputListing {
    pub name: &'static str,
    pub required: bool,
    /// `float` or `index`.
    pub kind: &'static str,
    pub shape: &'static str,
    pub dtype: &'static str,
}

/// One parameter of an op.
#[derive(Debug, Clone, Serialize)]
pub struct ParamListing {
    pub name: &'static str,
    /// Its JSON type in words, with the allowed strings where it has a list of them.
    #[serde(rename = "type")]
    pub ty: String,
    pub required: bool,
    /// The default value (`null` for a required parameter, or a default of `null`).
    pub default: serde_json::Value,
}

/// One output of an op.
#[derive(Debug, Clone, Serialize)]
pub struct OutputListing {
    pub name: &'static str,
    pub shape: &'static str,
    pub dtype: &'static str,
    /// When the op produces it.
    pub present: &'static str,
    /// Whether a case may leave it out although the op produces it.
    pub optional: bool,
}

/// One op in `list --json` and `attn_conform.ops()`.
#[derive(Debug, Clone, Serialize)]
pub struct OpListing {
    pub op: &'static str,
    pub summary: &'static str,
    pub inputs: Vec<InputListing>,
    pub params: Vec<ParamListing>,
    pub outputs: Vec<OutputListing>,
    pub devices: Vec<&'static str>,
    /// Where the spec defines it: `conformance/spec/<file>.md §N`.
    pub spec: String,
}

impl OpListing {
    /// The listing of one op entry.
    pub fn of(op: &OpSpec) -> OpListing {
        OpListing {
            op: op.id,
            summary: op.summary,
            inputs: op
                .inputs
                .iter()
                .map(|i| InputListing {
                    name: i.name,
                    required: i.required,
                    kind: match i.kind {
                        InputKind::Float => "float",
                        InputKind::Index => "index",
                    },
                    shape: i.shape,
                    dtype: i.dtype,
                })
                .collect(),
            params: op
                .params
                .iter()
                .map(|p| ParamListing {
                    name: p.name,
                    ty: p.ty.describe(),
                    required: p.default.is_none(),
                    default: p.default_value().ok().flatten().unwrap_or_default(),
                })
                .collect(),
            outputs: op
                .outputs
                .iter()
                .map(|o| OutputListing {
                    name: o.name,
                    shape: o.shape,
                    dtype: o.dtype,
                    present: o.present,
                    optional: o.optional,
                })
                .collect(),
            devices: op.devices(),
            spec: op.citation(),
        }
    }

    /// The parameters on one line: `name=default`, or `name (required)`.
    fn params_line(&self) -> String {
        let p: Vec<String> = self
            .params
            .iter()
            .map(|p| match p.required {
                true => format!("{} (required)", p.name),
                false => format!("{}={}", p.name, p.default),
            })
            .collect();
        if p.is_empty() {
            "-".into()
        } else {
            p.join(", ")
        }
    }

    /// The short form of `list`: a header line, then one line per input and output
    /// (`k [B, T, H, K]  float`, `g? ...` for an optional input), the parameters and the spec
    /// section.
    pub fn brief(&self) -> String {
        let mut out = format!(
            "{}  [{}]  {}\n",
            self.op,
            self.devices.join(", "),
            self.summary
        );
        let mut block = |label: &str, lines: Vec<String>| {
            for (n, l) in lines.iter().enumerate() {
                let label = if n == 0 { label } else { "" };
                out += &format!("    {label:<9}{l}\n");
            }
        };
        block(
            "inputs:",
            self.inputs
                .iter()
                .map(|i| {
                    let opt = if i.required { "" } else { "?" };
                    format!("{}{opt} {}  {}", i.name, i.shape, i.dtype)
                })
                .collect(),
        );
        block("params:", vec![self.params_line()]);
        block(
            "outputs:",
            self.outputs
                .iter()
                .map(|o| match o.present {
                    "always" => format!("{} {}  {}", o.name, o.shape, o.dtype),
                    when => format!("{} {}  {} ({when})", o.name, o.shape, o.dtype),
                })
                .collect(),
        );
        block("spec:", vec![self.spec.clone()]);
        out
    }

    /// The whole contract of `list OP`: tables of the inputs, parameters and outputs, the
    /// devices and the spec section.
    pub fn contract(&self) -> String {
        let yes = |b: bool| if b { "yes" } else { "no" }.to_string();
        let inputs: Vec<Vec<String>> = self
            .inputs
            .iter()
            .map(|i| {
                vec![
                    i.name.into(),
                    i.shape.into(),
                    i.dtype.into(),
                    yes(i.required),
                ]
            })
            .collect();
        let params: Vec<Vec<String>> = self
            .params
            .iter()
            .map(|p| {
                let default = match p.required {
                    true => "(required)".to_string(),
                    false => p.default.to_string(),
                };
                vec![p.name.into(), p.ty.clone(), default]
            })
            .collect();
        let outputs: Vec<Vec<String>> = self
            .outputs
            .iter()
            .map(|o| {
                let present = match o.optional {
                    true => format!("{}; a case may leave it out", o.present),
                    false => o.present.to_string(),
                };
                vec![o.name.into(), o.shape.into(), o.dtype.into(), present]
            })
            .collect();
        let mut out = format!("{}: {}\n", self.op, self.summary);
        out += &format!("spec:    {}\n", self.spec);
        out += &format!("devices: {}\n", self.devices.join(", "));
        out += "\ninputs\n";
        out += &indent(&table::plain(
            &["name", "shape", "dtype", "required"],
            &inputs,
        ));
        out += "\nparameters\n";
        out += &if params.is_empty() {
            "  (none)\n".to_string()
        } else {
            indent(&table::plain(&["name", "type", "default"], &params))
        };
        out += "\noutputs\n";
        out += &indent(&table::plain(
            &["name", "shape", "dtype", "present"],
            &outputs,
        ));
        out += &format!(
            "\nthresholds: by the candidate's dtype (and the call, e.g. its length), in {}\n",
            self.spec
        );
        out
    }
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("  {l}\n")).collect()
}

/// Every op of the registry, in its order.
pub fn listing() -> Vec<OpListing> {
    OPS.iter().map(OpListing::of).collect()
}
