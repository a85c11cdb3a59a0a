//! CUDA graph capture: record a sequence of this crate's launches once, replay it many times.
//!
//! The pattern for decoding (see `decode`): allocate the caches, the row tensors, the inputs
//! and outputs and the workspace once; run the step once outside capture (compiles the kernels
//! and checks the shapes); capture the step on a [`Gpu::fork`]ed handle (the legacy default
//! stream cannot be captured); then for each step write the new token and the lengths into the
//! same device buffers (on the same stream) and [`CapturedGraph::replay`]. Nothing in a step
//! may allocate or synchronise, so only ops whose launches depend on shapes alone (the decode
//! ops) belong in a captured step.

use crate::device::Gpu;
use crate::error::{GpuError, GpuResult};
use attn_reference::Error;
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::CudaGraph;

/// An instantiated graph, replayed on the stream it was captured on.
pub struct CapturedGraph {
    graph: CudaGraph,
}

/// Captures the launches `record` queues on `gpu` (a forked handle) into a graph. The handle
/// is unchecked while recording (no synchronisation), then restored. Capture is thread-local:
/// other threads' work is unaffected.
pub fn capture(gpu: &Gpu, record: impl FnOnce(&Gpu) -> GpuResult<()>) -> GpuResult<CapturedGraph> {
    if gpu.stream().cu_stream().is_null() {
        return Err(Error::param(
            "gpu",
            "a handle with its own stream (Gpu::fork)",
            "the legacy default stream",
        )
        .into());
    }
    gpu.synchronize()?;
    let checked = gpu.is_checked();
    gpu.set_checked(false);
    let begun = gpu
        .stream()
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .map_err(GpuError::driver("begin of stream capture"));
    let recorded = begun.and_then(|()| record(gpu));
    // end the capture whatever happened, so the stream is usable again
    let ended = gpu.stream().end_capture(CUgraphInstantiate_flags(0));
    gpu.set_checked(checked);
    recorded?;
    let graph = ended
        .map_err(GpuError::driver("end of stream capture"))?
        .ok_or_else(|| Error::param("record", "at least one launch", "an empty capture"))?;
    Ok(CapturedGraph { graph })
}

impl CapturedGraph {
    /// Queues one replay on the capturing stream (no synchronisation: call
    /// [`Gpu::synchronize`] on the capturing handle, or read results on its stream).
    pub fn replay(&self) -> GpuResult<()> {
        self.graph
            .launch()
            .map_err(GpuError::driver("graph replay"))
    }
}
