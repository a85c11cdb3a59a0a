//! `attn-conformance`: case files, the comparison rule of the spec, the op registry, and the
//! `attn-conform` command.
//!
//! Modules form a one-way stack, each importing only those below it:
//! 1. `error`, `tensor`, `params`, `compare`, `index_rule`, `fixtures`: the format's parts and the
//!    comparison rules;
//! 2. `case`: `attn-case/1` files, knowing no op;
//! 3. `spec`: what an op entry is made of;
//! 4. `ops`: one module per op family (entries, CPU and GPU runners) and `ops::device`;
//! 5. `registry`: the families gathered, lookup, binding a case to its op;
//! 6. `verify`, `listing` (the registry as `list` shows it) and `report` (the conformance report);
//!    then `app` (the `attn-conform` command). `table` (text, markdown, HTML tables) is a leaf.

pub mod app;
pub mod case;
pub mod compare;
pub mod error;
pub mod fixtures;
pub mod index_rule;
pub mod listing;
pub mod ops;
pub mod params;
pub mod registry;
pub mod report;
pub mod spec;
pub mod table;
pub mod tensor;
pub mod verify;

pub use case::{Case, Tensors};
pub use compare::{compare, Comparison, Rule};
pub use error::{Error, Problem, Result};
pub use params::{ParamSpec, ParamType, Params};
pub use registry::{find, OPS};
pub use spec::OpSpec;
pub use tensor::Tensor;
