//! The op registry: one [`OpSpec`] per operation of the spec, with its inputs, parameters
//! (types and defaults), outputs (expected dtype class and comparison rule) and runners.
//!
//! Adding an op is one entry in [`OPS`] plus its runner function in [`crate::ops`].

use crate::case::Tensors;
use crate::compare::Rule;
use crate::error::Problem;
use crate::ops::{self, delta, scan_threshold};
use crate::params::{ParamSpec, ParamType, Params};
use crate::tensor::Tensor;
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
    /// When not empty, the output is compared as these parts (one row each, e.g. `hm.b` and
    /// `hm.M` of `fwd_h_pre_scan`) instead of as a whole.
    pub parts: &'static [PartSpec],
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
}

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

/// Whether GPU runners can run here: some op has one and a GPU answers at run time (the
/// driver, NVRTC and a device are probed once per process); `Err` says why not.
pub fn gpu_status() -> Result<(), String> {
    if !OPS.iter().any(|o| o.gpu.is_some()) {
        return Err("this build of attn-conform has no GPU runner for any op".into());
    }
    ops::gpu::status()
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
        parts: &[],
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
const P_CHUNK64: ParamSpec = param("chunk_size", ParamType::Int, Some("64"));
const P_FINAL: ParamSpec = param("output_final_state", ParamType::Bool, Some("false"));
const P_V_FIRST: ParamSpec = param("state_v_first", ParamType::Bool, Some("false"));
const P_SAVE_V: ParamSpec = param("save_new_value", ParamType::Bool, Some("true"));
const P_SAFE_GATE: ParamSpec = param("safe_gate", ParamType::Bool, Some("false"));
const P_L2NORM: ParamSpec = param("use_qk_l2norm_in_kernel", ParamType::Bool, Some("false"));
/// `k, w, u, g, gk` of the state-recurrence ops (spec 2.1), then the op's own inputs.
macro_rules! fwd_h_inputs {
    ($($extra:expr),* $(,)?) => {
        &[
            float("k", true),
            float("w", true),
            float("u", true),
            float("g", false),
            float("gk", false),
            $($extra),*
        ]
    };
}
/// `h`, `v_new`, `final_state` of section 2 (and 5): the `half` / `half_long` / `f32`
/// thresholds of `h` and `v_new`, then those of `final_state`.
macro_rules! fwd_h_outputs {
    ($h:literal, $h_long:literal, $h32:literal; $s:literal, $s_long:literal, $s32:literal) => {
        [
            output(
                "h",
                |i, _| ops::class_of(i, "k"),
                |i, _, c| delta::threshold(i, "k", c, $h, $h_long, $h32),
            ),
            output(
                "v_new",
                |i, _| ops::class_of(i, "u"),
                |i, _, c| delta::threshold(i, "k", c, $h, $h_long, $h32),
            ),
            output(
                "final_state",
                |i, _| Ok(delta::f32_class(i, "k")),
                |i, _, c| delta::threshold(i, "k", c, $s, $s_long, $s32),
            ),
        ]
    };
}
const FWD_H_OUTPUTS: [OutputSpec; 3] = fwd_h_outputs!(1e-2, 1e-2, 1e-5; 5e-3, 1e-2, 1e-5);
/// Section 5's outputs, with its looser float32 threshold.
const SPLIT_OUTPUTS: [OutputSpec; 3] = fwd_h_outputs!(1e-2, 1e-2, 5e-5; 1e-2, 1e-2, 5e-5);
/// An output of `kda_intra` stored in the dtype of input `like` (README thresholds by `q`).
macro_rules! intra_output {
    ($name:literal, $like:literal) => {
        output(
            $name,
            |i, _| ops::class_of(i, $like),
            |i, _, c| delta::threshold(i, "q", c, 5e-3, 5e-3, 1e-5),
        )
    };
}
/// `q, k, v, g, beta, initial_state` of `kda_fwd` / `gdn_fwd` (spec 6.1, 8.1), then the op's
/// own inputs.
macro_rules! forward_inputs {
    ($($extra:expr),* $(,)?) => {
        &[
            float("q", true),
            float("k", true),
            float("v", true),
            float("g", true),
            float("beta", true),
            float("initial_state", false),
            $($extra),*
        ]
    };
}
/// `o` and `final_state` of `kda_fwd` / `gdn_fwd` (spec 6.8, 8.8).
const FORWARD_OUTPUTS: [OutputSpec; 2] = [
    output(
        "o",
        |i, _| ops::class_of(i, "q"),
        |i, _, c| delta::threshold(i, "q", c, 5e-3, 1e-2, 1e-5),
    ),
    output(
        "final_state",
        |i, _| Ok(delta::f32_class(i, "q")),
        |i, _, c| delta::threshold(i, "q", c, 5e-3, 1e-2, 1e-5),
    ),
];
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
        gpu: Some(ops::gpu::cumsum),
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
        gpu: Some(ops::gpu::chunk_local_cumsum),
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
        gpu: Some(ops::gpu::chunk_global_cumsum),
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
        gpu: Some(ops::gpu::kda_gate),
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
        gpu: Some(ops::gpu::kda_gate_chunk_cumsum),
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
                parts: &[],
            },
        ],
        cpu: ops::decode::decode_attention,
        gpu: None,
    },
    OpSpec {
        id: "chunk_gated_delta_rule_fwd_h",
        summary: "chunked delta-rule state recurrence: h per chunk, v_new = u - w S, final state",
        inputs: fwd_h_inputs![float("initial_state", false), index("cu_seqlens", false)],
        params: &[P_CHUNK64, P_FINAL, P_SAVE_V, P_V_FIRST],
        outputs: &FWD_H_OUTPUTS,
        cpu: ops::delta::chunk_gated_delta_rule_fwd_h,
        gpu: None,
    },
    OpSpec {
        id: "fwd_h_pre_scan",
        summary: "affine summary hm = [b | M] of each (sub-)sequence's chunk recurrence",
        inputs: fwd_h_inputs![index("cu_seqlens", false)],
        params: &[P_CHUNK64],
        outputs: &[OutputSpec {
            name: "hm",
            optional: false,
            class: |i, _| Ok(delta::f32_class(i, "k")),
            rule: |i, _, c| delta::threshold(i, "k", c, 5e-3, 1e-2, 1e-5),
            parts: &[
                PartSpec {
                    name: "hm.b",
                    take: delta::hm_b,
                    rule: |i, _, c| delta::threshold(i, "k", c, 5e-3, 1e-2, 1e-5),
                },
                PartSpec {
                    name: "hm.M",
                    take: delta::hm_m,
                    rule: |i, _, c| delta::threshold(i, "k", c, 1e-2, 1e-2, 1e-5),
                },
            ],
        }],
        cpu: ops::delta::fwd_h_pre_scan,
        gpu: None,
    },
    OpSpec {
        id: "fwd_h_merge",
        summary: "prefix chain X <- M X + b over each sequence's sub-sequence summaries",
        inputs: &[
            float("hm", true),
            index("subseq_offsets", true),
            float("initial_state", false),
        ],
        params: &[P_V_FIRST, P_FINAL],
        outputs: &[
            output(
                "initial_states",
                |i, _| Ok(delta::f32_class(i, "hm")),
                |i, _, c| delta::threshold(i, "hm", c, 2e-5, 2e-5, 2e-5),
            ),
            output(
                "final_state",
                |i, _| Ok(delta::f32_class(i, "hm")),
                |i, _, c| delta::threshold(i, "hm", c, 2e-5, 2e-5, 2e-5),
            ),
        ],
        cpu: ops::delta::fwd_h_merge,
        gpu: None,
    },
    OpSpec {
        id: "chunk_gated_delta_rule_fwd_h_split",
        summary: "fwd_h through chunk-aligned sub-sequences: pre-scan, merge, fwd_h (same result)",
        inputs: fwd_h_inputs![
            float("initial_state", false),
            index("cu_seqlens", false),
            index("subseq_cu_seqlens", false),
        ],
        params: &[P_CHUNK64, P_FINAL, P_SAVE_V, P_V_FIRST],
        outputs: &SPLIT_OUTPUTS,
        cpu: ops::delta::chunk_gated_delta_rule_fwd_h_split,
        gpu: None,
    },
    OpSpec {
        id: "kda_intra",
        summary: "KDA intra-chunk stage: Aqk, Akk = (I + L)^-1, WY factors w, u, gated keys kg",
        inputs: &[
            float("q", true),
            float("k", true),
            float("v", true),
            float("gk", true),
            float("beta", true),
            index("cu_seqlens", false),
        ],
        params: &[P_SCALE, P_CHUNK64, P_SAFE_GATE],
        outputs: &[
            intra_output!("w", "k"),
            intra_output!("u", "v"),
            intra_output!("kg", "k"),
            intra_output!("Aqk", "k"),
            intra_output!("Akk", "k"),
        ],
        cpu: ops::delta::kda_intra,
        gpu: None,
    },
    OpSpec {
        id: "kda_fwd",
        summary: "Kimi Delta Attention forward (recurrent definition), in-kernel gate/beta/l2norm",
        inputs: forward_inputs![
            float("A_log", false),
            float("dt_bias", false),
            index("cu_seqlens", false),
        ],
        params: &[
            P_SCALE,
            P_FINAL,
            P_L2NORM,
            param("use_gate_in_kernel", ParamType::Bool, Some("false")),
            P_LOWER,
            param("use_beta_sigmoid_in_kernel", ParamType::Bool, Some("false")),
            param("allow_neg_eigval", ParamType::Bool, Some("false")),
            P_SAFE_GATE,
            P_CHUNK64,
            P_V_FIRST,
        ],
        outputs: &FORWARD_OUTPUTS,
        cpu: ops::delta::kda_fwd,
        gpu: None,
    },
    OpSpec {
        id: "gdn_fwd",
        summary: "Gated DeltaNet forward (recurrent definition), scalar gate per head",
        inputs: forward_inputs![index("cu_seqlens", false)],
        params: &[P_SCALE, P_FINAL, P_L2NORM, P_CHUNK64, P_V_FIRST],
        outputs: &FORWARD_OUTPUTS,
        cpu: ops::delta::gdn_fwd,
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
