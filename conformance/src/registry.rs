//! The op registry: one [`OpSpec`] per operation of the spec, with its inputs, parameters
//! (types and defaults), outputs (expected dtype class and comparison rule) and runners.
//!
//! Adding an op is one entry in [`OPS`] plus its runner function in [`crate::ops`].

use crate::case::Tensors;
use crate::compare::Rule;
use crate::error::Problem;
use crate::ops::{self, scan_threshold};
use crate::params::{ParamSpec, ParamType, Params};
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
}

/// The dtype class an output must have, given the call's inputs and parameters.
pub type ClassFn = fn(&Tensors, &Params) -> Result<DtypeClass, Problem>;
/// The comparison rule of an output, given the call and the class the candidate was computed in.
pub type RuleFn = fn(&Tensors, &Params, DtypeClass) -> Rule;
/// Runs an op on a case's inputs and validated parameters; returns its outputs by name.
pub type Runner = fn(&Tensors, &Params) -> Result<Tensors, Problem>;

/// One output of an op.
#[derive(Debug, Clone, Copy)]
pub struct OutputSpec {
    pub name: &'static str,
    /// Whether a case may leave it out although the op produces it (e.g. `lse`, which
    /// PyTorch's SDPA does not return). A required output that is absent is a failure.
    pub optional: bool,
    pub class: ClassFn,
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
}

impl OpSpec {
    pub fn input(&self, name: &str) -> Option<&InputSpec> {
        self.inputs.iter().find(|i| i.name == name)
    }
    pub fn output(&self, name: &str) -> Option<&OutputSpec> {
        self.outputs.iter().find(|o| o.name == name)
    }
    pub fn input_names(&self) -> String {
        names(self.inputs.iter().map(|i| i.name))
    }
    pub fn output_names(&self) -> String {
        names(self.outputs.iter().map(|o| o.name))
    }
    /// The devices that implement this op (`cpu` always).
    pub fn devices(&self) -> Vec<&'static str> {
        let mut d = vec!["cpu"];
        if self.gpu.is_some() {
            d.push("gpu");
        }
        d
    }
}

fn names<'a>(it: impl Iterator<Item = &'a str>) -> String {
    it.collect::<Vec<_>>().join(", ")
}

/// The registry entry of op `id`.
pub fn find(id: &str) -> Option<&'static OpSpec> {
    OPS.iter().find(|o| o.id == id)
}

/// Whether GPU runners can run here; `Err` says why not. Until `attn-gpu` provides runners
/// (and a run-time probe of the device, which belongs here), no op has one.
pub fn gpu_status() -> Result<(), String> {
    if OPS.iter().any(|o| o.gpu.is_some()) {
        Ok(())
    } else {
        Err("this build of attn-conform has no GPU runner for any op".into())
    }
}

const fn float(name: &'static str, required: bool) -> InputSpec {
    InputSpec {
        name,
        required,
        kind: InputKind::Float,
    }
}

const fn index(name: &'static str, required: bool) -> InputSpec {
    InputSpec {
        name,
        required,
        kind: InputKind::Index,
    }
}

const fn param(name: &'static str, ty: ParamType, default: Option<&'static str>) -> ParamSpec {
    ParamSpec { name, ty, default }
}

const fn output(name: &'static str, class: ClassFn, rule: RuleFn) -> OutputSpec {
    OutputSpec {
        name,
        optional: false,
        class,
        rule,
    }
}

const FLOAT_OUT: &[&str] = &["float32", "float64"];
const LAYOUTS: &[&str] = &["bshd", "bhsd"];
const P_REVERSE: ParamSpec = param("reverse", ParamType::Bool, Some("false"));
const P_SCALE: ParamSpec = param("scale", ParamType::OptFloat, Some("null"));
const P_CHUNK: ParamSpec = param("chunk_size", ParamType::Int, None);
const P_OUT_F32: ParamSpec = param(
    "output_dtype",
    ParamType::OptStr(FLOAT_OUT),
    Some("\"float32\""),
);
const P_LOWER: ParamSpec = param("lower_bound", ParamType::OptFloat, Some("null"));
const P_LAYOUT: ParamSpec = param("cache_layout", ParamType::Str(LAYOUTS), Some("\"bshd\""));
const GATE_INPUTS: [InputSpec; 3] = [
    float("g", true),
    float("A_log", false),
    float("dt_bias", false),
];

