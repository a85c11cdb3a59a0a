//! Errors of the GPU crate: refused input (the reference's typed [`attn_reference::Error`],
//! raised before any launch), an absent CUDA stack (or NCCL), driver, NVRTC and NCCL failures
//! with their context.

use cudarc::driver::DriverError;

/// Why a GPU call failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GpuError {
    /// The input was refused before any work (names the argument).
    #[error(transparent)]
    Input(#[from] attn_reference::Error),
    /// No usable GPU: the driver library, NVRTC, or a device is missing.
    #[error("no GPU available: {0}")]
    Unavailable(String),
    /// NVRTC refused a kernel source; `log` is the compiler's log.
    #[error("NVRTC failed to compile module `{module}` ({options}):\n{log}")]
    Compile {
        module: String,
        options: String,
        log: String,
    },
    /// A driver call failed (`context` says which: allocation, copy, launch of a kernel, ...).
    #[error("CUDA driver error during {context}: {source}")]
    Driver {
        context: String,
        #[source]
        source: DriverError,
    },
    /// A context-parallel collective (NCCL) failed or timed out, or a rank failed before it
    /// (`context` names the call and rank). After a timeout the group is aborted.
    #[error("collective error during {context}: {detail}")]
    Collective { context: String, detail: String },
    /// A host-side tensor conversion was asked for the wrong element type.
    #[error("tensor `{arg}` holds {got}, not {expected}")]
    HostDtype {
        arg: String,
        expected: &'static str,
        got: &'static str,
    },
}

impl GpuError {
    /// Wraps a driver error with what was being done (for callers using cudarc directly).
    pub fn driver_ctx(context: &str) -> impl FnOnce(DriverError) -> GpuError + '_ {
        move |source| GpuError::Driver {
            context: context.to_string(),
            source,
        }
    }

    pub(crate) fn driver(context: impl Into<String>) -> impl FnOnce(DriverError) -> GpuError {
        let context = context.into();
        move |source| GpuError::Driver { context, source }
    }
}

pub type GpuResult<T> = std::result::Result<T, GpuError>;
