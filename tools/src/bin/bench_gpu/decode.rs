//! The decode benchmark of `bench_gpu`: `decode_attention` on the anchors' decode table
//! (bf16, `D = 64`, `S = 4096`, `H = H_kv`, `L_q = 1`, layout bhsd) and the two serving shapes
//! of issue 12 (GQA 32/8, `D = 128`, bshd), as plain launches; small shapes also as CUDA-graph
//! replays (a graph of [`GRAPH_STEPS`] steps, replayed; per-step time), of the attention alone
//! and of the fused step (update + attention).
//!
//! Bytes = the valid K and V only (`Σ_b n_b · H_kv · D · 2 bytes · 2`). Plain launches rotate
//! over enough copies of the caches to exceed 3x the L2 (memory allowing); graph replays read
//! one cache (a captured graph has fixed addresses), so small caches may stay in L2 there.

use super::{random_tensor, time_ms};
use attn_gpu::decode::check::check_attention_shapes;
use attn_gpu::decode::timeline::{self, BlockSpan};
use attn_gpu::{
    capture, decode_attention_into, decode_step, CacheLayout, CacheRows, DecodeOutputs,
    DecodeParams, DecodeWorkspace, DeviceTensor, Gpu, GpuError, GpuResult, KvCache, NewTokens,
};
use attn_reference::Dtype;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Steps captured in one graph for the per-step replay time.
pub const GRAPH_STEPS: usize = 32;

/// How a case is launched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// One `decode_attention` launch per step.
    Launch,
    /// Graph replay of `decode_attention` steps.
    Graph,
    /// Graph replay of fused steps (one new token appended, then attention).
    StepGraph,
}

/// One decode benchmark shape (`L_q = 1`, bf16).
#[derive(Debug, Clone)]
pub struct DecodeCase {
    pub name: String,
    pub b: usize,
    pub h: usize,
    pub h_kv: usize,
    pub d: usize,
    pub s: usize,
    pub layout: CacheLayout,
    /// Valid length of each row.
    pub lens: Vec<usize>,
    pub mode: Mode,
}

impl DecodeCase {
    /// Bytes of the valid K and V.
    pub fn bytes(&self) -> usize {
        self.lens.iter().sum::<usize>() * self.h_kv * self.d * 2 * 2
    }
    fn cache_shape(&self) -> Vec<usize> {
        match self.layout {
            CacheLayout::Bshd => vec![self.b, self.s, self.h_kv, self.d],
            CacheLayout::Bhsd => vec![self.b, self.h_kv, self.s, self.d],
        }
    }
}

/// The anchors' table, the serving shapes, and the graph-replay rows.
pub fn cases() -> Vec<DecodeCase> {
    let mut v = Vec::new();
    let anchor = |b: usize, h: usize, l: usize, mode: Mode| DecodeCase {
        name: format!(
            "decode_{}b{b}_h{h}_l{l}",
            match mode {
                Mode::Launch => "",
                Mode::Graph => "graph_",
                Mode::StepGraph => "step_graph_",
            }
        ),
        b,
        h,
        h_kv: h,
        d: 64,
        s: 4096,
        layout: CacheLayout::Bhsd,
        lens: vec![l; b],
        mode,
    };
    for (b, h, l) in [
        (1, 8, 128),
        (1, 8, 1024),
        (1, 8, 4000),
        (16, 8, 128),
        (16, 8, 1024),
        (16, 8, 4000),
        (1, 32, 128),
        (1, 32, 4000),
    ] {
        v.push(anchor(b, h, l, Mode::Launch));
    }
    let mut rng = StdRng::seed_from_u64(8192);
    v.push(DecodeCase {
        name: "decode_serving_b32_h32_kv8_d128_s8192_mixed".into(),
        b: 32,
        h: 32,
        h_kv: 8,
        d: 128,
        s: 8192,
        layout: CacheLayout::Bshd,
        lens: (0..32).map(|_| rng.random_range(1..=8192)).collect(),
        mode: Mode::Launch,
    });
    v.push(DecodeCase {
        name: "decode_serving_b64_h32_kv8_d128_s32768_full".into(),
        b: 64,
        h: 32,
        h_kv: 8,
        d: 128,
        s: 32768,
        layout: CacheLayout::Bshd,
        lens: vec![32768; 64],
        mode: Mode::Launch,
    });
    for (b, h, l) in [(1, 8, 128), (1, 8, 4000), (16, 8, 1024), (1, 32, 128)] {
        v.push(anchor(b, h, l, Mode::Graph));
    }
    v.push(anchor(1, 8, 128, Mode::StepGraph));
    v
}

