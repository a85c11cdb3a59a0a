//! The NSA attention cases of `bench_gpu` (issue 16's table), bf16, HQ 64, H 4, K = V = 128,
//! BS 64, 16 blocks, T 32768 and 65536:
//! - `nsa_compression_attention` (`"complete"`, `k_cmp`, `v_cmp` of `T / BS` rows);
//! - `nsa_selection_attention` with 16 slots per row: the current block and random distinct
//!   past ones (`-1` where a row has fewer than 16 blocks), as FLA's tests draw them;
//! - `nsa_fwd` with computed selection and all three gates, window 0 (against FLA
//!   `parallel_nsa`) and window 512 (against dense causal attention), the latter also at T 8192
//!   and 16384 to find where NSA starts to win.
//!
//! Attention is compute-bound: each row reports `flops` (`4 * HQ * K` per attended key: the two
//! products `q·k` and `p·v`; the selection's scores add `2 * HQ * K` per visible block) and
//! `tflops`, which `nsa_anchors.py` compares with the dense bf16 matmul rate of the same run.
//! `bytes` counts every input and output once (for the table).

use super::{random_tensor, time_ms};
use attn_gpu::{
    nsa_compression_attention_into, nsa_fwd, nsa_selection_attention_into, CmpAttnInputs,
    CmpAttnParams, DeviceTensor, FwdInputs, Gpu, GpuResult, SelAttnInputs,
};
use attn_reference::nsa::BlockCounts;
use attn_reference::Dtype;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

/// One case: its name (shared with `nsa_anchors.py`) and what it runs.
pub struct AttnCase {
    pub name: String,
    t: usize,
    op: AttnOp,
}

#[derive(Clone, Copy)]
enum AttnOp {
    Compression,
    Selection,
    /// `nsa_fwd` with this window.
    Fwd(i64),
}

const HQ: usize = 64;
const H: usize = 4;
const D: usize = 128;
const BS: usize = 64;
const S: usize = 16;

pub fn cases() -> Vec<AttnCase> {
    let mut v = Vec::new();
    for t in [32768, 65536] {
        let tag = format!("t{t}_hq{HQ}_h{H}_k{D}_bs{BS}");
        let c = |name: String, op| AttnCase { name, t, op };
        v.push(c(
            format!("nsa_compression_attention_{tag}"),
            AttnOp::Compression,
        ));
        v.push(c(
            format!("nsa_selection_attention_{tag}_s{S}"),
            AttnOp::Selection,
        ));
        v.push(c(format!("nsa_fwd_{tag}_s{S}_w0"), AttnOp::Fwd(0)));
    }
    for t in [8192, 16384, 32768, 65536] {
        v.push(AttnCase {
            name: format!("nsa_fwd_t{t}_hq{HQ}_h{H}_k{D}_bs{BS}_s{S}_w512"),
            t,
            op: AttnOp::Fwd(512),
        });
    }
    v
}

/// `[1, t, H, S]` slots: per row the current block and random distinct past ones, `-1` past
/// the row's blocks.
fn indices(t: usize, seed: u64) -> Vec<i32> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::with_capacity(t * H * S);
    let mut row = Vec::with_capacity(S);
    for p in 0..t {
        let cur = p / BS;
        for _ in 0..H {
            row.clear();
            row.push(cur as i32);
            if cur < S {
                row.extend((0..cur).map(|c| c as i32));
            } else {
                while row.len() < S {
                    let c = rng.random_range(0..cur) as i32;
                    if !row.contains(&c) {
                        row.push(c);
                    }
                }
            }
            row.resize(S, -1);
            out.extend_from_slice(&row);
        }
    }
    out
}

/// Keys attended by the compressed branch ("complete": `(p + 1) / BS` per token).
fn cmp_keys(t: usize) -> f64 {
    (0..t).map(|p| ((p + 1) / BS) as f64).sum()
}

/// Keys attended by the selected branch with the slots of [`indices`] (a block of `BS` tokens,
/// the current one up to `p`).
fn sel_keys(t: usize) -> f64 {
    (0..t)
        .map(|p| {
            let cur = p / BS;
            let full = cur.min(S - 1) * BS;
            (full + p + 1 - cur * BS) as f64
        })
        .sum()
}