/// The ops of the spec, in the order of its files.
pub static OPS: &[OpSpec] = &[
    OpSpec {
        id: "cumsum",
        summary: "torch.cumsum(x, dim) with reverse",
        inputs: &[float("x", true)],
        params: &[
            param("dim", ParamType::Int, Some("-1")),
            P_REVERSE,
            param("output_dtype", ParamType::OptStr(FLOAT_OUT), Some("null")),
        ],
        outputs: &[output(
            "y",
            |i, p| ops::out_class(i, p, "x"),
            |i, p, c| scan_threshold(c, ops::cumsum_len(i, p)),
        )],
        cpu: ops::scans::cumsum,
        gpu: None,
    },
    OpSpec {
        id: "chunk_local_cumsum",
        summary: "per-chunk prefix sums of g [B,T,H(,S)], varlen-aware",
        inputs: &[float("g", true), index("cu_seqlens", false)],
        params: &[P_CHUNK, P_REVERSE, P_SCALE, P_OUT_F32],
        outputs: &[output(
            "o",
            |i, p| ops::out_class(i, p, "g"),
            |_, _, c| match c {
                DtypeClass::Float32 => Rule::Threshold(1e-6),
                c => Rule::default_for(c),
            },
        )],
        cpu: ops::scans::chunk_local_cumsum,
        gpu: None,
    },
    OpSpec {
        id: "chunk_global_cumsum",
        summary: "whole-sequence prefix sums of g [B,T,H(,S)], varlen-aware",
        inputs: &[float("g", true), index("cu_seqlens", false)],
        params: &[P_REVERSE, P_SCALE, P_OUT_F32],
        outputs: &[output(
            "o",
            |i, p| ops::out_class(i, p, "g"),
            |i, _, c| scan_threshold(c, ops::longest_sequence(i)),
        )],
        cpu: ops::scans::chunk_global_cumsum,
        gpu: None,
    },
    OpSpec {
        id: "kda_gate",
        summary: "KDA decay -exp(A_log)*softplus(g+dt_bias), or lower_bound*sigmoid(...)",
        inputs: &GATE_INPUTS,
        params: &[P_LOWER],
        outputs: &[output(
            "y",
            |_, _| Ok(DtypeClass::Float32),
            |_, _, c| Rule::default_for(c),
        )],
        cpu: ops::gates::kda_gate,
        gpu: None,
    },
    OpSpec {
        id: "kda_gate_chunk_cumsum",
        summary: "chunk_local_cumsum(kda_gate(g, A_log, dt_bias)) fused",
        inputs: &[
            GATE_INPUTS[0],
            GATE_INPUTS[1],
            GATE_INPUTS[2],
            index("cu_seqlens", false),
        ],
        params: &[P_CHUNK, P_SCALE, P_LOWER, P_OUT_F32, P_REVERSE],
        outputs: &[output(
            "o",
            |i, p| ops::out_class(i, p, "g"),
            |_, _, c| Rule::default_for(c),
        )],
        cpu: ops::gates::kda_gate_chunk_cumsum,
        gpu: None,
    },
    OpSpec {
        id: "kv_cache_update",
        summary: "write k, v into static caches at cache_seqlens (bit exact)",
        inputs: &[
            float("k_cache", true),
            float("v_cache", true),
            float("k", true),
            float("v", true),
            index("cache_seqlens", true),
            index("cache_batch_idx", false),
        ],
        params: &[P_LAYOUT],
        outputs: &[
            output(
                "k_cache",
                |i, _| ops::class_of(i, "k_cache"),
                |_, _, _| Rule::Exact,
            ),
            output(
                "v_cache",
                |i, _| ops::class_of(i, "v_cache"),
                |_, _, _| Rule::Exact,
            ),
        ],
        cpu: ops::decode::kv_cache_update,
        gpu: None,
    },
    OpSpec {
        id: "decode_attention",
        summary: "attention of q over the valid prefix of static KV caches",
        inputs: &[
            float("q", true),
            float("k_cache", true),
            float("v_cache", true),
            index("cache_seqlens", true),
            index("cache_batch_idx", false),
        ],
        params: &[
            param("softmax_scale", ParamType::OptFloat, Some("null")),
            param("causal", ParamType::Bool, Some("true")),
            P_LAYOUT,
        ],
        outputs: &[
            output(
                "o",
                |i, _| ops::class_of(i, "q"),
                |_, _, c| Rule::default_for(c),
            ),
            OutputSpec {
                name: "lse",
                optional: true,
                class: ops::decode::lse_class,
                rule: ops::decode::lse_rule,
            },
        ],
        cpu: ops::decode::decode_attention,
        gpu: None,
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_found() {
        for op in OPS {
            assert_eq!(OPS.iter().filter(|o| o.id == op.id).count(), 1, "{}", op.id);
            assert!(std::ptr::eq(find(op.id).unwrap(), op));
        }
        assert!(find("no_such_op").is_none());
    }

    #[test]
    fn every_default_parses_and_has_its_type() {
        for op in OPS {
            for p in op.params {
                let d = p
                    .default_value()
                    .unwrap_or_else(|e| panic!("{}.{}: {e}", op.id, p.name));
                if let Some(v) = d {
                    assert!(p.ty.accepts(&v), "{}.{}", op.id, p.name);
                }
            }
        }
    }

    #[test]
    fn names_are_unique_within_an_op() {
        for op in OPS {
            let mut n: Vec<_> = op.inputs.iter().map(|i| i.name).collect();
            n.sort();
            n.dedup();
            assert_eq!(n.len(), op.inputs.len(), "{}", op.id);
            let mut p: Vec<_> = op.params.iter().map(|i| i.name).collect();
            p.sort();
            p.dedup();
            assert_eq!(p.len(), op.params.len(), "{}", op.id);
        }
    }
}
