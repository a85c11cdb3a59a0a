//! `attn-reference`: the numerically exact CPU reference of the attention operations specified
//! in the project's spec. Every operation is generic over [`Real`] (`f32`, `f64`); `f64` is the
//! oracle. Inputs are validated before any work and refused with a typed [`Error`] that names
//! the argument.

pub mod cumsum;
pub mod decode;
pub mod delta;
pub mod dtype;
pub mod error;
pub mod gate;
pub mod nsa;
pub mod scalar;
pub mod varlen;

pub use dtype::{Dtype, DtypeClass};
pub use error::{Error, ErrorKind, Result};
pub use scalar::{Real, RCP_LN2};
