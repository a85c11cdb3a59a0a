//! The GPU handle: driver context, its stream (and a second one for work beside it), the NVRTC
//! module cache, and checked launches.
//!
//! Opening never panics: the driver and NVRTC libraries are probed first (cudarc would panic on
//! first use otherwise), and any failure becomes [`GpuError::Unavailable`].

use crate::error::{GpuError, GpuResult};
use crate::kernels::Module;
use crate::knobs;
use cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DeviceRepr, LaunchConfig,
    PushKernelArg,
};
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, OnceLock};

/// An open GPU: one context and its stream (a second stream on first use of `beside`);
/// kernels are compiled on first use.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    name: String,
    arch: (i32, i32),
    sm_count: usize,
    modules: Arc<Mutex<HashMap<Module, Arc<CudaModule>>>>,
    functions: Arc<Mutex<HashMap<String, CudaFunction>>>,
    scratch: Mutex<Scratch>,
    checked: std::sync::atomic::AtomicBool,
    /// A second stream of the same GPU for work that runs beside this stream's (made on first
    /// use; see [`Gpu::beside`]).
    side: OnceLock<Box<Gpu>>,
}

/// Zero-initialised device scratch reused by the look-back scan; `epoch` tags the flags of one
/// launch so that stale flags from earlier launches never match.
pub(crate) struct Scratch {
    pub buf: Option<CudaSlice<u8>>,
    pub epoch: u32,
}

static SHARED: OnceLock<Result<Gpu, String>> = OnceLock::new();

