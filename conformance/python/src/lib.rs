//! `attn_conform._native`: the conformance suite in-process, for the `attn_conform` Python
//! package (`python/attn_conform`). That package turns NumPy arrays and torch tensors into
//! `(name, dtype, shape, bytes)` tuples (row-major, little-endian: the case-file encoding) and
//! back; here they become [`Tensor`]s of a [`Case`] held in memory, which goes through the same
//! checks, reference and comparison as a case file under `attn-conform verify`.
//!
//! Every [`Problem`] becomes a Python exception naming the argument it concerns
//! (`errors`); nothing here panics on bad input.

mod errors;

use attn_conformance::listing::{self, OpListing};
use attn_conformance::ops::device::cp_group;
use attn_conformance::registry;
use attn_conformance::verify::{context_parallel_ops, declared_outputs, verify_case, Selection};
use attn_conformance::{Case, Params, Problem, Tensor, Tensors};
use attn_reference::Dtype;
use errors::{problem, Arg};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::str::FromStr;

/// One tensor as the Python side hands it over: name, dtype name, shape, little-endian bytes.
type Wire<'py> = (String, String, Vec<usize>, Bound<'py, PyBytes>);

/// The `source` of a case built by `reference` and `check` (never written).
const IMPL: &str = "{\"impl\": \"python\"}";

/// Encodes one tensor.
fn wire<'py>(py: Python<'py>, name: &str, t: &Tensor) -> Wire<'py> {
    let bytes = PyBytes::new(py, &t.to_le_bytes());
    (
        name.into(),
        t.dtype().name().into(),
        t.shape().to_vec(),
        bytes,
    )
}

/// Decodes the tensors of argument `arg` (`inputs` or `outputs`).
fn tensors(arg: Arg, wires: &[Wire<'_>]) -> PyResult<Tensors> {
    let mut out = Tensors::new();
    for (name, dtype, shape, bytes) in wires {
        let at = arg.at(name);
        let dtype = Dtype::from_str(dtype).map_err(|e| problem(&at, e.into()))?;
        let t = Tensor::from_le_bytes(&at, dtype, shape, bytes.as_bytes())
            .map_err(|p| problem(&at, p))?;
        if out.insert(name.clone(), t).is_some() {
            return Err(PyValueError::new_err(format!("{at}: given twice")));
        }
    }
    Ok(out)
}

fn json_object(arg: Arg, text: &str) -> PyResult<Map<String, Value>> {
    match serde_json::from_str(text) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(v) => Err(PyValueError::new_err(format!(
            "{arg}: expected a dict, got {v}"
        ))),
        Err(e) => Err(PyValueError::new_err(format!("{arg}: {e}"))),
    }
}

/// The in-memory case of a call from Python and its validated parameters ([`registry::check`]: known
/// op, parameters, input and output names, input dtypes, tolerance keys).
#[allow(clippy::too_many_arguments)]
fn case(
    op: &str,
    inputs: &[Wire<'_>],
    outputs: &[Wire<'_>],
    params: &str,
    source: &str,
    tolerance: BTreeMap<String, f64>,
    note: Option<String>,
) -> PyResult<(Case, Params)> {
    let mut case = Case::new(op, "python");
    case.path = PathBuf::from("<python>");
    case.params = json_object(Arg::Params, params)?;
    case.source = Value::Object(json_object(Arg::Source, source)?);
    if case.impl_name().is_none() {
        return Err(problem(&Arg::Source.to_string(), Problem::NoImpl));
    }
    // what `Case::parse` checks of a file's tolerances
    if let Some((name, t)) = tolerance
        .iter()
        .find(|(_, t)| !(t.is_finite() && **t > 0.0))
    {
        return Err(PyValueError::new_err(format!(
            "{}: expected a positive number, got {t}",
            Arg::Tolerance.at(name)
        )));
    }
    case.tolerance = tolerance;
    case.note = note;
    case.inputs = tensors(Arg::Inputs, inputs)?;
    case.outputs = tensors(Arg::Outputs, outputs)?;
    let params = registry::check(&case).map_err(|p| errors::in_case(&case, p))?;
    Ok((case, params))
}

/// The op's outputs on `device` (`"cpu"`: the float64 reference; `"gpu"`: this project's CUDA
/// kernel, or with `gpus = N` its context-parallel path over GPUs `0 .. N`), as wire tuples.
/// `gpus` below 1, `gpus` with `device="cpu"`, or an op without a context-parallel path is a
/// `ValueError` naming `gpus`; a group that cannot be opened (more GPUs than the host has, no
/// GPU, no NCCL) an error naming `gpus` too.
#[pyfunction]
#[pyo3(signature = (op, inputs, params, device, gpus=None))]
fn reference<'py>(
    py: Python<'py>,
    op: &str,
    inputs: Vec<Wire<'py>>,
    params: &str,
    device: &str,
    gpus: Option<i64>,
) -> PyResult<Vec<Wire<'py>>> {
    let gpus = match gpus {
        None => None,
        Some(n) if n < 1 => {
            return Err(PyValueError::new_err(format!(
                "gpus: expected a number of GPUs >= 1, got {n}"
            )))
        }
        Some(_) if device != "gpu" => {
            return Err(PyValueError::new_err(format!(
                "gpus: the context-parallel path runs on GPUs: pass device=\"gpu\" with gpus \
                 (got device={device:?})"
            )))
        }
        Some(n) => Some(usize::try_from(n).unwrap_or(usize::MAX)),
    };
    let (case, params) = case(op, &inputs, &[], params, IMPL, BTreeMap::new(), None)?;
    let spec = registry::spec_of(&case).map_err(|p| errors::in_case(&case, p))?;
    let inputs = &case.inputs;
    let outputs = match (device, gpus) {
        ("cpu", _) => py.detach(|| (spec.cpu)(inputs, &params)),
        ("gpu", None) => {
            registry::gpu_status()
                .map_err(|why| problem(&Arg::Device.to_string(), Problem::NoGpu(why)))?;
            let run = spec.gpu.ok_or_else(|| {
                problem(
                    &Arg::Device.to_string(),
                    Problem::NoGpu(format!("`{op}` has no GPU kernel in this project")),
                )
            })?;
            py.detach(|| run(inputs, &params))
        }
        ("gpu", Some(n)) => {
            let run = spec.cp.ok_or_else(|| {
                PyValueError::new_err(format!(
                    "gpus: `{op}` has no context-parallel path (ops with one: {})",
                    context_parallel_ops().join(", ")
                ))
            })?;
            // the group first, so that its errors name `gpus`
            py.detach(|| cp_group(n).map(|_| ()))
                .map_err(|p| problem(&Arg::Gpus.to_string(), p))?;
            py.detach(|| run(&*cp_group(n)?, inputs, &params))
        }
        (other, _) => {
            return Err(PyValueError::new_err(format!(
                "device: expected \"cpu\" or \"gpu\", got {other:?}"
            )))
        }
    };
    let outputs = outputs.map_err(|p| errors::in_case(&case, p))?;
    let outputs = declared_outputs(spec, outputs);
    Ok(outputs.iter().map(|(n, t)| wire(py, n, t)).collect())
}

