//! Verifying a case: run the float64 CPU reference on its inputs and compare every output of a
//! candidate with it: the case's own stored outputs (`cpu`), and the GPU runner's (`gpu`).

use crate::case::{Case, Tensors};
use crate::compare::{compare, Rule};
use crate::error::Problem;
use crate::params::Params;
use crate::registry::{self, OpSpec, PartSpec};
use crate::tensor::Tensor;
use serde::Serialize;
use std::borrow::Cow;
use std::fmt;

/// Whose outputs are checked against the CPU float64 reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    /// The outputs stored in the case (computed by `source.impl`), checked on the CPU.
    Cpu,
    /// The outputs of this crate's GPU runner on the case's inputs.
    Gpu,
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Device::Cpu => "cpu",
            Device::Gpu => "gpu",
        })
    }
}

/// `--device`: which candidates to check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selection {
    Cpu,
    /// Only the GPU runner; a case whose op has none is unusable.
    Gpu,
    /// The case's outputs, and the GPU runner's where one exists and a GPU is present.
    All,
}

/// One compared output.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    pub file: String,
    pub op: String,
    pub device: Device,
    pub output: String,
    pub shape: Vec<usize>,
    /// The candidate's dtype (`"-"` when it is missing).
    pub dtype: String,
    pub max_abs: f64,
    pub ratio: f64,
    /// The threshold; `None` (JSON `null`) for a bit-exact comparison.
    pub threshold: Option<f64>,
    pub pass: bool,
    pub reason: Option<String>,
}

/// The devices `selection` checks for `op`, or why the selection cannot be served.
pub fn devices_for(op: &OpSpec, selection: Selection) -> Result<Vec<Device>, Problem> {
    let gpu_ready = op.gpu.is_some() && registry::gpu_status().is_ok();
    match selection {
        Selection::Cpu => Ok(vec![Device::Cpu]),
        Selection::All if gpu_ready => Ok(vec![Device::Cpu, Device::Gpu]),
        Selection::All => Ok(vec![Device::Cpu]),
        Selection::Gpu if gpu_ready => Ok(vec![Device::Gpu]),
        Selection::Gpu => Err(Problem::NoGpu(match registry::gpu_status() {
            Err(why) => why,
            Ok(()) => format!("`{}` has no GPU runner", op.id),
        })),
    }
}

/// Runs the reference for `case` and compares the candidates of `selection` with it.
/// `Err` means the case cannot be used (bad shapes, no GPU runner, ...).
pub fn verify_case(case: &Case, selection: Selection) -> Result<Vec<Row>, Problem> {
    let spec = case.spec()?;
    let params = case.check()?;
    let devices = devices_for(spec, selection)?;
    let reference = (spec.cpu)(&case.inputs, &params)?;
    let mut rows = Vec::new();
    for device in devices {
        let candidate = match device {
            Device::Cpu => case.outputs.clone(),
            Device::Gpu => match spec.gpu {
                Some(run) => run(&case.inputs, &params)?,
                None => return Err(Problem::NoGpu(format!("`{}` has no GPU runner", spec.id))),
            },
        };
        rows.extend(compare_outputs(
            case, spec, &params, device, &reference, &candidate,
        )?);
    }
    Ok(rows)
}

fn compare_outputs(
    case: &Case,
    spec: &OpSpec,
    params: &Params,
    device: Device,
    reference: &Tensors,
    candidate: &Tensors,
) -> Result<Vec<Row>, Problem> {
    let mut rows = Vec::new();
    for out in spec.outputs {
        let (r, x) = (reference.get(out.name), candidate.get(out.name));
        let optional_absent = device == Device::Cpu && out.optional && x.is_none();
        if (r.is_none() && x.is_none()) || optional_absent {
            continue;
        }
        let expected = (out.class)(&case.inputs, params)?;
        let class = x.map_or(expected, |x| x.dtype().class());
        let tolerance = |row: &str| {
            (case.tolerance.get(row))
                .or(case.tolerance.get(out.name))
                .copied()
        };
        // an output with parts is compared part by part (e.g. `hm.b`, `hm.M`); a whole output
        // is compared in place
        let compared: Vec<_> = if out.parts.is_empty() {
            vec![(
                out.name,
                out.rule,
                r.map(Cow::Borrowed),
                x.map(Cow::Borrowed),
            )]
        } else {
            let take = |p: &PartSpec, t: &Tensor| Cow::Owned((p.take)(t));
            out.parts
                .iter()
                .map(|p| (p.name, p.rule, r.map(|t| take(p, t)), x.map(|t| take(p, t))))
                .collect()
        };
        for (name, rule_fn, r, x) in compared {
            let rule = match (device, tolerance(name)) {
                (Device::Cpu, Some(t)) => Rule::Threshold(t),
                _ => rule_fn(&case.inputs, params, class),
            };
            let c = compare(r.as_deref(), x.as_deref(), expected, rule);
            rows.push(Row {
                file: case.path.display().to_string(),
                op: case.op.clone(),
                device,
                output: name.into(),
                shape: c.shape,
                dtype: c.dtype.map_or("-".into(), |d| d.name().to_string()),
                max_abs: c.max_abs,
                ratio: c.ratio,
                threshold: match rule {
                    Rule::Threshold(t) => Some(t),
                    Rule::Exact => None,
                },
                pass: c.pass,
                reason: c.reason,
            });
        }
    }
    Ok(rows)
}
