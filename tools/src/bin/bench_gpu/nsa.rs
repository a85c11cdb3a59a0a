//! The NSA cases of `bench_gpu` (issue 15's table): `nsa_compress_kv` on `k` and `v` bf16 (fixed
//! length and 64 varlen sequences of 512..4096 tokens), `nsa_gate_combine` in the W form, and
//! `nsa_select_blocks` mode `"fla"` at T 32768, HQ 64, H 4, K 128, BS 64, 16 blocks.
//!
//! Bytes = every input element read once + every output element written once (`k_cmp`, `v_cmp`;
//! `o` and the fp32 `gates`). Selection is compute-bound: its row reports time (and the same
//! byte count, for completeness). Inputs are random, never zeros; compression alternates two
//! input sets (one set alone may fit in the L2), the other cases' inputs exceed the L2 many
//! times over.

use super::{random_tensor, time_ms};
use attn_gpu::{
    nsa_compress_kv_into, nsa_gate_combine_into, nsa_select_blocks_into, CombineInputs,
    CompressInputs, DeviceTensor, GateForm, Gpu, GpuResult, SelectInputs,
};
use attn_reference::nsa::{BlockCounts, PartialBlock, SelectMode};
use attn_reference::Dtype;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

/// One case: its name (shared with `bench_anchors.py`) and what it runs.
pub struct NsaCase {
    pub name: &'static str,
    op: NsaOp,
}

enum NsaOp {
    /// `k`, `v` `[b, t, h, d]` (or varlen sequences), block size.
    Compress {
        b: usize,
        seqs: Vec<usize>,
        h: usize,
        d: usize,
        bs: i64,
    },
    /// W form on `[1, t, hq, d]`.
    CombineW { t: usize, hq: usize, d: usize },
    /// `"fla"` selection.
    SelectFla {
        t: usize,
        hq: usize,
        h: usize,
        k: usize,
        bs: i64,
        n_sel: i64,
    },
}

/// 64 sequence lengths drawn uniformly in 512..=4096 (seeded).
fn varlen_64() -> Vec<usize> {
    let mut rng = StdRng::seed_from_u64(64);
    (0..64).map(|_| rng.random_range(512..=4096)).collect()
}

pub fn cases() -> Vec<NsaCase> {
    let c = |name, op| NsaCase { name, op };
    vec![
        c(
            "nsa_compress_kv_1x65536x4x128_bs32",
            NsaOp::Compress {
                b: 1,
                seqs: vec![65536],
                h: 4,
                d: 128,
                bs: 32,
            },
        ),
        c(
            "nsa_compress_kv_4x16384x8x128_bs64",
            NsaOp::Compress {
                b: 4,
                seqs: vec![16384],
                h: 8,
                d: 128,
                bs: 64,
            },
        ),
        c(
            "nsa_compress_kv_varlen64_h4x128_bs32",
            NsaOp::Compress {
                b: 1,
                seqs: varlen_64(),
                h: 4,
                d: 128,
                bs: 32,
            },
        ),
        c(
            "nsa_gate_combine_w_1x32768x32x128",
            NsaOp::CombineW {
                t: 32768,
                hq: 32,
                d: 128,
            },
        ),
        c(
            "nsa_select_blocks_fla_t32768_hq64_h4_k128_bs64_s16",
            NsaOp::SelectFla {
                t: 32768,
                hq: 64,
                h: 4,
                k: 128,
                bs: 64,
                n_sel: 16,
            },
        ),
    ]
}

