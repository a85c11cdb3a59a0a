//! `bench_gpu`: times the attn-gpu scan and gate kernels on the spec's benchmark shapes against
//! the device-to-device copy ceiling measured in the same run.
//!
//! Method: CUDA events around each launch, launches queued back to back (no host sync in the
//! timed region), warm-up first, median of `--iters` (default 30, at least 20) repeats. Inputs
//! are rotated over enough copies to exceed 3x the L2 cache (at least 2 when memory allows).
//! Bytes moved = every input element read once + every output element written once. The copy
//! ceiling is a `cuMemcpyDtoDAsync` of 1 GiB (2 GiB moved).
//!
//! The NSA cases (`nsa_compress_kv`, `nsa_gate_combine`, `nsa_select_blocks`) are in [`nsa`],
//! the NSA attention cases (`nsa_compression_attention`, `nsa_selection_attention`, `nsa_fwd`)
//! in [`nsa_attn`]; the
//! decode cases (`decode_attention` plain and as CUDA-graph replays, bytes = the valid K and V)
//! in [`decode`].
//! The NSA cases (`nsa_compress_kv`, `nsa_gate_combine`, `nsa_select_blocks`) are in [`nsa`],
//! the delta-rule cases (`chunk_gated_delta_rule_fwd_h`, `fwd_h_pre_scan`) in [`delta`], the
//! intra-card split (`chunk_gated_delta_rule_fwd_h_split`: serial, auto, forced split) in
//! [`split`], the whole forwards (`gdn_fwd`, `kda_fwd`; and `intra_kda_pipe_h32_8x8192{,_strong,_long,_trained}`, the
//! KDA intra stage on `kda_intra_pipe` beside today's kernel) in [`forward`], the context-parallel
//! forwards over 1, 2, 4 GPUs (`cp_gdn_*`, `cp_kda_*`) in [`cp`].
//!
//! Usage: `bench_gpu [--json PATH] [--filter SUBSTR[,SUBSTR...]] [--iters N]
//! [--decode-timeline DIR]` (cases whose name contains any of the substrings; the `cp_*` rows,
//! minutes of work on million-token inputs, run only when `--filter` names them, e.g. `--filter
//! cp_`). Prints a table; `--json` writes `{device, ceiling_gbps, cases: [{name, shape, bytes,
//! median_ms, gbps, share}]}`. `--decode-timeline DIR` (a diagnostic: the decode module built
//! with `ATTN_NVRTC_OPTS=-DDECODE_TIMELINE`, whose times are then not benchmarks) also records
//! one launch of each plain decode row block by block ([`timeline`]).

mod cp;
mod decode;
mod delta;
mod forward;
mod nsa;
mod nsa_attn;
mod split;
mod timeline;

use attn_gpu::{
    chunk_global_cumsum_into, chunk_local_cumsum_into, cumsum_into, kda_gate_chunk_cumsum_into,
    kda_gate_into, read_stream, DeviceTensor, GateInputs, Gpu, GpuResult, READ_UNROLLS,
};
use attn_reference::gate::KdaGateChunkCumsumParams;
use attn_reference::{Dtype, RCP_LN2};
use cudarc::driver::sys::CUevent_flags;
use half::bf16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

/// One benchmark shape: its name (shared with `bench_anchors.py`), the input shape and dtype,
/// the output dtype, and the op.
struct Case {
    name: &'static str,
    shape: Vec<usize>,
    din: Dtype,
    dout: Dtype,
    op: Op,
}

#[derive(Clone, Copy)]
enum Op {
    Cumsum { dim: i64 },
    ChunkLocal { chunk: i64 },
    ChunkGlobal,
    KdaGate,
    KdaGateChunkCumsum { chunk: i64 },
}

