//! Shared test helpers: a seeded generator, random tensors, and valid cases of every op whose
//! outputs are the reference's own, rounded to the dtype the op's spec gives them.
#![allow(dead_code)]

use attn_conformance::{find, Case, Tensor, Tensors};
use attn_reference::{Dtype, DtypeClass};
use ndarray::{ArrayD, IxDyn};
use rand::rngs::StdRng;
use rand::{Rng as _, RngCore, SeedableRng};
use serde_json::{json, Value};
use std::path::Path;
use std::process::{Command, Output};

/// Seeded random inputs: a thin layer over `rand`'s [`StdRng`].
pub struct Rng(StdRng);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(StdRng::seed_from_u64(seed))
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }
    /// Uniform in `[-1, 1)`.
    pub fn uniform(&mut self) -> f64 {
        self.0.random_range(-1.0..1.0)
    }
    /// Uniform integer in `0 .. n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.0.random_range(0..n)
    }
    /// A tensor of `shape` with entries uniform in `[-scale, scale)`.
    pub fn array(&mut self, shape: &[usize], scale: f64) -> ArrayD<f64> {
        ArrayD::from_shape_simple_fn(IxDyn(shape), || scale * self.uniform())
    }
    pub fn tensor(&mut self, shape: &[usize], dtype: Dtype, scale: f64) -> Tensor {
        Tensor::from_f64(&self.array(shape, scale), dtype)
    }
}

pub fn idx(v: &[i64], dtype: Dtype) -> Tensor {
    Tensor::from_f64(
        &ArrayD::from_shape_vec(IxDyn(&[v.len()]), v.iter().map(|&x| x as f64).collect()).unwrap(),
        dtype,
    )
}

/// The dtype a candidate of `class` is stored in (`like` for half: bf16 or f16).
fn dtype_of(class: DtypeClass, like: Dtype) -> Dtype {
    match class {
        DtypeClass::Float64 => Dtype::F64,
        DtypeClass::Float32 => Dtype::F32,
        DtypeClass::Half if like.class() == DtypeClass::Half => like,
        DtypeClass::Half => Dtype::BF16,
        DtypeClass::Int => Dtype::I64,
    }
}

/// Fills `case.outputs` with the reference's outputs, rounded to each output's expected class.
pub fn fill_outputs(case: &mut Case) {
    let spec = find(&case.op).unwrap();
    let params = attn_conformance::registry::params_of(case).unwrap();
    let out = (spec.cpu)(&case.inputs, &params).unwrap();
    let like = case
        .inputs
        .values()
        .map(Tensor::dtype)
        .find(|d| d.is_float())
        .unwrap();
    for o in spec.outputs {
        let r = &out[o.name];
        let class = (o.class)(&case.inputs, &params).unwrap();
        let t = match r {
            Tensor::F64(a) => Tensor::from_f64(a, dtype_of(class, like)),
            exact => exact.clone(),
        };
        case.outputs.insert(o.name.to_string(), t);
    }
}

fn case(op: &str, params: Value, inputs: Vec<(&str, Tensor)>) -> Case {
    let mut c = Case::new(op, "attn-reference-test");
    c.params = params.as_object().unwrap().clone();
    c.inputs = inputs
        .into_iter()
        .map(|(n, t)| (n.to_string(), t))
        .collect::<Tensors>();
    fill_outputs(&mut c);
    c
}