/// Median time of one step (ms), the number of cache copies rotated over, and with `timeline`
/// (plain launches only; the kernels built with `-DDECODE_TIMELINE`) the block timeline of one
/// more launch after the timed ones.
pub fn run(
    gpu: &Gpu,
    case: &DecodeCase,
    iters: usize,
    timeline: bool,
) -> GpuResult<(f64, usize, Option<Vec<BlockSpan>>)> {
    let cache_shape = case.cache_shape();
    let q_shape = [case.b, 1, case.h, case.d];
    let shape = check_attention_shapes(
        (&q_shape, Dtype::BF16),
        (&cache_shape, Dtype::BF16),
        (&cache_shape, Dtype::BF16),
        case.layout,
    )?;
    let cache_bytes = cache_shape.iter().product::<usize>() * 2 * 2;
    let l2 = gpu
        .context()
        .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)
        .map_err(GpuError::driver_ctx("L2 size"))? as usize;
    let (free, _) = gpu
        .context()
        .mem_get_info()
        .map_err(GpuError::driver_ctx("memory info"))?;
    let mut sets = match case.mode {
        Mode::Launch => (3 * l2).div_ceil(case.bytes().max(1)).clamp(2, 256),
        _ => 1,
    };
    while sets > 1 && sets * cache_bytes > free * 3 / 4 {
        sets -= 1;
    }
    let seed = |i: usize, k: u64| (i as u64) * 4 + k;
    let caches = (0..sets)
        .map(|i| {
            Ok(KvCache {
                k: random_tensor(gpu, &cache_shape, Dtype::BF16, -1.0, 1.0, seed(i, 1))?,
                v: random_tensor(gpu, &cache_shape, Dtype::BF16, -1.0, 1.0, seed(i, 2))?,
                layout: case.layout,
            })
        })
        .collect::<GpuResult<Vec<_>>>()?;
    let qs = (0..sets)
        .map(|i| random_tensor(gpu, &q_shape, Dtype::BF16, -1.0, 1.0, seed(i, 3)))
        .collect::<GpuResult<Vec<_>>>()?;
    let lens: Vec<i32> = case.lens.iter().map(|&n| n as i32).collect();
    let seqlens = DeviceTensor::from_slice(gpu, &lens)?;
    let rows = CacheRows {
        cache_seqlens: &seqlens,
        cache_batch_idx: None,
    };
    let params = DecodeParams::default();
    let mut ws = DecodeWorkspace::new(gpu, shape)?;
    let mut out = DecodeOutputs::alloc(gpu, &shape)?;
    match case.mode {
        Mode::Launch => {
            let ms = time_ms(gpu, iters, |i| {
                let k = i % sets;
                decode_attention_into(gpu, &qs[k], &caches[k], rows, &params, &mut ws, &mut out)
            })?;
            let spans = if timeline {
                timeline::reset(gpu)?;
                decode_attention_into(gpu, &qs[0], &caches[0], rows, &params, &mut ws, &mut out)?;
                Some(timeline::read(gpu)?)
            } else {
                None
            };
            Ok((ms, sets, spans))
        }
        Mode::Graph | Mode::StepGraph => {
            // the fused step appends one token at n - 1 (the lengths stay, so every replay
            // rewrites the same position and attends over n keys)
            let before: Vec<i32> = lens.iter().map(|&n| (n - 1).max(0)).collect();
            let before = DeviceTensor::from_slice(gpu, &before)?;
            let tok = [case.b, 1, case.h_kv, case.d];
            let nk = random_tensor(gpu, &tok, Dtype::BF16, -1.0, 1.0, 7)?;
            let nv = random_tensor(gpu, &tok, Dtype::BF16, -1.0, 1.0, 8)?;
            let mut cache = caches.into_iter().next().expect("one set");
            let mut step = |gpu: &Gpu| -> GpuResult<()> {
                if case.mode == Mode::Graph {
                    decode_attention_into(gpu, &qs[0], &cache, rows, &params, &mut ws, &mut out)
                } else {
                    let new = NewTokens { k: &nk, v: &nv };
                    let rows = CacheRows {
                        cache_seqlens: &before,
                        cache_batch_idx: None,
                    };
                    decode_step(
                        gpu, &qs[0], new, &mut cache, rows, &params, &mut ws, &mut out,
                    )
                }
            };
            step(gpu)?; // compiled and checked outside the capture
            gpu.synchronize()?;
            let graph = capture(gpu, |gpu| (0..GRAPH_STEPS).try_for_each(|_| step(gpu)))?;
            let ms = time_ms(gpu, iters, |_| graph.replay())?;
            Ok((ms / GRAPH_STEPS as f64, 1, None))
        }
    }
}