fn cases() -> Vec<Case> {
    let c = |name, shape: &[usize], din, dout, op| Case {
        name,
        shape: shape.to_vec(),
        din,
        dout,
        op,
    };
    use Dtype::{BF16, F32};
    vec![
        c(
            "cumsum_seed_dim2_f32",
            &[16, 16, 1024, 64, 64],
            F32,
            F32,
            Op::Cumsum { dim: 2 },
        ),
        c(
            "cumsum_seed_dim2_bf16_f32",
            &[16, 16, 1024, 64, 64],
            BF16,
            F32,
            Op::Cumsum { dim: 2 },
        ),
        c(
            "cumsum_rows_last_f32",
            &[1048576, 1024],
            F32,
            F32,
            Op::Cumsum { dim: -1 },
        ),
        c(
            "cumsum_rows_last_bf16_f32",
            &[1048576, 1024],
            BF16,
            F32,
            Op::Cumsum { dim: -1 },
        ),
        c(
            "cumsum_dim0_f32",
            &[1024, 1048576],
            F32,
            F32,
            Op::Cumsum { dim: 0 },
        ),
        c(
            "cumsum_one_lane_f32",
            &[1 << 28],
            F32,
            F32,
            Op::Cumsum { dim: 0 },
        ),
        c(
            "chunk_local_cumsum_bf16_f32",
            &[1, 32768, 32, 128],
            BF16,
            F32,
            Op::ChunkLocal { chunk: 64 },
        ),
        c(
            "chunk_global_cumsum_bf16_f32",
            &[1, 32768, 32, 128],
            BF16,
            F32,
            Op::ChunkGlobal,
        ),
        c(
            "kda_gate_bf16_f32",
            &[1, 32768, 32, 128],
            BF16,
            F32,
            Op::KdaGate,
        ),
        c(
            "kda_gate_chunk_cumsum_1x32768x32x128",
            &[1, 32768, 32, 128],
            BF16,
            F32,
            Op::KdaGateChunkCumsum { chunk: 64 },
        ),
        c(
            "kda_gate_chunk_cumsum_8x4096x16x128",
            &[8, 4096, 16, 128],
            BF16,
            F32,
            Op::KdaGateChunkCumsum { chunk: 64 },
        ),
        c(
            "kda_gate_chunk_cumsum_1x131072x8x128",
            &[1, 131072, 8, 128],
            BF16,
            F32,
            Op::KdaGateChunkCumsum { chunk: 64 },
        ),
    ]
}

/// A device tensor of `shape` in `dtype` filled with a tiled block of 2^20 random values in
/// `[lo, hi)` (real data, never zeros): the block is uploaded once and copied on the device.
fn random_tensor(
    gpu: &Gpu,
    shape: &[usize],
    dtype: Dtype,
    lo: f32,
    hi: f32,
    seed: u64,
) -> GpuResult<DeviceTensor> {
    let n: usize = shape.iter().product();
    let mut rng = StdRng::seed_from_u64(seed);
    let block: Vec<f32> = (0..(1usize << 20).min(n).max(1))
        .map(|_| rng.random_range(lo..hi))
        .collect();
    let blk = match dtype {
        Dtype::F32 => DeviceTensor::from_slice(gpu, &block)?,
        Dtype::BF16 => {
            let b: Vec<bf16> = block.iter().map(|&v| bf16::from_f32(v)).collect();
            DeviceTensor::from_slice(gpu, &b)?
        }
        d => panic!("bench inputs are f32 or bf16, not {d}"),
    };
    let mut t = DeviceTensor::alloc(gpu, shape, dtype)?;
    let (bb, total) = (blk.num_bytes(), t.num_bytes());
    let mut off = 0;
    while off < total {
        let len = bb.min(total - off);
        let src = blk.buffer().slice(0..len);
        let mut dst = t.buffer_mut().slice_mut(off..off + len);
        gpu.stream()
            .memcpy_dtod(&src, &mut dst)
            .map_err(attn_gpu::GpuError::driver_ctx("tiling the input"))?;
        off += len;
    }
    Ok(t)
}

/// The sequences' `cu_seqlens`.
fn cu_seqlens(seqs: &[usize]) -> Vec<i64> {
    let mut cu = vec![0i64];
    for s in seqs {
        cu.push(cu.last().copied().unwrap_or(0) + *s as i64);
    }
    cu
}

/// Median of per-launch event times (ms) of `iters` launches queued back to back.
fn time_ms(
    gpu: &Gpu,
    iters: usize,
    mut launch: impl FnMut(usize) -> GpuResult<()>,
) -> GpuResult<f64> {
    let ctx = gpu.context();
    let ev = |_| ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT));
    for i in 0..5 {
        launch(i)?;
    }
    let events = (0..=iters)
        .map(ev)
        .collect::<Result<Vec<_>, _>>()
        .map_err(attn_gpu::GpuError::driver_ctx("event creation"))?;
    events[0]
        .record(gpu.stream())
        .map_err(attn_gpu::GpuError::driver_ctx("event record"))?;
    for (i, e) in events[1..].iter().enumerate() {
        launch(i)?;
        e.record(gpu.stream())
            .map_err(attn_gpu::GpuError::driver_ctx("event record"))?;
    }
    gpu.synchronize()?;
    let mut t: Vec<f64> = events
        .windows(2)
        .map(|w| w[0].elapsed_ms(&w[1]).map(f64::from))
        .collect::<Result<_, _>>()
        .map_err(attn_gpu::GpuError::driver_ctx("event timing"))?;
    t.sort_by(|a, b| a.partial_cmp(b).unwrap());
    Ok(t[t.len() / 2])
}

