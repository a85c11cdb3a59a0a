//! Errors of the conformance suite. A [`Problem`] says what is wrong; an [`Error`] adds the file
//! it is wrong in, so every message names the file and the problem.

use std::fmt;
use std::path::{Path, PathBuf};

/// What made a case, a manifest or a request unusable (exit status 2 of `attn-conform`).
#[derive(Debug, thiserror::Error)]
pub enum Problem {
    #[error("cannot read: {0}")]
    Io(#[from] std::io::Error),
    #[error("not a safetensors file: {0}")]
    NotSafetensors(String),
    #[error("no `format` in the metadata (expected \"attn-case/1\")")]
    NoFormat,
    #[error("`format` is {0:?}, expected \"attn-case/1\"")]
    WrongFormat(String),
    #[error("no `op` in the metadata")]
    NoOp,
    #[error("unknown op `{0}` (`attn-conform list` shows the known ones)")]
    UnknownOp(String),
    #[error("metadata `{key}` is not a valid JSON {expected}: {msg}")]
    BadJson {
        key: &'static str,
        expected: &'static str,
        msg: String,
    },
    #[error("no `source` in the metadata (a JSON object with at least \"impl\")")]
    NoSource,
    #[error("`source` has no string `impl`")]
    NoImpl,
    #[error("`tolerance`: {0}")]
    BadTolerance(String),
    #[error("unknown parameter `{key}` of `{op}` (known: {known})")]
    UnknownParam {
        op: String,
        key: String,
        known: String,
    },
    #[error("parameter `{key}`: expected {expected}, got {got}")]
    ParamType {
        key: String,
        expected: String,
        got: String,
    },
    #[error("missing required parameter `{0}`")]
    MissingParam(String),
    #[error("missing required input `in.{0}`")]
    MissingInput(String),
    #[error("unexpected tensor `{name}` ({why})")]
    UnexpectedTensor { name: String, why: String },
    #[error("tensor `{name}`: {msg}")]
    BadTensor { name: String, msg: String },
    #[error(transparent)]
    Reference(#[from] attn_reference::Error),
    #[error("sha256 {got} differs from the manifest's {expected}: the file is corrupted")]
    Corrupted { expected: String, got: String },
    #[error("listed in {manifest} but missing")]
    MissingFixture { manifest: PathBuf },
    #[error("bad manifest: {0}")]
    BadManifest(String),
    #[error("no GPU: {0}")]
    NoGpu(String),
    #[error("device error: {0}")]
    Device(String),
    #[error("not written: {0}")]
    NotWritten(String),
}

impl Problem {
    /// Attach the file this problem was found in.
    pub fn at(self, path: impl AsRef<Path>) -> Error {
        Error {
            path: path.as_ref().to_path_buf(),
            problem: self,
        }
    }
}

/// A [`Problem`] in a named file (or directory).
#[derive(Debug, thiserror::Error)]
pub struct Error {
    pub path: PathBuf,
    #[source]
    pub problem: Problem,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.problem)
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