/// One valid case of every registered op, from random inputs (`seed`), outputs included.
pub fn valid_cases(seed: u64) -> Vec<Case> {
    let mut r = Rng::new(seed);
    let bias = r.below(3) as i64;
    let cu = [0, 5 + bias, 5 + bias, 20];
    let caches = |shape: &[usize], dtype, r: &mut Rng| r.tensor(shape, dtype, 1.0);
    let kc = caches(&[2, 8, 2, 4], Dtype::BF16, &mut r);
    let vc = caches(&[2, 8, 2, 4], Dtype::BF16, &mut r);
    // decode caches with NaN beyond each row's valid prefix (rows 2 and 0 are used, lengths 5 and 16)
    let mut dk = r.array(&[3, 16, 2, 8], 1.0);
    let mut dv = r.array(&[3, 16, 2, 8], 1.0);
    for a in [&mut dk, &mut dv] {
        for s in 5..16 {
            a.slice_mut(ndarray::s![2, s, .., ..]).fill(f64::NAN);
        }
        a.slice_mut(ndarray::s![1, .., .., ..]).fill(f64::NAN);
    }
    vec![
        case(
            "cumsum",
            json!({"dim": 1, "reverse": true}),
            vec![("x", r.tensor(&[3, 7, 4], Dtype::F32, 1.0))],
        ),
        case(
            "chunk_local_cumsum",
            json!({"chunk_size": 4, "scale": 1.4426950216}),
            vec![
                ("g", r.tensor(&[1, 20, 2], Dtype::F32, 1.0)),
                ("cu_seqlens", idx(&cu, Dtype::I32)),
            ],
        ),
        case(
            "chunk_global_cumsum",
            json!({"reverse": true, "output_dtype": null}),
            vec![("g", r.tensor(&[2, 9, 2, 3], Dtype::BF16, 1.0))],
        ),
        case(
            "kda_gate",
            json!({}),
            vec![
                ("g", r.tensor(&[2, 5, 2, 4], Dtype::F32, 3.0)),
                ("A_log", r.tensor(&[2], Dtype::F32, 1.0)),
                ("dt_bias", r.tensor(&[8], Dtype::F32, 1.0)),
            ],
        ),
        case(
            "kda_gate_chunk_cumsum",
            json!({"chunk_size": 4, "scale": 1.4426950216, "lower_bound": -3.0}),
            vec![
                ("g", r.tensor(&[1, 10, 2, 4], Dtype::F32, 2.0)),
                ("A_log", r.tensor(&[2], Dtype::F32, 1.0)),
                ("cu_seqlens", idx(&[0, 3, 10], Dtype::I64)),
            ],
        ),
        case(
            "kv_cache_update",
            json!({"cache_layout": "bshd"}),
            vec![
                ("k_cache", kc),
                ("v_cache", vc),
                ("k", r.tensor(&[2, 2, 2, 4], Dtype::BF16, 1.0)),
                ("v", r.tensor(&[2, 2, 2, 4], Dtype::BF16, 1.0)),
                ("cache_seqlens", idx(&[3, 6], Dtype::I32)),
                ("cache_batch_idx", idx(&[1, 0], Dtype::I32)),
            ],
        ),
        case(
            "decode_attention",
            json!({"causal": true}),
            vec![
                ("q", r.tensor(&[2, 2, 4, 8], Dtype::F32, 1.0)),
                ("k_cache", Tensor::from_f64(&dk, Dtype::F32)),
                ("v_cache", Tensor::from_f64(&dv, Dtype::F32)),
                ("cache_seqlens", idx(&[5, 16], Dtype::I32)),
                ("cache_batch_idx", idx(&[2, 0], Dtype::I32)),
            ],
        ),
        // delta rule (`conformance/spec/ops-delta-rule.md`): small shapes, negative gates, GVA,
        // varlen
        case(
            "chunk_gated_delta_rule_fwd_h",
            json!({"chunk_size": 16, "output_final_state": true}),
            vec![
                ("k", r.tensor(&[1, 20, 1, 4], Dtype::F32, 0.5)),
                ("w", r.tensor(&[1, 20, 2, 4], Dtype::F32, 0.2)),
                ("u", r.tensor(&[1, 20, 2, 3], Dtype::F32, 1.0)),
                ("gk", r.tensor(&[1, 20, 2, 4], Dtype::F32, -0.3)),
                ("initial_state", r.tensor(&[3, 2, 4, 3], Dtype::F32, 1.0)),
                ("cu_seqlens", idx(&cu, Dtype::I32)),
            ],
        ),
        case(
            "fwd_h_pre_scan",
            json!({"chunk_size": 16}),
            vec![
                ("k", r.tensor(&[1, 20, 1, 4], Dtype::BF16, 0.5)),
                ("w", r.tensor(&[1, 20, 2, 4], Dtype::BF16, 0.2)),
                ("u", r.tensor(&[1, 20, 2, 3], Dtype::BF16, 1.0)),
                ("g", r.tensor(&[1, 20, 2], Dtype::F32, -0.3)),
                ("cu_seqlens", idx(&cu, Dtype::I64)),
            ],
        ),
        case(
            "fwd_h_merge",
            json!({"output_final_state": true, "state_v_first": true}),
            vec![
                ("hm", r.tensor(&[4, 2, 4, 7], Dtype::F32, 0.5)),
                ("subseq_offsets", idx(&[0, 1, 1, 4], Dtype::I64)),
                ("initial_state", r.tensor(&[3, 2, 3, 4], Dtype::F32, 1.0)),
            ],
        ),
        case(
            "chunk_gated_delta_rule_fwd_h_split",
            json!({"chunk_size": 16, "output_final_state": true}),
            vec![
                ("k", r.tensor(&[1, 40, 1, 4], Dtype::F32, 0.5)),
                ("w", r.tensor(&[1, 40, 1, 4], Dtype::F32, 0.2)),
                ("u", r.tensor(&[1, 40, 1, 3], Dtype::F32, 1.0)),
                ("g", r.tensor(&[1, 40, 1], Dtype::F32, -0.3)),
                ("initial_state", r.tensor(&[3, 1, 4, 3], Dtype::F32, 1.0)),
                ("cu_seqlens", idx(&[0, 5, 5, 40], Dtype::I32)),
                ("subseq_cu_seqlens", idx(&[0, 5, 5, 21, 37, 40], Dtype::I32)),
            ],
        ),
        case(
            "kda_intra",
            json!({"chunk_size": 32}),
            vec![
                ("q", r.tensor(&[1, 20, 1, 4], Dtype::BF16, 0.5)),
                ("k", r.tensor(&[1, 20, 1, 4], Dtype::BF16, 0.5)),
                ("v", r.tensor(&[1, 20, 2, 3], Dtype::BF16, 1.0)),
                ("gk", r.tensor(&[1, 20, 2, 4], Dtype::F32, -1.0)),
                ("beta", r.tensor(&[1, 20, 2], Dtype::F32, 1.0)),
                ("cu_seqlens", idx(&cu, Dtype::I32)),
            ],
        ),
        case(
            "kda_fwd",
            json!({"chunk_size": 32, "use_gate_in_kernel": true, "output_final_state": true}),
            vec![
                ("q", r.tensor(&[2, 9, 1, 4], Dtype::F32, 0.5)),
                ("k", r.tensor(&[2, 9, 1, 4], Dtype::F32, 0.5)),
                ("v", r.tensor(&[2, 9, 2, 3], Dtype::F32, 1.0)),
                ("g", r.tensor(&[2, 9, 2, 4], Dtype::F32, 2.0)),
                ("beta", r.tensor(&[2, 9, 2], Dtype::F32, 1.0)),
                ("A_log", r.tensor(&[2], Dtype::F32, 1.0)),
            ],
        ),
        case(
            "gdn_fwd",
            json!({"chunk_size": 16, "output_final_state": true}),
            vec![
                ("q", r.tensor(&[1, 20, 2, 4], Dtype::F16, 0.5)),
                ("k", r.tensor(&[1, 20, 2, 4], Dtype::F16, 0.5)),
                ("v", r.tensor(&[1, 20, 2, 3], Dtype::F16, 1.0)),
                ("g", r.tensor(&[1, 20, 2], Dtype::F32, -0.3)),
                ("beta", r.tensor(&[1, 20, 2], Dtype::F32, 1.0)),
                ("initial_state", r.tensor(&[3, 2, 4, 3], Dtype::F32, 1.0)),
                ("cu_seqlens", idx(&cu, Dtype::I32)),
            ],
        ),
        // native sparse attention (`conformance/spec/ops-nsa.md`): GQA, partial blocks, varlen
        case(
            "nsa_compress_kv",
            json!({"block_size": 4, "partial_block": "mean_of_valid"}),
            vec![
                ("k", r.tensor(&[1, 20, 2, 4], Dtype::F32, 1.0)),
                ("v", r.tensor(&[1, 20, 2, 3], Dtype::F32, 1.0)),
                ("w_v", r.tensor(&[2, 3, 3], Dtype::F64, 0.5)),
                ("cu_seqlens", idx(&cu, Dtype::I32)),
            ],
        ),
        case(
            "nsa_compression_attention",
            json!({"block_size": 4, "scale": 0.5, "empty_lse": "zero"}),
            vec![
                ("q", r.tensor(&[2, 10, 4, 4], Dtype::F32, 1.0)),
                ("k_cmp", r.tensor(&[2, 3, 2, 4], Dtype::F32, 1.0)),
                ("v_cmp", r.tensor(&[2, 3, 2, 5], Dtype::F32, 1.0)),
            ],
        ),
        case(
            "nsa_select_blocks",
            json!({"block_size": 4, "block_counts": 3, "scale": 0.3}),
            vec![
                ("q", r.tensor(&[1, 20, 4, 4], Dtype::F64, 5.0)),
                ("k_cmp", r.tensor(&[1, 5, 2, 4], Dtype::F64, 5.0)),
            ],
        ),
        case(
            "nsa_selection_attention",
            json!({"block_size": 4}),
            vec![
                ("q", r.tensor(&[1, 12, 2, 4], Dtype::BF16, 1.0)),
                ("k", r.tensor(&[1, 12, 1, 4], Dtype::BF16, 1.0)),
                ("v", r.tensor(&[1, 12, 1, 4], Dtype::BF16, 1.0)),
                (
                    "block_indices",
                    Tensor::I32(ArrayD::from_shape_fn(IxDyn(&[1, 12, 1, 2]), |i| {
                        [0, (i[1] / 4) as i32][i[3]]
                    })),
                ),
            ],
        ),
        case(
            "nsa_gate_combine",
            json!({}),
            vec![
                ("o_cmp", r.tensor(&[1, 6, 2, 3], Dtype::F32, 1.0)),
                ("o_slc", r.tensor(&[1, 6, 2, 3], Dtype::F32, 1.0)),
                ("o_swa", r.tensor(&[1, 6, 2, 3], Dtype::F32, 1.0)),
                ("q", r.tensor(&[1, 6, 2, 4], Dtype::F32, 1.0)),
                ("gate_proj_weight", r.tensor(&[2, 3, 4], Dtype::BF16, 1.0)),
            ],
        ),
        case(
            "nsa_fwd",
            json!({"block_size": 4, "block_counts": 2, "window_size": 3}),
            vec![
                ("q", r.tensor(&[1, 20, 2, 4], Dtype::F32, 1.0)),
                ("k", r.tensor(&[1, 20, 1, 4], Dtype::F32, 1.0)),
                ("v", r.tensor(&[1, 20, 1, 4], Dtype::F32, 1.0)),
                ("g_cmp", r.tensor(&[1, 20, 2], Dtype::F32, 1.0)),
                ("g_slc", r.tensor(&[1, 20, 2], Dtype::F32, 1.0)),
                ("g_swa", r.tensor(&[1, 20, 2], Dtype::F32, 1.0)),
                ("cu_seqlens", idx(&[0, 9, 20], Dtype::I64)),
            ],
        ),
    ]
}

/// The number of `verify` rows of a case: one per output, or one per part of an output that
/// is compared in parts (`hm.b`, `hm.M`).
pub fn rows_of(case: &Case) -> usize {
    let spec = find(&case.op).unwrap();
    case.outputs
        .keys()
        .map(|n| spec.output(n).map_or(1, |o| o.parts.len().max(1)))
        .sum()
}

/// Writes `case` as `dir/<op>/<name>.safetensors` and returns the path.
pub fn write_case(dir: &Path, name: &str, case: &Case) -> std::path::PathBuf {
    let d = dir.join(&case.op);
    std::fs::create_dir_all(&d).unwrap();
    let p = d.join(format!("{name}.safetensors"));
    case.write(&p).unwrap();
    p
}

/// Runs the `attn-conform` binary with `args`.
pub fn conform(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_attn-conform"))
        .args(args)
        .env_remove("ATTN_FIXTURES")
        .output()
        .unwrap()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}
