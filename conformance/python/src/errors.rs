//! The Python exception of each [`Problem`], its message prefixed with the Python argument it
//! concerns (`op`, `params`, `inputs['q']`, `outputs`, `tolerance`, `source`, `device`, `path`):
//! `TypeError` for a wrong dtype or parameter type, `RuntimeError` for a missing GPU or a device
//! error, `OSError` for a file that cannot be written, `ValueError` for everything else.

use attn_conformance::{Case, Error, Problem};
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
        })
    }
}

/// `p` as the exception of its kind, the message prefixed with `arg`.
pub fn problem(arg: &str, p: Problem) -> PyErr {
    let msg = format!("{arg}: {p}");
    match &p {
        Problem::ParamType { .. } => PyTypeError::new_err(msg),
        Problem::Reference(e) if e.kind == ErrorKind::Dtype => PyTypeError::new_err(msg),
        Problem::NoGpu(_) | Problem::Device(_) => PyRuntimeError::new_err(msg),
        Problem::Io(_) => PyOSError::new_err(msg),
        _ => PyValueError::new_err(msg),
    }
}

/// The argument of `case`'s call that `p` is about.
fn arg_of(case: &Case, p: &Problem) -> String {
    let tensor = |name: &str| match name.split_once('.') {
        Some(("out", n)) => Arg::Outputs.at(n),
        Some(("in", n)) => Arg::Inputs.at(n),
        _ => Arg::Inputs.to_string(),
    };
    match p {
        Problem::UnknownOp(_) => Arg::Op.to_string(),
        Problem::UnknownParam { .. } | Problem::MissingParam(_) => Arg::Params.to_string(),
        Problem::ParamType { key, .. } => Arg::Params.at(key),
        Problem::BadJson { key: "source", .. } | Problem::NoSource | Problem::NoImpl => {
            Arg::Source.to_string()
        }
        Problem::BadJson { .. } => Arg::Params.to_string(),
        Problem::BadTolerance(_) => Arg::Tolerance.to_string(),
        Problem::MissingInput(_) => Arg::Inputs.to_string(),
        Problem::UnexpectedTensor { name, .. } | Problem::BadTensor { name, .. } => tensor(name),
        Problem::Reference(e) if case.inputs.contains_key(&e.arg) => Arg::Inputs.at(&e.arg),
        Problem::Reference(e) if case.params.contains_key(&e.arg) => Arg::Params.at(&e.arg),
        Problem::Reference(e) if e.kind == ErrorKind::Param => Arg::Params.to_string(),
        Problem::NoGpu(_) | Problem::Device(_) => Arg::Device.to_string(),
        _ => Arg::Inputs.to_string(),
    }
}

/// `p`, found in `case`, as a Python exception naming the argument.
pub fn in_case(case: &Case, p: Problem) -> PyErr {
    problem(&arg_of(case, &p), p)
}

/// A file that could not be read, written or used: the exception of its problem, naming the
/// path (`OSError` when the file system refused).
pub fn file(e: Error) -> PyErr {
    problem(&format!("path: {}", e.path.display()), e.problem)
}