/// The read ceiling: 2 GiB read once and reduced to one word ([`read_stream()`]), the best median
/// over 16-byte loads in flight per thread ([`READ_UNROLLS`]) and blocks per multiprocessor
/// (2, 4, 8): `(GB/s, ms, the best configuration)`.
fn read_ceiling(gpu: &Gpu, iters: usize) -> GpuResult<(f64, f64, String)> {
    let n = 1usize << 31;
    let src = DeviceTensor::alloc(gpu, &[n / 4], Dtype::I32)?;
    let mut word = DeviceTensor::alloc(gpu, &[1], Dtype::I32)?;
    let mut best = (f64::INFINITY, String::new());
    for unroll in READ_UNROLLS {
        for bps in [2, 4, 8] {
            let ms = time_ms(gpu, iters, |_| {
                read_stream(gpu, &src, unroll, bps, &mut word)
            })?;
            if ms < best.0 {
                best = (
                    ms,
                    format!("{unroll} loads of 16 B per thread, {bps} blocks of 256 per SM"),
                );
            }
        }
    }
    Ok((n as f64 / (best.0 * 1e-3) / 1e9, best.0, best.1))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut json_path = None;
    let mut filter = String::new();
    let mut iters = 30usize;
    let mut timeline_dir: Option<std::path::PathBuf> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--json" => json_path = args.next(),
            "--filter" => filter = args.next().unwrap_or_default(),
            "--iters" => iters = args.next().and_then(|v| v.parse().ok()).unwrap_or(30).max(20),
            "--decode-timeline" => timeline_dir = args.next().map(Into::into),
            other => return Err(format!("unknown argument {other}; usage: bench_gpu [--json PATH] [--filter SUBSTR] [--iters N] [--decode-timeline DIR]").into()),
        }
    }
    let gpu = Gpu::shared()?;
    gpu.set_checked(false);
    let l2 = gpu
        .context()
        .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?
        as usize;
    let (free, _) = gpu.context().mem_get_info()?;

    // the copy ceiling
    let n = 1usize << 30;
    let src = gpu.stream().alloc_zeros::<u8>(n)?;
    let mut dst = gpu.stream().alloc_zeros::<u8>(n)?;
    let copy_ms = time_ms(gpu, iters, |_| {
        gpu.stream()
            .memcpy_dtod(&src, &mut dst)
            .map_err(attn_gpu::GpuError::driver_ctx("copy"))
    })?;
    drop((src, dst));
    let ceiling = 2.0 * n as f64 / (copy_ms * 1e-3) / 1e9;
    let (read_ceiling, read_ms, read_cfg) = read_ceiling(gpu, iters)?;
    println!(
        "device: {} ({} SMs, L2 {} MB), copy ceiling {:.0} GB/s ({:.3} ms for 2 GiB moved)",
        gpu.name(),
        gpu.sm_count(),
        l2 >> 20,
        ceiling,
        copy_ms
    );
    println!("read ceiling {read_ceiling:.0} GB/s ({read_ms:.3} ms for 2 GiB read; {read_cfg})");
    println!(
        "{:<40} {:>10} {:>10} {:>9} {:>8}",
        "case", "ms", "GB/s", "ceiling", "sets"
    );

    let mut rows = Vec::new();
    let wanted = |name: &str| filter.split(',').any(|f| name.contains(f));
    for case in cases().into_iter().filter(|c| wanted(c.name)) {
        let numel: usize = case.shape.iter().product();
        let in_bytes = numel * case.din.size_bytes();
        let bytes = in_bytes + numel * case.dout.size_bytes();
        let mut sets = (3 * l2).div_ceil(in_bytes).max(2);
        while sets > 1 && sets * in_bytes + bytes > free * 3 / 4 {
            sets -= 1;
        }
        let inputs = (0..sets)
            .map(|i| match case.op {
                Op::Cumsum { .. } | Op::ChunkLocal { .. } => {
                    random_tensor(gpu, &case.shape, case.din, -1.0, 1.0, i as u64 + 1)
                }
                _ => random_tensor(gpu, &case.shape, case.din, -6.0, 6.0, i as u64 + 1),
            })
            .collect::<GpuResult<Vec<_>>>()?;
        let hv = case.shape.get(2).copied().unwrap_or(1);
        let k = case.shape.get(3).copied().unwrap_or(1);
        let a_log = random_tensor(gpu, &[hv], Dtype::F32, -2.0, 1.0, 99)?;
        let dt_bias = random_tensor(gpu, &[hv * k], Dtype::F32, -1.0, 1.0, 98)?;
        let side = GateInputs {
            a_log: Some(&a_log),
            dt_bias: Some(&dt_bias),
        };
        let mut out = DeviceTensor::alloc(gpu, &case.shape, case.dout)?;
        let ms = time_ms(gpu, iters, |i| {
            let x = &inputs[i % sets];
            match case.op {
                Op::Cumsum { dim } => cumsum_into(gpu, x, dim, false, &mut out),
                Op::ChunkLocal { chunk } => {
                    chunk_local_cumsum_into(gpu, x, None, chunk, false, None, &mut out)
                }
                Op::ChunkGlobal => chunk_global_cumsum_into(gpu, x, None, false, None, &mut out),
                Op::KdaGate => kda_gate_into(gpu, x, &side, None, &mut out),
                Op::KdaGateChunkCumsum { chunk } => {
                    let p = KdaGateChunkCumsumParams {
                        chunk_size: chunk,
                        scale: Some(RCP_LN2),
                        lower_bound: None,
                        reverse: false,
                    };
                    kda_gate_chunk_cumsum_into(gpu, x, &side, None, &p, &mut out)
                }
            }
        })?;
        let gbps = bytes as f64 / (ms * 1e-3) / 1e9;
        println!(
            "{:<40} {:>10.4} {:>10.0} {:>8.1}% {:>8}",
            case.name,
            ms,
            gbps,
            100.0 * gbps / ceiling,
            sets
        );
        rows.push(json!({
            "name": case.name, "shape": case.shape, "in_dtype": case.din.name(), "out_dtype": case.dout.name(),
            "bytes": bytes, "median_ms": ms, "gbps": gbps, "share": gbps / ceiling, "sets": sets,
        }));
    }
    for case in nsa::cases().into_iter().filter(|c| wanted(c.name)) {
        rows.push(nsa::run(gpu, &case, iters, ceiling)?);
    }
    for case in nsa_attn::cases().into_iter().filter(|c| wanted(&c.name)) {
        rows.push(nsa_attn::run(gpu, &case, iters, ceiling)?);
    }
    // decode: on a forked handle (graph capture needs a stream of its own)
    let dgpu = gpu.fork()?;
    dgpu.set_checked(false);
    for case in decode::cases().into_iter().filter(|c| wanted(&c.name)) {
        let (ms, sets, spans) = decode::run(&dgpu, &case, iters, timeline_dir.is_some())?;
        if let (Some(dir), Some(spans)) = (&timeline_dir, spans) {
            print!(
                "{}",
                timeline::report(dir, &case.name, &spans, dgpu.sm_count())?
            );
        }
        let bytes = case.bytes();
        let gbps = bytes as f64 / (ms * 1e-3) / 1e9;
        println!(
            "{:<40} {:>10.4} {:>10.0} {:>8.1}% {:>8} {:>6.1}% of read",
            case.name,
            ms,
            gbps,
            100.0 * gbps / ceiling,
            sets,
            100.0 * gbps / read_ceiling,
        );
        rows.push(json!({
            "name": case.name, "shape": [case.b, case.h, case.h_kv, case.d, case.s],
            "in_dtype": "bfloat16", "out_dtype": "bfloat16", "mode": format!("{:?}", case.mode),
            "lens": case.lens, "layout": format!("{:?}", case.layout).to_lowercase(),
            "bytes": bytes, "median_ms": ms, "gbps": gbps, "share": gbps / ceiling,
            "read_share": gbps / read_ceiling, "sets": sets,
        }));
    }
    dgpu.synchronize()?;
    for case in delta::cases().into_iter().filter(|c| wanted(c.name)) {
        rows.push(delta::run(gpu, &case, iters, l2, free, ceiling)?);
    }
    for case in split::cases().into_iter().filter(|c| wanted(&c.name)) {
        rows.push(split::run(gpu, &case, iters, l2, free)?);
    }
    for case in forward::cases().into_iter().filter(|c| wanted(&c.name)) {
        rows.push(forward::run(gpu, &case, iters, l2, free, ceiling)?);
    }
    for (name, regime) in forward::intra_pipe_rows() {
        if wanted(&name) {
            rows.push(forward::run_intra_pipe(
                gpu, &name, regime, iters, l2, ceiling,
            )?);
        }
    }
    rows.extend(cp::run_all(iters, ceiling, |name| {
        !filter.is_empty() && wanted(name)
    })?);
    gpu.set_checked(true);
    gpu.synchronize()?;
    if let Some(p) = json_path {
        let doc = json!({
            "device": gpu.name(), "sm_count": gpu.sm_count(), "l2_bytes": l2,
            "ceiling_gbps": ceiling, "copy_ms": copy_ms, "read_ceiling_gbps": read_ceiling,
            "read_ms": read_ms, "read_config": read_cfg, "iters": iters, "cases": rows,
        });
        std::fs::write(&p, serde_json::to_string_pretty(&doc)?)?;
    }
    Ok(())
}