/// The rows `attn-conform verify --json` gives for this call and these outputs, as JSON text.
#[pyfunction]
#[pyo3(signature = (op, inputs, outputs, params, tolerance))]
fn check<'py>(
    py: Python<'py>,
    op: &str,
    inputs: Vec<Wire<'py>>,
    outputs: Vec<Wire<'py>>,
    params: &str,
    tolerance: BTreeMap<String, f64>,
) -> PyResult<String> {
    let (case, _) = case(op, &inputs, &outputs, params, IMPL, tolerance, None)?;
    let rows = py
        .detach(|| verify_case(&case, Selection::Cpu))
        .map_err(|p| errors::in_case(&case, p))?;
    serde_json::to_string(&rows).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// Writes an `attn-case/1` file (after the same checks as `check`, without running the op).
#[pyfunction]
#[pyo3(signature = (path, op, inputs, outputs, params, source, tolerance, note))]
#[allow(clippy::too_many_arguments)]
fn save_case<'py>(
    path: PathBuf,
    op: &str,
    inputs: Vec<Wire<'py>>,
    outputs: Vec<Wire<'py>>,
    params: &str,
    source: &str,
    tolerance: BTreeMap<String, f64>,
    note: Option<String>,
) -> PyResult<()> {
    let (mut case, _) = case(op, &inputs, &outputs, params, source, tolerance, note)?;
    case.path = path.clone();
    case.write(&path).map_err(errors::file)
}

/// A case file read and checked as `verify` reads it: `(op, params, source, tolerance, note,
/// inputs, outputs)`, `params` and `source` as JSON text.
#[pyfunction]
#[allow(clippy::type_complexity)]
fn load_case(
    py: Python<'_>,
    path: PathBuf,
) -> PyResult<(
    String,
    String,
    String,
    BTreeMap<String, f64>,
    Option<String>,
    Vec<Wire<'_>>,
    Vec<Wire<'_>>,
)> {
    let case = registry::read(&path).map_err(errors::file)?;
    let wires = |t: &Tensors| -> Vec<Wire<'_>> { t.iter().map(|(n, t)| wire(py, n, t)).collect() };
    Ok((
        case.op.clone(),
        Value::Object(case.params.clone()).to_string(),
        case.source.to_string(),
        case.tolerance.clone(),
        case.note.clone(),
        wires(&case.inputs),
        wires(&case.outputs),
    ))
}

/// The registry as `attn-conform list --json` shows it, as JSON text.
#[pyfunction]
fn ops() -> PyResult<String> {
    serde_json::to_string(&listing::listing()).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// The text of `attn-conform list` (every op, `op` = `None`) or of `attn-conform list OP`.
#[pyfunction]
#[pyo3(signature = (op=None))]
fn ops_text(op: Option<&str>) -> PyResult<String> {
    let Some(id) = op else {
        return Ok(listing::listing().iter().map(OpListing::brief).collect());
    };
    registry::find(id)
        .map(|spec| OpListing::of(spec).contract())
        .ok_or_else(|| problem(&Arg::Op.to_string(), Problem::UnknownOp(id.into())))
}

#[pymodule]
#[pyo3(name = "_native")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(reference, m)?)?;
    m.add_function(wrap_pyfunction!(check, m)?)?;
    m.add_function(wrap_pyfunction!(save_case, m)?)?;
    m.add_function(wrap_pyfunction!(load_case, m)?)?;
    m.add_function(wrap_pyfunction!(ops, m)?)?;
    m.add_function(wrap_pyfunction!(ops_text, m)?)?;
    Ok(())
}
