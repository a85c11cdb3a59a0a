//! Verifying a case: run the float64 CPU reference on its inputs and compare every output of a
//! candidate with it: the case's own stored outputs (`cpu`), the GPU runner's (`gpu`), and the
//! context-parallel runner's over `N` GPUs (`gpus=N`, `verify --gpus N`).

use crate::case::{Case, Tensors};
use crate::compare::{class_ok, compare, Diagnostics, Rule};
use crate::error::Problem;
use crate::index_rule::compare_indices;
use crate::ops::device::cp_group;
use crate::params::Params;
use crate::registry;
use crate::spec::{OpSpec, PartSpec};
use crate::tensor::Tensor;
use serde::{Serialize, Serializer};
use std::borrow::Cow;
use std::fmt;

/// Whose outputs are checked against the CPU float64 reference. Written (text and JSON) as
/// `cpu`, `gpu`, `gpus=N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Device {
    /// The outputs stored in the case (computed by `source.impl`), checked on the CPU.
    Cpu,
    /// The outputs of this crate's GPU runner on the case's inputs.
    Gpu,
    /// The outputs of this crate's context-parallel runner over GPUs `0 .. N` (NCCL).
    Gpus(usize),
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Gpu => f.write_str("gpu"),
            Device::Gpus(n) => write!(f, "gpus={n}"),
        }
    }
}

impl Serialize for Device {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// `--device`: which candidates to check. The outputs stored in the case are always checked;
/// `gpu` and `all` also check this crate's GPU kernel where the op has one
/// (`conformance/spec/fixture-format.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selection {
    Cpu,
    /// As `All`, but a missing GPU makes every case unusable.
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
    /// Where and by how much a failed comparison of two same-shape tensors missed (`null` when
    /// it passed, or when a shape, class or presence mismatch left nothing to compare).
    pub diagnostics: Option<Diagnostics>,
    /// Index rule only (`conformance/spec/ops-nsa.md` §9): rows that differ from the reference's
    /// selection but passed by the near-tie band.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub near_ties: Option<usize>,
}

impl Row {
    /// How far this row is from failing by its ratio: `ratio / threshold`; under the exact rule
    /// 0 when equal and infinite when not; `None` when nothing was measured.
    pub fn margin(&self) -> Option<f64> {
        if self.ratio.is_nan() {
            return None;
        }
        Some(match self.threshold {
            Some(t) => self.ratio / t,
            None if self.pass => 0.0,
            None => f64::INFINITY,
        })
    }
}

/// The devices `selection` checks for `op`, or why the selection cannot be served (`gpu`
/// asked where no GPU answers).
pub fn devices_for(op: &OpSpec, selection: Selection) -> Result<Vec<Device>, Problem> {
    let gpu = match selection {
        Selection::Cpu => false,
        Selection::Gpu => {
            registry::gpu_status().map_err(Problem::NoGpu)?;
            op.gpu.is_some()
        }
        Selection::All => op.gpu.is_some() && registry::gpu_status().is_ok(),
    };
    Ok(if gpu {
        vec![Device::Cpu, Device::Gpu]
    } else {
        vec![Device::Cpu]
    })
}

/// Runs the reference for `case` and compares the candidates of `selection` with it.
/// `Err` means the case cannot be used (bad shapes, no GPU runner, ...).
pub fn verify_case(case: &Case, selection: Selection) -> Result<Vec<Row>, Problem> {
    verify_with_reference(case, selection, None).map(|(rows, _)| rows)
}

/// The ops with a context-parallel runner (`--gpus`), by id.
pub fn context_parallel_ops() -> Vec<&'static str> {
    registry::OPS
        .iter()
        .filter(|o| o.cp.is_some())
        .map(|o| o.id)
        .collect()
}

/// [`verify_case`], also checking the context-parallel runner over `gpus` GPUs where the op has
/// one (an op without one gets no `gpus=N` row: the caller reports it skipped), and returning
/// the reference's outputs.
pub fn verify_with_reference(
    case: &Case,
    selection: Selection,
    gpus: Option<usize>,
) -> Result<(Vec<Row>, Tensors), Problem> {
    let spec = registry::spec_of(case)?;
    let params = registry::check(case)?;
    let mut devices = devices_for(spec, selection)?;
    devices.extend(gpus.filter(|_| spec.cp.is_some()).map(Device::Gpus));
    let reference = (spec.cpu)(&case.inputs, &params)?;
    let mut rows = Vec::new();
    for device in devices {
        let candidate = match device {
            Device::Cpu => case.outputs.clone(),
            Device::Gpu => match spec.gpu {
                Some(run) => run(&case.inputs, &params)?,
                None => return Err(Problem::NoGpu(format!("`{}` has no GPU runner", spec.id))),
            },
            Device::Gpus(n) => match spec.cp {
                Some(run) => run(&*cp_group(n)?, &case.inputs, &params)?,
                None => {
                    return Err(Problem::NoGpu(format!(
                        "`{}` has no context-parallel runner",
                        spec.id
                    )))
                }
            },
        };
        let reference = reference_for(case, spec, &params, &reference, &candidate)?;
        rows.extend(compare_outputs(
            case, spec, &params, device, &reference, &candidate,
        )?);
    }
    Ok((rows, reference))
}