/// Times one case; returns its JSON row (and prints it).
pub fn run(gpu: &Gpu, case: &AttnCase, iters: usize, ceiling: f64) -> GpuResult<Value> {
    let bf = Dtype::BF16;
    let t = case.t;
    let tc = t / BS;
    let q = random_tensor(gpu, &[1, t, HQ, D], bf, -1.0, 1.0, 11)?;
    let k = random_tensor(gpu, &[1, t, H, D], bf, -1.0, 1.0, 12)?;
    let v = random_tensor(gpu, &[1, t, H, D], bf, -1.0, 1.0, 13)?;
    let per_key = (4 * HQ * D) as f64;
    let mut o = DeviceTensor::alloc(gpu, &[1, t, HQ, D], bf)?;
    let (ms, flops, bytes) = match case.op {
        AttnOp::Compression => {
            let kc = random_tensor(gpu, &[1, tc, H, D], bf, -1.0, 1.0, 14)?;
            let vc = random_tensor(gpu, &[1, tc, H, D], bf, -1.0, 1.0, 15)?;
            let mut lse = DeviceTensor::alloc(gpu, &[1, t, HQ], Dtype::F32)?;
            let x = CmpAttnInputs {
                q: &q,
                k_cmp: &kc,
                v_cmp: &vc,
            };
            let p = CmpAttnParams::default();
            let ms = time_ms(gpu, iters, |_| {
                nsa_compression_attention_into(gpu, &x, None, &p, &mut o, Some(&mut lse))
            })?;
            let bytes = q.num_bytes() + 2 * kc.num_bytes() + o.num_bytes() + lse.num_bytes();
            (ms, per_key * cmp_keys(t), bytes)
        }
        AttnOp::Selection => {
            let host = ndarray::Array4::from_shape_vec((1, t, H, S), indices(t, 16))
                .expect("t * H * S slots");
            let idx = DeviceTensor::from_array(gpu, host.view().into_dyn())?;
            let mut lse = DeviceTensor::alloc(gpu, &[1, t, HQ], Dtype::F32)?;
            let x = SelAttnInputs {
                q: &q,
                k: &k,
                v: &v,
                block_indices: &idx,
            };
            let ms = time_ms(gpu, iters, |_| {
                nsa_selection_attention_into(
                    gpu,
                    &x,
                    None,
                    None,
                    BS as i64,
                    None,
                    &mut o,
                    Some(&mut lse),
                )
            })?;
            let bytes = q.num_bytes() + 2 * k.num_bytes() + idx.num_bytes() + o.num_bytes();
            (ms, per_key * sel_keys(t), bytes)
        }
        AttnOp::Fwd(w) => {
            let g: Vec<DeviceTensor> = (0..3)
                .map(|i| random_tensor(gpu, &[1, t, HQ], bf, 0.0, 1.0, 20 + i))
                .collect::<GpuResult<_>>()?;
            let x = FwdInputs {
                q: &q,
                k: &k,
                v: &v,
                g_cmp: Some(&g[0]),
                g_slc: Some(&g[1]),
                g_swa: Some(&g[2]),
                block_indices: None,
            };
            let counts = Some(BlockCounts::Int(S as i64));
            let ms = time_ms(gpu, iters, |_| {
                nsa_fwd(gpu, &x, counts, None, BS as i64, w, None).map(|_| ())
            })?;
            let win: f64 = (0..t).map(|p| (p + 1).min(w as usize) as f64).sum();
            let score = (2 * HQ * D) as f64 * cmp_keys(t);
            let flops = per_key * (cmp_keys(t) + sel_keys(t) + win) + score;
            let bytes = q.num_bytes() + 2 * k.num_bytes() + 3 * g[0].num_bytes() + o.num_bytes();
            (ms, flops, bytes)
        }
    };
    let gbps = bytes as f64 / (ms * 1e-3) / 1e9;
    let tflops = flops / (ms * 1e-3) / 1e12;
    println!(
        "{:<52} {:>10.4} {:>10.0} {:>8.1}% {:>8.1} TFLOP/s",
        case.name,
        ms,
        gbps,
        100.0 * gbps / ceiling,
        tflops
    );
    Ok(json!({
        "name": case.name, "shape": [1, t, HQ, D], "in_dtype": "bfloat16", "out_dtype": "bfloat16",
        "bytes": bytes, "median_ms": ms, "gbps": gbps, "share": gbps / ceiling, "sets": 1,
        "flops": flops, "tflops": tflops, "h": H, "block_size": BS, "s": S,
        "window": match case.op { AttnOp::Fwd(w) => w, _ => 0 },
    }))
}