impl Gpu {
    /// Opens device `ordinal`. Errors (never panics) when the driver, NVRTC or the device is
    /// missing.
    pub fn open(ordinal: usize) -> GpuResult<Gpu> {
        // SAFETY: these only try to dlopen the libraries.
        if !unsafe { sys::is_culib_present() } {
            return Err(GpuError::Unavailable(
                "the CUDA driver library (libcuda) was not found".into(),
            ));
        }
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(GpuError::Unavailable(
                "the NVRTC library (libnvrtc) was not found".into(),
            ));
        }
        // cudarc panics on missing symbols of an old library: turn that into an error too.
        std::panic::catch_unwind(AssertUnwindSafe(|| Self::open_checked(ordinal))).unwrap_or_else(
            |p| {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "unknown panic".into());
                Err(GpuError::Unavailable(format!(
                    "CUDA initialisation failed: {msg}"
                )))
            },
        )
    }

    fn open_checked(ordinal: usize) -> GpuResult<Gpu> {
        let count = CudaContext::device_count()
            .map_err(|e| GpuError::Unavailable(format!("cuInit/cuDeviceGetCount failed: {e}")))?;
        if count <= 0 || ordinal >= count as usize {
            return Err(GpuError::Unavailable(format!(
                "device {ordinal} requested, {count} device(s) present"
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(GpuError::driver("context creation"))?;
        // One stream, used in order: cudarc's per-buffer event tracking is not needed.
        // SAFETY: no buffer is shared with another stream.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.default_stream();
        let name = ctx.name().map_err(GpuError::driver("device name"))?;
        let arch = ctx
            .compute_capability()
            .map_err(GpuError::driver("compute capability"))?;
        let sm_count = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(GpuError::driver("multiprocessor count"))? as usize;
        Ok(Gpu {
            ctx,
            stream,
            name,
            arch,
            sm_count,
            modules: Arc::new(Mutex::new(HashMap::new())),
            functions: Arc::new(Mutex::new(HashMap::new())),
            scratch: Mutex::new(Scratch {
                buf: None,
                epoch: 0,
            }),
            checked: std::sync::atomic::AtomicBool::new(true),
            side: OnceLock::new(),
        })
    }

    /// The process-wide GPU 0, opened once (the opening error is remembered too).
    pub fn shared() -> GpuResult<&'static Gpu> {
        let open = || {
            Gpu::open(0).map_err(|e| match e {
                GpuError::Unavailable(why) => why,
                other => other.to_string(),
            })
        };
        match SHARED.get_or_init(open) {
            Ok(g) => Ok(g),
            Err(e) => Err(GpuError::Unavailable(e.clone())),
        }
    }

    /// A handle on the same context and compiled modules with its own non-blocking stream
    /// (checked, fresh scratch): what CUDA graph capture needs (the legacy default stream of
    /// [`Gpu::open`] cannot be captured), and work that must not interleave with other
    /// threads' launches.
    pub fn fork(&self) -> GpuResult<Gpu> {
        let stream = self
            .ctx
            .new_stream()
            .map_err(GpuError::driver("stream creation"))?;
        Ok(Gpu {
            ctx: self.ctx.clone(),
            stream,
            name: self.name.clone(),
            arch: self.arch,
            sm_count: self.sm_count,
            modules: self.modules.clone(),
            functions: self.functions.clone(),
            scratch: Mutex::new(Scratch {
                buf: None,
                epoch: 0,
            }),
            checked: std::sync::atomic::AtomicBool::new(true),
            side: OnceLock::new(),
        })
    }

    /// Queues `side_work` on a second stream of this GPU and `main_work` on this one, to run at
    /// the same time: the second stream first waits for the work queued here so far, and this
    /// stream waits for `side_work` before anything queued after. Both closures only queue
    /// (their launches do not wait); graph capture follows the fork and the join.
    pub(crate) fn beside(
        &self,
        side_work: impl FnOnce(&Gpu) -> GpuResult<()>,
        main_work: impl FnOnce(&Gpu) -> GpuResult<()>,
    ) -> GpuResult<()> {
        if self.side.get().is_none() {
            let _ = self.side.set(Box::new(self.fork()?));
        }
        let side = self
            .side
            .get()
            .ok_or_else(|| GpuError::Unavailable("a second stream".into()))?;
        // the side stream waits for its kernels exactly when this one does: a fork starts
        // checked, and a checked side stream blocked the host after each of its launches even
        // in an unchecked (queued) run: the warm-up policy's two launches waited for everything
        // queued before them, and the intra stage was queued only after they had run (S10: the
        // automatic split cost ~60 µs over the serial path where it split nothing)
        side.set_checked(self.is_checked());
        let join =
            |a: &CudaStream, b: &CudaStream| a.join(b).map_err(GpuError::driver("stream ordering"));
        join(&side.stream, &self.stream)?;
        let queued = side_work(side);
        let ran = main_work(self);
        join(&self.stream, &side.stream)?;
        queued.and(ran)
    }

    /// Whether ops wait for their kernels (see [`Gpu::set_checked`]).
    pub fn is_checked(&self) -> bool {
        self.checked.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn name(&self) -> &str {
        &self.name
    }
    /// Compute capability `(major, minor)`.
    pub fn arch(&self) -> (i32, i32) {
        self.arch
    }
    pub fn sm_count(&self) -> usize {
        self.sm_count
    }
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Makes this GPU's context current on the calling thread. Raw driver calls (a 2-D copy, a
    /// byte fill) act in the current context, which with several GPUs driven from one thread
    /// (context parallelism) may be another GPU's; cudarc's own calls bind for themselves.
    pub(crate) fn bind(&self) -> GpuResult<()> {
        self.ctx
            .bind_to_thread()
            .map_err(GpuError::driver("binding the context"))
    }
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// With `checked` (the default) every op waits for its kernel and reports a failed
    /// execution against that kernel; benchmarks turn it off to queue launches.
    pub fn set_checked(&self, checked: bool) {
        self.checked
            .store(checked, std::sync::atomic::Ordering::Relaxed);
    }

    /// Waits for all queued work; reports an asynchronous failure.
    pub fn synchronize(&self) -> GpuResult<()> {
        self.stream
            .synchronize()
            .map_err(GpuError::driver("stream synchronisation"))
    }

    /// NVRTC options of `module`: the device's own architecture (`Module::target`), the toolkit
    /// include dir when present.
    fn compile_options(&self, module: Module) -> GpuResult<Vec<String>> {
        let Some(target) = module.target(self.arch) else {
            return Err(GpuError::Unavailable(format!(
                "module `{}` has no build for compute capability {}.{}",
                module.name(),
                self.arch.0,
                self.arch.1
            )));
        };
        let mut opts = vec![
            format!("--gpu-architecture={target}"),
            "--std=c++17".to_string(),
        ];
        if let Some(inc) = cuda_include_dir() {
            opts.push(format!("--include-path={inc}"));
        }
        if let Some(u) = knobs::lookback_u() {
            opts.push(format!("-DATTN_LB_U={u}"));
        }
        if let Some(r) = knobs::tile_rows().filter(|&r| r > 0) {
            opts.push(format!("-DATTN_TILE_RP={r}"));
        }
        if let Some(r) = knobs::decode_ring_rows() {
            opts.push(format!("-DDECODE_RING_ROWS={r}"));
        }
        opts.extend(knobs::nvrtc_opts());
        Ok(opts)
    }

    /// Compiles (once per process and option set: GPUs of one architecture share the PTX) and
    /// loads (once per device) `module`.
    pub fn module(&self, module: Module) -> GpuResult<Arc<CudaModule>> {
        let mut cache = self.modules.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = cache.get(&module) {
            return Ok(m.clone());
        }
        let ptx = compiled(module, self.compile_options(module)?)?;
        let m = self.ctx.load_module(ptx).map_err(GpuError::driver(format!(
            "loading module `{}`",
            module.name()
        )))?;
        cache.insert(module, m.clone());
        Ok(m)
    }

    pub(crate) fn function(&self, module: Module, kernel: &str) -> GpuResult<CudaFunction> {
        if let Some(f) = self
            .functions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(kernel)
        {
            return Ok(f.clone());
        }
        let m = self.module(module)?;
        let f = m
            .load_function(kernel)
            .map_err(GpuError::driver(format!("looking up kernel `{kernel}`")))?;
        self.functions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(kernel.to_string(), f.clone());
        Ok(f)
    }

    /// Launches `kernel` of `module` on a `grid` of `block`-thread blocks with one by-value
    /// parameter struct, checks the launch,
    /// and (when checked) its completion.
    pub(crate) fn launch<P: DeviceRepr>(
        &self,
        module: Module,
        kernel: &str,
        grid: (u32, u32),
        block: u32,
        params: &P,
    ) -> GpuResult<()> {
        self.launch_with_smem(module, kernel, grid, block, 0, params)
    }

    /// [`Gpu::launch`] with `smem` bytes of dynamic shared memory per block (above 48 KiB the
    /// kernel is opted in first).
    pub(crate) fn launch_with_smem<P: DeviceRepr>(
        &self,
        module: Module,
        kernel: &str,
        grid: (u32, u32),
        block: u32,
        smem: u32,
        params: &P,
    ) -> GpuResult<()> {
        self.launch_3d(module, kernel, (grid.0, grid.1, 1), block, smem, params)
    }

    /// [`Gpu::launch_with_smem`] on a 3-D grid.
    pub(crate) fn launch_3d<P: DeviceRepr>(
        &self,
        module: Module,
        kernel: &str,
        grid: (u32, u32, u32),
        block: u32,
        smem: u32,
        params: &P,
    ) -> GpuResult<()> {
        self.start_3d(module, kernel, grid, block, smem, params)?;
        self.wait_if_checked(kernel)
    }

    /// Queues one launch (shared memory opt-in, launch errors checked), without waiting.
    fn start_3d<P: DeviceRepr>(
        &self,
        module: Module,
        kernel: &str,
        grid: (u32, u32, u32),
        block: u32,
        smem: u32,
        params: &P,
    ) -> GpuResult<()> {
        let f = self.function(module, kernel)?;
        let fixed = if smem > 0 {
            let bytes = f.shared_size_bytes().map_err(GpuError::driver(format!(
                "static shared memory of `{kernel}`"
            )))?;
            u32::try_from(bytes).unwrap_or(0)
        } else {
            0
        };
        if smem.saturating_add(fixed) > 48 * 1024 {
            // beyond the default 48 KiB (static and dynamic together) a kernel must opt in to
            // its dynamic part (up to the device's limit)
            f.set_attribute(
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                smem as i32,
            )
            .map_err(GpuError::driver(format!(
                "{smem} bytes of shared memory for `{kernel}`"
            )))?;
        }
        let cfg = LaunchConfig {
            grid_dim: grid,
            block_dim: (block, 1, 1),
            shared_mem_bytes: smem,
        };
        let mut b = self.stream.launch_builder(&f);
        b.arg(params);
        // SAFETY: `P` is the `#[repr(C)]` mirror of the kernel's parameter struct, and every
        // pointer in it was sized and validated by the calling op.
        unsafe { b.launch(cfg) }.map_err(GpuError::driver(format!("launch of `{kernel}`")))?;
        Ok(())
    }

    /// [`Gpu::launch_with_smem`] without waiting for the kernel, checked or not: for ops that
    /// queue several kernels back to back and call [`Gpu::wait_if_checked`] once at the end.
    pub(crate) fn queue_with_smem<P: DeviceRepr>(
        &self,
        module: Module,
        kernel: &str,
        grid: (u32, u32),
        block: u32,
        smem: u32,
        params: &P,
    ) -> GpuResult<()> {
        self.start_3d(module, kernel, (grid.0, grid.1, 1), block, smem, params)
    }

    /// When checked, waits for the queued work and reports a failure against `what`.
    pub(crate) fn wait_if_checked(&self, what: &str) -> GpuResult<()> {
        if self.checked.load(std::sync::atomic::Ordering::Relaxed) {
            self.stream
                .synchronize()
                .map_err(GpuError::driver(format!("execution of `{what}`")))?;
        }
        Ok(())
    }

    /// The look-back scratch, holding at least `bytes` zero-initialised bytes (grown and
    /// zeroed when needed), with a fresh epoch for this launch.
    pub(crate) fn scratch(&self, bytes: usize) -> GpuResult<std::sync::MutexGuard<'_, Scratch>> {
        let mut s = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
        let too_small = s.buf.as_ref().is_none_or(|b| b.len() < bytes);
        if too_small || s.epoch == u32::MAX {
            let len = bytes.max(s.buf.as_ref().map_or(0, |b| b.len())).max(256);
            s.buf = Some(
                self.stream
                    .alloc_zeros::<u8>(len)
                    .map_err(GpuError::driver("look-back scratch allocation"))?,
            );
            s.epoch = 0;
        }
        s.epoch += 1;
        Ok(s)
    }
}

/// `$CUDA_HOME/include`, `$CUDA_PATH/include` or `/usr/local/cuda/include`, if it exists.
fn cuda_include_dir() -> Option<String> {
    let candidates = ["CUDA_HOME", "CUDA_PATH"]
        .iter()
        .filter_map(|v| std::env::var(v).ok())
        .map(|d| format!("{d}/include"))
        .chain(std::iter::once("/usr/local/cuda/include".to_string()));
    candidates
        .into_iter()
        .find(|d| std::path::Path::new(d).is_dir())
}

/// PTX by module and NVRTC options, for the whole process: a context-parallel group's GPUs
/// compile each module once (S9: two ranks spent 70 s compiling `kda_fwd`'s modules twice).
type PtxCache = Mutex<HashMap<(Module, Vec<String>), cudarc::nvrtc::Ptx>>;
static PTX: OnceLock<PtxCache> = OnceLock::new();

/// `module` compiled with `options`, from [`PTX`] or by NVRTC (then kept there).
fn compiled(module: Module, options: Vec<String>) -> GpuResult<cudarc::nvrtc::Ptx> {
    let mut cache = PTX
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let key = (module, options);
    if let Some(ptx) = cache.get(&key) {
        return Ok(ptx.clone());
    }
    let ptx = compile(module, &key.1)?;
    cache.insert(key, ptx.clone());
    Ok(ptx)
}

/// NVRTC-compiles one module; the error carries the compiler log.
fn compile(module: Module, options: &[String]) -> GpuResult<cudarc::nvrtc::Ptx> {
    let opts = cudarc::nvrtc::CompileOptions {
        options: options.to_vec(),
        name: Some(format!("{}.cu", module.name())),
        ..Default::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(module.source(), opts).map_err(|e| match e {
        cudarc::nvrtc::CompileError::CompileError { log, .. } => GpuError::Compile {
            module: module.name().to_string(),
            options: options.join(" "),
            log: log.to_string_lossy().into_owned(),
        },
        other => GpuError::Compile {
            module: module.name().to_string(),
            options: options.join(" "),
            log: other.to_string(),
        },
    })
}

/// Compiles every module's source to PTX for `arch` (e.g. `(9, 0)`) without a device: used to
/// check the sources where NVRTC exists but no GPU does.
pub fn compile_all_ptx(arch: (i32, i32)) -> GpuResult<Vec<(Module, String)>> {
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(GpuError::Unavailable(
            "the NVRTC library (libnvrtc) was not found".into(),
        ));
    }
    Module::ALL
        .iter()
        .filter_map(|&m| m.target(arch).map(|t| (m, t)))
        .map(|(m, target)| {
            let options = [format!("--gpu-architecture={target}"), "--std=c++17".into()];
            compile(m, &options).map(|p| (m, p.to_src()))
        })
        .collect()
}
