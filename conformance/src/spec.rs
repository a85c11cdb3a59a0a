//! The vocabulary of the op registry: what an op is made of ([`OpSpec`]: inputs, parameters,
//! outputs with their dtype class and comparison rule, runners), and the `const fn`s the family
//! modules under [`crate::ops`] build their entries with. It knows no op; [`crate::registry`]
//! gathers the families' entries.

use crate::case::Tensors;
use crate::compare::Rule;
use crate::error::Problem;
use crate::params::{ParamSpec, ParamType, Params};
use crate::tensor::Tensor;
use attn_gpu::cp::CpGroup;
use attn_reference::DtypeClass;

/// Whether an input holds floats or indices (`cu_seqlens`, `cache_seqlens`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputKind {
    Float,
    Index,
}

/// One tensor argument of an op.
#[derive(Debug, Clone, Copy)]
pub struct InputSpec {
    pub name: &'static str,
    pub required: bool,
    pub kind: InputKind,
    /// Its layout as the spec writes it (`[B, T, H, K]`; alternatives joined by ` or `, notes in
    /// parentheses); [`ranks`] reads the ranks a case may give it from this text.
    pub shape: &'static str,
    /// The dtypes it accepts, in words (`float`, `int32|int64`, `f32|f64`, `float, as k`).
    pub dtype: &'static str,
}

impl InputSpec {
    /// The ranks its layout allows (empty: any rank, e.g. `cumsum`'s `x`).
    pub fn ranks(&self) -> Vec<usize> {
        ranks(self.shape)
    }
}

/// The distinct ranks of the bracketed layouts in `shape` (`[B, T, H] or [B, T, H, S]` gives
/// 3 and 4), in order of first appearance; empty when `shape` has no bracket.
pub fn ranks(shape: &str) -> Vec<usize> {
    let mut out = Vec::new();
    let mut rest = shape;
    while let Some(open) = rest.find('[') {
        let Some(close) = rest[open..].find(']') else {
            break;
        };
        let inside = &rest[open + 1..open + close];
        let rank = if inside.trim().is_empty() {
            0
        } else {
            inside.matches(',').count() + 1
        };
        if !out.contains(&rank) {
            out.push(rank);
        }
        rest = &rest[open + close + 1..];
    }
    out
}

/// The dtype class an output must have, given the call's inputs and parameters.
pub type ClassFn = fn(&Tensors, &Params) -> Result<DtypeClass, Problem>;
/// The comparison rule of an output, given the call and the class the candidate was computed in.
pub type RuleFn = fn(&Tensors, &Params, DtypeClass) -> Rule;
/// Runs an op on a case's inputs and validated parameters; returns its outputs by name.
pub type Runner = fn(&Tensors, &Params) -> Result<Tensors, Problem>;
/// Runs an op's context-parallel path (`attn_gpu::cp`) on a case's whole inputs over the GPUs
/// of a group (partition, scatter, run, gather); returns its outputs by name, as [`Runner`].
pub type CpRunner = fn(&CpGroup, &Tensors, &Params) -> Result<Tensors, Problem>;

/// One output of an op.
#[derive(Debug, Clone, Copy)]
pub struct OutputSpec {
    pub name: &'static str,
    /// Whether a case may leave it out although the op produces it (e.g. `lse`, which
    /// PyTorch's SDPA does not return). A required output that is absent is a failure.
    pub optional: bool,
    pub class: ClassFn,
    pub rule: RuleFn,
    /// When not empty, the output is compared as these parts (one row each, e.g. `hm.b` and
    /// `hm.M` of `fwd_h_pre_scan`) instead of as a whole.
    pub parts: &'static [PartSpec],
    /// Its layout as the spec writes it (`[B, NT, HV, K, V]`, notes in parentheses).
    pub shape: &'static str,
    /// Its dtype in words (`dtype of k`, `float32`, `output_dtype, else dtype of g`).
    pub dtype: &'static str,
    /// When the op produces it (`always`, `when output_final_state`).
    pub present: &'static str,
}

impl OutputSpec {
    /// This output, produced only under `present` (e.g. `"when output_final_state"`).
    pub const fn when(self, present: &'static str) -> OutputSpec {
        OutputSpec { present, ..self }
    }
}

/// Selects one part of an output tensor (e.g. the columns `..V` of `hm`).
pub type TakeFn = fn(&Tensor) -> Tensor;

/// A part of an output compared on its own, with its own rule.
#[derive(Debug, Clone, Copy)]
pub struct PartSpec {
    /// The row name, `<output>.<part>`.
    pub name: &'static str,
    pub take: TakeFn,
    pub rule: RuleFn,
}

