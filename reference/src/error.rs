//! Typed errors for bad input. Every error names the argument, what was expected and what was
//! given, so a caller (or a test) can tell exactly which check refused the call.

use std::fmt;

/// What kind of check refused the input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// A tensor's rank or extents are wrong or contradict another tensor.
    Shape,
    /// A tensor's element type is not accepted.
    Dtype,
    /// A scalar parameter is out of its range (`chunk_size` not a power of two, `dim` out of range...).
    Param,
    /// `cu_seqlens` (or another boundary array) is malformed.
    CuSeqlens,
    /// An index tensor holds an out-of-range or repeated value (`cache_batch_idx`, `cache_seqlens`...).
    Index,
    /// A required input is absent, or an input is present that the chosen options forbid.
    Missing,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ErrorKind::Shape => "bad shape",
            ErrorKind::Dtype => "bad dtype",
            ErrorKind::Param => "bad parameter",
            ErrorKind::CuSeqlens => "bad cu_seqlens",
            ErrorKind::Index => "bad index",
            ErrorKind::Missing => "missing or unexpected input",
        })
    }
}

/// A refused input: `kind` of check, the argument `arg` it concerns, and expected vs given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind} for `{arg}`: expected {expected}, got {got}")]
pub struct Error {
    pub kind: ErrorKind,
    pub arg: String,
    pub expected: String,
    pub got: String,
}

impl Error {
    pub fn new(
        kind: ErrorKind,
        arg: impl Into<String>,
        expected: impl Into<String>,
        got: impl Into<String>,
    ) -> Self {
        Error {
            kind,
            arg: arg.into(),
            expected: expected.into(),
            got: got.into(),
        }
    }
    pub fn shape(
        arg: impl Into<String>,
        expected: impl Into<String>,
        got: impl fmt::Debug,
    ) -> Self {
        Self::new(ErrorKind::Shape, arg, expected, format!("{got:?}"))
    }
    pub fn dtype(
        arg: impl Into<String>,
        expected: impl Into<String>,
        got: impl Into<String>,
    ) -> Self {
        Self::new(ErrorKind::Dtype, arg, expected, got)
    }
    pub fn param(
        arg: impl Into<String>,
        expected: impl Into<String>,
        got: impl fmt::Display,
    ) -> Self {
        Self::new(ErrorKind::Param, arg, expected, got.to_string())
    }
    pub fn cu_seqlens(expected: impl Into<String>, got: impl Into<String>) -> Self {
        Self::new(ErrorKind::CuSeqlens, "cu_seqlens", expected, got)
    }
    pub fn index(
        arg: impl Into<String>,
        expected: impl Into<String>,
        got: impl Into<String>,
    ) -> Self {
        Self::new(ErrorKind::Index, arg, expected, got)
    }
    pub fn missing(
        arg: impl Into<String>,
        expected: impl Into<String>,
        got: impl Into<String>,
    ) -> Self {
        Self::new(ErrorKind::Missing, arg, expected, got)
    }
}

pub type Result<T> = std::result::Result<T, Error>;