/// Times one case; returns its JSON row (and prints it).
pub fn run(gpu: &Gpu, case: &NsaCase, iters: usize, ceiling: f64) -> GpuResult<Value> {
    let bf = Dtype::BF16;
    let seqlens = match &case.op {
        NsaOp::Compress { seqs, .. } if seqs.len() > 1 => seqs.clone(),
        _ => Vec::new(),
    };
    let (ms, bytes, shape) = match &case.op {
        NsaOp::Compress { b, seqs, h, d, bs } => {
            let t: usize = seqs.iter().sum();
            let cu: Option<Vec<i64>> = (seqs.len() > 1).then(|| {
                std::iter::once(0)
                    .chain(seqs.iter().scan(0i64, |a, &l| {
                        *a += l as i64;
                        Some(*a)
                    }))
                    .collect()
            });
            let rows: usize = seqs
                .iter()
                .map(|&l| l.div_ceil(*bs as usize))
                .sum::<usize>()
                * b;
            let shape = [*b, t, *h, *d];
            // two input sets, alternated: k and v of one set alone may fit in the L2
            let sets: Vec<(DeviceTensor, DeviceTensor)> = (0..2)
                .map(|i| {
                    Ok((
                        random_tensor(gpu, &shape, bf, -2.0, 2.0, 1 + 2 * i)?,
                        random_tensor(gpu, &shape, bf, -2.0, 2.0, 2 + 2 * i)?,
                    ))
                })
                .collect::<GpuResult<_>>()?;
            let out_shape = if cu.is_some() {
                [1, rows, *h, *d]
            } else {
                [*b, rows / b, *h, *d]
            };
            let mut kc = DeviceTensor::alloc(gpu, &out_shape, bf)?;
            let mut vc = DeviceTensor::alloc(gpu, &out_shape, bf)?;
            let ms = time_ms(gpu, iters, |i| {
                let (k, v) = &sets[i % 2];
                let x = CompressInputs {
                    k,
                    v: Some(v),
                    w_k: None,
                    w_v: None,
                };
                let (p, cu) = (PartialBlock::MeanOfValid, cu.as_deref());
                nsa_compress_kv_into(gpu, &x, cu, *bs, p, &mut kc, Some(&mut vc))
            })?;
            (
                ms,
                2 * (sets[0].0.num_bytes() + kc.num_bytes()),
                shape.to_vec(),
            )
        }
        NsaOp::CombineW { t, hq, d } => {
            let shape = [1, *t, *hq, *d];
            let q = random_tensor(gpu, &shape, bf, -1.0, 1.0, 3)?;
            let o: Vec<DeviceTensor> = (0..3)
                .map(|i| random_tensor(gpu, &shape, bf, -2.0, 2.0, 4 + i))
                .collect::<GpuResult<_>>()?;
            let w = random_tensor(gpu, &[*hq, 3, *d], bf, -0.2, 0.2, 7)?;
            let mut out = DeviceTensor::alloc(gpu, &shape, bf)?;
            let mut gates = DeviceTensor::alloc(gpu, &[1, *t, *hq, 3], Dtype::F32)?;
            let x = CombineInputs {
                o_cmp: &o[0],
                o_slc: &o[1],
                o_swa: &o[2],
                gates: GateForm::W { q: &q, weight: &w },
            };
            let ms = time_ms(gpu, iters, |_| {
                nsa_gate_combine_into(gpu, &x, &mut out, &mut gates)
            })?;
            let bytes = 5 * q.num_bytes() + gates.num_bytes() + w.num_bytes();
            (ms, bytes, shape.to_vec())
        }
        NsaOp::SelectFla {
            t,
            hq,
            h,
            k,
            bs,
            n_sel,
        } => {
            let q = random_tensor(gpu, &[1, *t, *hq, *k], bf, -1.0, 1.0, 8)?;
            let tc = t.div_ceil(*bs as usize);
            let kc = random_tensor(gpu, &[1, tc, *h, *k], bf, -1.0, 1.0, 9)?;
            let mut out = DeviceTensor::alloc(gpu, &[1, *t, *h, *n_sel as usize], Dtype::I32)?;
            let x = SelectInputs { q: &q, k_cmp: &kc };
            let ms = time_ms(gpu, iters, |_| {
                nsa_select_blocks_into(
                    gpu,
                    &x,
                    Some(BlockCounts::Int(*n_sel)),
                    None,
                    *bs,
                    None,
                    SelectMode::Fla,
                    256,
                    true,
                    &mut out,
                )
            })?;
            (
                ms,
                q.num_bytes() + kc.num_bytes() + out.num_bytes(),
                vec![1, *t, *hq, *k],
            )
        }
    };
    let gbps = bytes as f64 / (ms * 1e-3) / 1e9;
    println!(
        "{:<40} {:>10.4} {:>10.0} {:>8.1}% {:>8}",
        case.name,
        ms,
        gbps,
        100.0 * gbps / ceiling,
        1
    );
    Ok(json!({
        "name": case.name, "shape": shape, "in_dtype": "bfloat16", "out_dtype": "bfloat16",
        "bytes": bytes, "median_ms": ms, "gbps": gbps, "share": gbps / ceiling, "sets": 1,
        "seqlens": seqlens,
    }))
}