/// Everything the suite knows about one op.
#[derive(Debug, Clone, Copy)]
pub struct OpSpec {
    /// The spec's op id.
    pub id: &'static str,
    /// One line for `list`.
    pub summary: &'static str,
    pub inputs: &'static [InputSpec],
    pub params: &'static [ParamSpec],
    pub outputs: &'static [OutputSpec],
    /// The float64 CPU reference.
    pub cpu: Runner,
    /// The CUDA kernel, where one exists.
    pub gpu: Option<Runner>,
    /// The context-parallel path over several GPUs (`attn-conform verify --gpus N`), where one
    /// exists.
    pub cp: Option<CpRunner>,
    /// Its section of the spec: a file of `conformance/spec/` and a section
    /// (`conformance/spec/ops-delta-rule.md §2`).
    pub section: &'static str,
}

/// The dtypes of an index input.
pub const INDEX_DTYPES: &str = "int32|int64";

impl OpSpec {
    pub fn input(&self, name: &str) -> Option<&InputSpec> {
        self.inputs.iter().find(|i| i.name == name)
    }
    pub fn output(&self, name: &str) -> Option<&OutputSpec> {
        self.outputs.iter().find(|o| o.name == name)
    }
    /// Whether `name` is compared on its own: an output, or a part of one (`hm.b`); a case's
    /// `tolerance` may name either.
    pub fn compares(&self, name: &str) -> bool {
        self.output(name).is_some()
            || self
                .outputs
                .iter()
                .any(|o| o.parts.iter().any(|p| p.name == name))
    }
    pub fn input_names(&self) -> String {
        names(self.inputs.iter().map(|i| i.name))
    }
    pub fn output_names(&self) -> String {
        names(self.outputs.iter().map(|o| o.name))
    }
    /// Where the spec defines this op: `conformance/spec/ops-delta-rule.md §2`.
    pub fn citation(&self) -> String {
        self.section.to_string()
    }
    /// The devices that implement this op (`cpu` always; `gpus`: the context-parallel path
    /// over several GPUs).
    pub fn devices(&self) -> Vec<&'static str> {
        let mut d = vec!["cpu"];
        if self.gpu.is_some() {
            d.push("gpu");
        }
        if self.cp.is_some() {
            d.push("gpus");
        }
        d
    }
}

fn names<'a>(it: impl Iterator<Item = &'a str>) -> String {
    it.collect::<Vec<_>>().join(", ")
}

/// A float tensor input of layout `shape` and dtypes `dtype` (in words).
pub const fn float(
    name: &'static str,
    required: bool,
    shape: &'static str,
    dtype: &'static str,
) -> InputSpec {
    InputSpec {
        name,
        required,
        kind: InputKind::Float,
        shape,
        dtype,
    }
}

/// An index tensor input (`int32` or `int64`) of layout `shape`.
pub const fn index(name: &'static str, required: bool, shape: &'static str) -> InputSpec {
    InputSpec {
        name,
        required,
        kind: InputKind::Index,
        shape,
        dtype: INDEX_DTYPES,
    }
}

/// A parameter; `default` is JSON text (`None`: the parameter is required).
pub const fn param(name: &'static str, ty: ParamType, default: Option<&'static str>) -> ParamSpec {
    ParamSpec { name, ty, default }
}

/// An output of layout `shape` and dtype `dtype` (in words), compared as a whole (no parts),
/// required in a case, produced on every call (see [`OutputSpec::when`]).
pub const fn output(
    name: &'static str,
    shape: &'static str,
    dtype: &'static str,
    class: ClassFn,
    rule: RuleFn,
) -> OutputSpec {
    OutputSpec {
        name,
        optional: false,
        class,
        rule,
        parts: &[],
        shape,
        dtype,
        present: "always",
    }
}

#[cfg(test)]
mod tests {
    use super::ranks;

    #[test]
    fn ranks_are_read_from_the_bracketed_layouts() {
        assert_eq!(ranks("[B, T, H, K]"), [4]);
        assert_eq!(ranks("[B, T, H] or [B, T, H, S]"), [3, 4]);
        assert_eq!(
            ranks("[N, HV, K, V] ([N, HV, V, K] with state_v_first)"),
            [4]
        );
        assert_eq!(ranks("[N + 1]"), [1]);
        assert_eq!(ranks("[S, HV, K, V + K]"), [4]);
        assert!(ranks("any rank >= 1").is_empty());
    }
}
