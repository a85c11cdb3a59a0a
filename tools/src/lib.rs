//! `attn-tools`: benchmark helpers for the `attn-gpu` kernels: seeded device inputs, CUDA-event
//! timing, and the decode benchmark ([`decode_bench`]).

pub mod decode_bench;

use attn_gpu::{DeviceTensor, Gpu, GpuResult};
use attn_reference::Dtype;
use cudarc::driver::sys::CUevent_flags;
use half::bf16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A device tensor of `shape` in `dtype` filled with a tiled block of 2^20 random values in
/// `[lo, hi)` (real data, never zeros): the block is uploaded once and copied on the device.
pub fn random_tensor(
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

/// Median of per-launch event times (ms) of `iters` launches queued back to back.
pub fn time_ms(
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