/// `case` with the float64 reference's outputs in place of its own: the file `verify
/// --dump-reference` writes (`source.impl` is `attn-reference`).
pub fn reference_case(case: &Case, spec: &OpSpec, reference: Tensors) -> Case {
    let mut out = case.clone();
    out.source = serde_json::json!({
        "impl": "attn-reference",
        "version": env!("CARGO_PKG_VERSION"),
        "device": "cpu",
        "precision": "float64",
    });
    out.tolerance.clear();
    out.note = Some(format!(
        "the float64 reference outputs for the inputs of {}",
        case.path.display()
    ));
    out.outputs = declared_outputs(spec, reference);
    out
}

/// The op's declared outputs among a runner's, without the auxiliary tensors some references
/// add for the comparison (`block_indices.scores`).
pub fn declared_outputs(spec: &OpSpec, outputs: Tensors) -> Tensors {
    outputs
        .into_iter()
        .filter(|(name, _)| spec.output(name).is_some())
        .collect()
}

/// The reference a candidate is held to: the plain one, or, for an op whose reference takes some
/// outputs from the candidate ([`registry::taken_from_candidate`]; `nsa_fwd`'s
/// `block_indices`, `conformance/spec/ops-nsa.md` §7), the one computed with the candidate's values
/// as inputs. The taken outputs themselves (and their `<name>.scores`) stay the plain reference's,
/// so they are still checked against its own choice.
fn reference_for<'a>(
    case: &Case,
    spec: &OpSpec,
    params: &Params,
    reference: &'a Tensors,
    candidate: &Tensors,
) -> Result<Cow<'a, Tensors>, Problem> {
    let taken: Vec<&str> = registry::taken_from_candidate(spec.id)
        .into_iter()
        .filter(|n| candidate.contains_key(*n))
        .collect();
    if taken.is_empty() {
        return Ok(Cow::Borrowed(reference));
    }
    let mut inputs = case.inputs.clone();
    for n in &taken {
        inputs.insert(n.to_string(), candidate[*n].clone());
    }
    let mut out = (spec.cpu)(&inputs, params)?;
    for (name, t) in reference {
        if taken
            .iter()
            .any(|n| name == n || name.starts_with(&format!("{n}.")))
        {
            out.insert(name.clone(), t.clone());
        }
    }
    Ok(Cow::Owned(out))
}

/// For an op whose output dtype is its `output_dtype` parameter: what the case set it to and
/// what it takes (appended to a dtype mismatch); empty for the other ops.
fn output_dtype_hint(spec: &OpSpec, params: &Params) -> String {
    let Some(p) = spec.params.iter().find(|p| p.name == "output_dtype") else {
        return String::new();
    };
    let value = params.as_map().get(p.name).cloned().unwrap_or_default();
    format!(
        " (set by the parameter output_dtype = {value}; it takes {}, null meaning the input's dtype)",
        p.ty.describe()
    )
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
            let rule = match (
                device,
                tolerance(name),
                rule_fn(&case.inputs, params, class),
            ) {
                (_, _, Rule::Index(ir)) => Rule::Index(ir),
                (Device::Cpu, Some(t), _) => Rule::Threshold(t),
                (_, _, rule) => rule,
            };
            let c = match rule {
                Rule::Index(ir) => {
                    let scores = reference.get(&format!("{name}.scores"));
                    compare_indices(r.as_deref(), x.as_deref(), scores, ir)
                }
                _ => compare(r.as_deref(), x.as_deref(), expected, rule),
            };
            let reason = match x {
                Some(x) if !class_ok(expected, x.dtype().class()) => {
                    c.reason.map(|why| why + &output_dtype_hint(spec, params))
                }
                _ => c.reason,
            };
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
                    Rule::Index(_) => None,
                    Rule::Exact => None,
                },
                pass: c.pass,
                reason,
                diagnostics: c.diagnostics,
                near_ties: c.near_ties,
            });
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::OPS;

    /// The stored outputs are checked under every selection; the GPU kernel only where the op
    /// has one and a GPU answers; `gpu` without a GPU is refused.
    #[test]
    fn every_selection_checks_the_stored_outputs() {
        let gpu_here = registry::gpu_status().is_ok();
        for op in OPS {
            assert_eq!(devices_for(op, Selection::Cpu).unwrap(), [Device::Cpu]);
            let with_gpu = gpu_here && op.gpu.is_some();
            let expected: &[Device] = if with_gpu {
                &[Device::Cpu, Device::Gpu]
            } else {
                &[Device::Cpu]
            };
            assert_eq!(
                devices_for(op, Selection::All).unwrap(),
                expected,
                "{}",
                op.id
            );
            match devices_for(op, Selection::Gpu) {
                Ok(d) => assert!(gpu_here && d == expected, "{}: {d:?}", op.id),
                Err(e) => assert!(!gpu_here, "{}: {e}", op.id),
            }
        }
    }
}
