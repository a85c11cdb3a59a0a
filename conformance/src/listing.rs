//! The registry as a user reads it: every op's contract (inputs with their layouts and dtypes,
//! parameters with their types and defaults, outputs with their layouts, dtypes and when they
//! are present, devices, the spec section), as the JSON of `attn-conform list --json` and
//! `attn_conform.ops()`, and as the text of `attn-conform list [OP]`. Everything here is read from
//! the op entries ([`crate::spec::OpSpec`]); nothing is a second copy.

use crate::case::Tensors;
use crate::compare::Rule;
use crate::params::{ParamType, Params};
use crate::registry::OPS;
use crate::spec::{InputKind, OpSpec, OutputSpec, RuleFn};
use crate::table;
use crate::tensor::Tensor;
use attn_reference::Dtype;
use ndarray::{ArrayD, IxDyn};
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
    /// How it is compared, per dtype class of the op's inputs (one entry per compared part).
    pub thresholds: Vec<ThresholdListing>,
}

/// How one output (or one part of it, e.g. `hm.b`) is compared: the spec's ratio thresholds
/// (`RMS(ref - x) / RMS(ref) <= threshold`, or `max_abs <= 1e-6`) by the dtype class of the
/// op's inputs, or the exact or index rule.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ThresholdListing {
    /// The compared row: the output's name, or `<output>.<part>`.
    pub name: &'static str,
    /// `threshold` (ratio with the 1e-6 absolute floor), `exact` or `index`.
    pub rule: &'static str,
    /// bfloat16 / float16 inputs (`null` where the rule is not a threshold).
    pub half: Option<f64>,
    /// bfloat16 / float16 inputs of a long call (a sequence over 4096 tokens), where the spec
    /// loosens it; else the same as `half`.
    pub half_long: Option<f64>,
    pub float32: Option<f64>,
    pub float64: Option<f64>,
}

/// The absolute floor of the comparison rule (`conformance/spec/README.md`, "Comparison").
pub const ABS_FLOOR: f64 = 1e-6;

/// Tokens of a long probe call: above the 4096 of `conformance/spec/ops-delta-rule.md` §1.6.
const LONG_PROBE: usize = 4097;

/// The inputs of a threshold probe: every float input of `op`, all of dtype `dtype`, of its
/// first layout's rank, all sizes 1 except the token axis (1) of size `t`.
fn probe_inputs(op: &OpSpec, dtype: Dtype, t: usize) -> Tensors {
    let mut out = Tensors::new();
    for i in op.inputs.iter().filter(|i| i.kind == InputKind::Float) {
        let rank = i.ranks().first().copied().unwrap_or(1);
        let mut shape = vec![1; rank];
        if rank >= 2 {
            shape[1] = t;
        }
        let zeros = ArrayD::<f64>::zeros(IxDyn(&shape));
        out.insert(i.name.to_string(), Tensor::from_f64(&zeros, dtype));
    }
    out
}

/// `op`'s parameters with their defaults, a required one set to a plain value of its type.
fn probe_params(op: &OpSpec) -> Option<Params> {
    let mut given = serde_json::Map::new();
    for p in op.params.iter().filter(|p| p.default.is_none()) {
        let v = match p.ty {
            ParamType::Int | ParamType::OptInt => serde_json::json!(64),
            ParamType::Bool => serde_json::json!(false),
            ParamType::OptFloat => serde_json::Value::Null,
            ParamType::Str(list) | ParamType::OptStr(list) => serde_json::json!(list.first()?),
        };
        given.insert(p.name.to_string(), v);
    }
    Params::resolve(op.id, op.params, &given).ok()
}

/// The rule of one output (or part) when the op's float inputs are `dtype` (a long call with
/// `long`), for a candidate of the output's expected class.
fn probe_rule(op: &OpSpec, out: &OutputSpec, rule: RuleFn, dtype: Dtype, long: bool) -> Rule {
    let inputs = probe_inputs(op, dtype, if long { LONG_PROBE } else { 1 });
    let params = probe_params(op)
        .or_else(|| Params::resolve(op.id, &[], &serde_json::Map::new()).ok())
        .expect("empty parameters resolve");
    let class = (out.class)(&inputs, &params).unwrap_or(dtype.class());
    rule(&inputs, &params, class)
}

