//! The read ceiling (issue 26, `conformance/spec/anchors.md` "Decode: the read ceiling"): a
//! kernel that reads a buffer once and reduces it to one 32-bit word, `out ^= XOR of every
//! 32-bit word of src`, so that a benchmark can time the device's pure read stream beside the
//! copy ceiling (a decode kernel only reads).

use crate::device::Gpu;
use crate::error::GpuResult;
use crate::kernels::Module;
use crate::tensor::DeviceTensor;
use attn_reference::{Dtype, Error};
use cudarc::driver::DeviceRepr;

/// Mirror of `ReadArgs` (read_stream.cu).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct ReadArgs {
    p: u64,
    n: u64,
    out: u64,
}
// SAFETY: plain `#[repr(C)]` data matching the kernel's struct.
unsafe impl DeviceRepr for ReadArgs {}

/// The 16-byte loads each thread keeps in flight, one kernel each.
pub const READ_UNROLLS: [usize; 3] = [4, 8, 16];

/// Reads every byte of `src` once (`src.num_bytes()` a multiple of 16) with `unroll` 16-byte
/// loads in flight per thread (one of [`READ_UNROLLS`]) on `blocks_per_sm` blocks of 256 threads
/// per multiprocessor (1 ..= 8), and XORs its 32-bit words into `out` (int32 `[1]`).
pub fn read_stream(
    gpu: &Gpu,
    src: &DeviceTensor,
    unroll: usize,
    blocks_per_sm: usize,
    out: &mut DeviceTensor,
) -> GpuResult<()> {
    let bytes = src.num_bytes();
    if bytes % 16 != 0 {
        return Err(Error::shape("src", "a multiple of 16 bytes", bytes).into());
    }
    if !READ_UNROLLS.contains(&unroll) {
        return Err(Error::param("unroll", "4, 8 or 16", unroll).into());
    }
    if !(1..=8).contains(&blocks_per_sm) {
        return Err(Error::param("blocks_per_sm", "1 ..= 8", blocks_per_sm).into());
    }
    if out.dtype() != Dtype::I32 || out.shape() != [1] {
        return Err(Error::shape("out", "int32 [1]", out.shape()).into());
    }
    if bytes == 0 {
        return Ok(());
    }
    let args = ReadArgs {
        p: src.ptr(gpu),
        n: (bytes / 16) as u64,
        out: out.ptr_mut(gpu),
    };
    let grid = (gpu.sm_count() * blocks_per_sm) as u32;
    gpu.launch(
        Module::ReadStream,
        &format!("read_stream_u{unroll}"),
        (grid, 1),
        256,
        &args,
    )
}
