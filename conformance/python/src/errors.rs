//! The Python exception of each [`Problem`], its message prefixed with the Python argument it
//! concerns (`op`, `params`, `inputs['q']`, `outputs`, `tolerance`, `source`, `device`, `gpus`,
//! `path`)
//! and naming tensors by the dict keys the caller typed (`w`, not the case file's `in.w`):
//! `TypeError` for a wrong dtype or parameter type, `RuntimeError` for a missing GPU or a device
//! error, `OSError` for a file that cannot be written, `ValueError` for everything else.

use attn_conformance::{registry, Case, Error, Problem};
use attn_reference::ErrorKind;
use pyo3::exceptions::{PyOSError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::PyErr;
use std::fmt;

/// An argument of the Python functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arg {
    Op,
    Inputs,
    Outputs,
    Params,
    Tolerance,
    Source,
    Device,
    Gpus,
}

impl Arg {
    /// `inputs['q']`: one entry of a dict argument.
    pub fn at(self, key: &str) -> String {
        format!("{self}['{key}']")
    }
}

impl fmt::Display for Arg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Arg::Op => "op",
            Arg::Inputs => "inputs",
            Arg::Outputs => "outputs",
            Arg::Params => "params",
            Arg::Tolerance => "tolerance",
            Arg::Source => "source",
            Arg::Device => "device",
            Arg::Gpus => "gpus",
        })
    }
}

/// `p` as the exception of its kind, the message prefixed with `arg`.
pub fn problem(arg: &str, p: Problem) -> PyErr {
    let text = match &p {
        // the name is the argument already
        Problem::BadTensor { msg, .. } => msg.clone(),
        _ => p.to_string(),
    };
    raise(&format!("{arg}: {text}"), &p)
}

/// The exception of `p`'s kind with message `msg`.
fn raise(msg: &str, p: &Problem) -> PyErr {
    let msg = msg.to_string();
    match p {
        Problem::ParamType { .. } => PyTypeError::new_err(msg),
        Problem::Reference(e) if e.kind == ErrorKind::Dtype => PyTypeError::new_err(msg),
        Problem::NoGpu(_) | Problem::Device(_) => PyRuntimeError::new_err(msg),
        Problem::Io(_) => PyOSError::new_err(msg),
        _ => PyValueError::new_err(msg),
    }
}

/// The dict entry a case-file tensor name (`in.w`, `out.o`) stands for (`inputs['w']`,
/// `outputs['o']`).
fn tensor(name: &str) -> String {
    match name.split_once('.') {
        Some(("out", n)) => Arg::Outputs.at(n),
        Some(("in", n)) => Arg::Inputs.at(n),
        _ => Arg::Inputs.to_string(),
    }
}

/// The argument of `case`'s call that `p` is about.
fn arg_of(case: &Case, p: &Problem) -> String {
    match p {
        Problem::UnknownOp(_) => Arg::Op.to_string(),
        Problem::UnknownParam { .. } | Problem::MissingParam(_) => Arg::Params.to_string(),
        Problem::ParamType { key, .. } => Arg::Params.at(key),
        Problem::BadJson { key: "source", .. } | Problem::NoSource | Problem::NoImpl => {
            Arg::Source.to_string()
        }
        Problem::BadJson { .. } => Arg::Params.to_string(),
        Problem::BadTolerance(_) => Arg::Tolerance.to_string(),
        Problem::MissingInput(name) => Arg::Inputs.at(name),
        Problem::UnexpectedTensor { name, .. } | Problem::BadTensor { name, .. } => tensor(name),
        Problem::Reference(e) if case.inputs.contains_key(&e.arg) => Arg::Inputs.at(&e.arg),
        Problem::Reference(e) if case.params.contains_key(&e.arg) => Arg::Params.at(&e.arg),
        Problem::Reference(e) if e.kind == ErrorKind::Param => Arg::Params.to_string(),
        Problem::NoGpu(_) | Problem::Device(_) => Arg::Device.to_string(),
        _ => Arg::Inputs.to_string(),
    }
}

/// `p`, found in `case`, as a Python exception naming the argument, and the tensors by their
/// dict keys.
pub fn in_case(case: &Case, p: Problem) -> PyErr {
    let arg = arg_of(case, &p);
    let names = |list: fn(&attn_conformance::OpSpec) -> String| {
        registry::find(&case.op).map_or_else(String::new, list)
    };
    let text = match &p {
        Problem::MissingInput(_) => format!(
            "missing: `{}` requires it (inputs: {})",
            case.op,
            names(|s| s.input_names())
        ),
        Problem::UnexpectedTensor { name, why } => {
            let what = if name.starts_with("out.") {
                "an output"
            } else {
                "an input"
            };
            format!("not {what} of `{}` ({why})", case.op)
        }
        _ => return problem(&arg, p),
    };
    raise(&format!("{arg}: {text}"), &p)
}

/// A file that could not be read, written or used: the exception of its problem, naming the
/// path (`OSError` when the file system refused).
pub fn file(e: Error) -> PyErr {
    problem(&format!("path: {}", e.path.display()), e.problem)
}