/// How `out` of `op` is compared, row by row (the whole output, or each of its parts).
pub fn thresholds(op: &OpSpec, out: &OutputSpec) -> Vec<ThresholdListing> {
    let rows: Vec<(&'static str, RuleFn)> = if out.parts.is_empty() {
        vec![(out.name, out.rule)]
    } else {
        out.parts.iter().map(|p| (p.name, p.rule)).collect()
    };
    rows.into_iter()
        .map(|(name, rule)| {
            let at = |dtype, long| match probe_rule(op, out, rule, dtype, long) {
                Rule::Threshold(t) => Some(t),
                _ => None,
            };
            let kind = match probe_rule(op, out, rule, Dtype::BF16, false) {
                Rule::Threshold(_) => "threshold",
                Rule::Exact => "exact",
                Rule::Index(_) => "index",
            };
            ThresholdListing {
                name,
                rule: kind,
                half: at(Dtype::BF16, false),
                half_long: at(Dtype::BF16, true),
                float32: at(Dtype::F32, false),
                float64: at(Dtype::F64, false),
            }
        })
        .collect()
}

impl ThresholdListing {
    /// `half 5e-3 (long 1e-2), float32 1e-5, float64 1e-10`; `exact`; `index rule`.
    pub fn text(&self) -> String {
        let g = |t: Option<f64>| t.map_or("-".into(), |t| format!("{t:.0e}"));
        match self.rule {
            "exact" => "exact (same bits)".into(),
            "index" => "index rule (block sets, ties allowed)".into(),
            _ => {
                let long = match self.half_long {
                    Some(l) if Some(l) != self.half => format!(" (long {})", g(Some(l))),
                    _ => String::new(),
                };
                format!(
                    "half {}{long}, float32 {}, float64 {}",
                    g(self.half),
                    g(self.float32),
                    g(self.float64)
                )
            }
        }
    }
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
                    thresholds: thresholds(op, o),
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
        block(
            "compare:",
            self.outputs
                .iter()
                .flat_map(|o| o.thresholds.iter())
                .map(|t| format!("{}: {}", t.name, t.text()))
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
        let thresholds: Vec<Vec<String>> = self
            .outputs
            .iter()
            .flat_map(|o| o.thresholds.iter())
            .map(|t| {
                let g = |t: Option<f64>| t.map_or("-".into(), |t| format!("{t:.0e}"));
                match t.rule {
                    "threshold" => vec![
                        t.name.into(),
                        g(t.half),
                        g(t.half_long),
                        g(t.float32),
                        g(t.float64),
                    ],
                    _ => {
                        let r = t.text();
                        vec![t.name.into(), r.clone(), r.clone(), r.clone(), r]
                    }
                }
            })
            .collect();
        out += &format!(
            "\nthresholds (ratio = RMS(ref - x) / RMS(ref) at most this, or max_abs <= {ABS_FLOOR:.0e}; \
             by the dtype of the inputs; long: a sequence over 4096 tokens; see {})\n",
            self.spec
        );
        out += &indent(&table::plain(
            &["output", "half", "half, long", "float32", "float64"],
            &thresholds,
        ));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::find;

    /// Every output of every op lists how it is compared; the delta-rule forward's classes and
    /// the index rule of the block selection are those of the spec.
    #[test]
    fn every_output_lists_its_thresholds() {
        for op in listing() {
            for o in &op.outputs {
                assert!(!o.thresholds.is_empty(), "{}.{}", op.op, o.name);
            }
        }
        let gdn = OpListing::of(find("gdn_fwd").unwrap());
        let o = &gdn.outputs[0].thresholds[0];
        assert_eq!(
            (o.rule, o.half, o.half_long, o.float32, o.float64),
            ("threshold", Some(5e-3), Some(1e-2), Some(1e-5), Some(1e-10))
        );
        assert!(gdn.contract().contains("thresholds"));
        assert!(gdn
            .brief()
            .contains("o: half 5e-3 (long 1e-2), float32 1e-5, float64 1e-10"));
        let sel = OpListing::of(find("nsa_select_blocks").unwrap());
        assert_eq!(sel.outputs[0].thresholds[0].rule, "index");
    }
}
