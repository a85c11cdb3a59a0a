//! `attn-conformance`: case files, the comparison rule of the spec, the op registry, and the
//! `attn-conform` command.

pub mod app;
pub mod case;
pub mod compare;
pub mod error;
pub mod fixtures;
pub mod ops;
pub mod params;
pub mod registry;
pub mod tensor;
pub mod verify;

pub use case::{Case, Tensors};
pub use compare::{compare, Comparison, Rule};
pub use error::{Error, Problem, Result};
pub use params::{ParamSpec, ParamType, Params};
pub use registry::{find, OpSpec, OPS};
pub use tensor::Tensor;
