//! The ranks of a context-parallel call and their NCCL communicators (cudarc's `nccl` module,
//! loaded at run time like the driver and NVRTC).
//!
//! Two ways to form a group of `R` ranks:
//!
//! - [`CpGroup::open`]: one process drives GPUs `0 .. R` (one [`Gpu`] and one communicator per
//!   device, `ncclCommInitAll`); collectives of all ranks are queued from the one thread between
//!   `ncclGroupStart` and `ncclGroupEnd`.
//! - [`CpGroup::join`]: one rank per process (across the GPUs of a host or across hosts): every
//!   process opens its own GPU and joins with its rank, the world size and the [`CpId`] that rank
//!   0 created and the caller sent to the others (`ncclCommInitRank`).
//!
//! The context-parallel ops take a group and the inputs of its *local* ranks (all of them in the
//! first form, one in the second); the code is the same.
//!
//! Failure: a collective is only queued (behind the work already queued on each rank's stream,
//! ahead of the work queued after it), so the ranks' GPUs run an op's phases back to back with
//! no host wait between them; every wait on the group is [`CpGroup::synchronize`], which polls
//! all local ranks at once. An error on one rank (its GPU faulted: the peers' collective then
//! never completes) or work not complete within [`CpGroup::timeout`] (a peer process failed or
//! hung) aborts every communicator of the group (`ncclCommAbort`, which ends the waiting NCCL
//! kernels) and returns [`GpuError::Collective`] naming the rank; the group is then unusable and
//! later collectives return that error at once. No rank waits forever.

use crate::device::Gpu;
use crate::error::{GpuError, GpuResult};
use crate::tensor::DeviceTensor;
use attn_reference::Error;
use cudarc::driver::CudaContext;
use cudarc::nccl::{Comm, Id};
use std::cell::RefCell;
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

/// How long [`CpGroup`]'s waits poll without sleeping: a collective of a few MB over NVLink
/// ends in tens of microseconds, and a 200 µs sleep (~250 µs in practice) per poll was half of
/// the exchange phase (S10-6: 0.6 ms at 4 ranks).
const SPIN: Duration = Duration::from_millis(2);

/// The longest sleep between polls.
const NAP_MAX: Duration = Duration::from_millis(1);

/// One pause between polls of a wait that began at `start`: a yield of the thread for the
/// first [`SPIN`], then a sleep of 1% of the time waited so far (at most [`NAP_MAX`]): a wait
/// overshoots its work by about 1%, and a hung peer does not hold a core for the timeout.
fn pause(start: Instant) {
    let waited = start.elapsed();
    if waited < SPIN {
        std::thread::yield_now();
    } else {
        std::thread::sleep((waited / 100).min(NAP_MAX));
    }
}

/// Default time a collective may take: `$ATTN_NCCL_TIMEOUT_S` seconds, else 120.
fn default_timeout() -> Duration {
    let s = std::env::var("ATTN_NCCL_TIMEOUT_S")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .unwrap_or(120.0);
    Duration::from_secs_f64(s)
}

/// Runs an NCCL call, turning cudarc's panics (a library without the symbol) and NCCL errors
/// into [`GpuError::Collective`].
fn nccl<T>(
    context: &str,
    f: impl FnOnce() -> Result<T, cudarc::nccl::result::NcclError>,
) -> GpuResult<T> {
    match std::panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(GpuError::Collective {
            context: context.to_string(),
            detail: format!("{:?}", e.0),
        }),
        Err(p) => Err(GpuError::Collective {
            context: context.to_string(),
            detail: p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panic in the NCCL binding".into()),
        }),
    }
}

/// Whether `libnccl` can be loaded; [`GpuError::Unavailable`] naming the fix otherwise.
fn require_nccl() -> GpuResult<()> {
    // SAFETY: only tries to dlopen the library.
    if unsafe { cudarc::nccl::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(GpuError::Unavailable(
            "the NCCL library (libnccl.so) was not found: put a directory holding libnccl.so \
             (e.g. a link to the libnccl.so.2 of the Python package nvidia-nccl-cu13) on \
             LD_LIBRARY_PATH (tools/GPU.md)"
                .into(),
        ))
    }
}

/// The unique id of a group formed with [`CpGroup::join`]: created once (by rank 0) and sent by
/// the caller to every other process as its 128 bytes.
#[derive(Debug, Clone, Copy)]
pub struct CpId(Id);

impl CpId {
    /// A new id (needs NCCL; no GPU).
    pub fn new() -> GpuResult<CpId> {
        require_nccl()?;
        nccl("ncclGetUniqueId", Id::new).map(CpId)
    }

    /// The id's bytes, to send to the other ranks.
    pub fn to_bytes(&self) -> [u8; 128] {
        self.0.internal().map(|c| c as u8)
    }

    /// The id received from rank 0.
    pub fn from_bytes(bytes: [u8; 128]) -> CpId {
        CpId(Id::uninit(bytes.map(|b| b as core::ffi::c_char)))
    }
}

/// One rank of this process: its global rank and its GPU.
struct LocalRank {
    rank: usize,
    gpu: Gpu,
}

/// The ranks of this process and their communicators (see the module docs).
pub struct CpGroup {
    local: Vec<LocalRank>,
    world: usize,
    comms: RefCell<Option<Vec<Comm>>>,
    timeout: Duration,
}

impl std::fmt::Debug for CpGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ranks: Vec<usize> = self.local.iter().map(|l| l.rank).collect();
        write!(f, "CpGroup(world {}, local ranks {ranks:?})", self.world)
    }
}

/// The number of CUDA devices (after [`Gpu::open`] proved the driver usable).
fn device_count() -> GpuResult<usize> {
    CudaContext::device_count()
        .map(|n| n.max(0) as usize)
        .map_err(GpuError::driver("device count"))
}

/// Opens GPU `ordinal` for a rank: unchecked launches (the ranks' work is queued from one
/// thread, so that the GPUs run at once; the caller waits with [`CpGroup::synchronize`]).
///
/// The device's default memory pool keeps what the ops free (release threshold: unlimited):
/// every call allocates its plans' workspaces again, gigabytes at a million tokens, and a pool
/// that returns them to the driver at each synchronisation maps them afresh each call.
fn open_rank(ordinal: usize) -> GpuResult<Gpu> {
    let gpu = Gpu::open(ordinal)?;
    gpu.set_checked(false);
    keep_freed_memory(&gpu)?;
    Ok(gpu)
}

/// Sets the release threshold of `gpu`'s default memory pool to unlimited (where the device has
/// memory pools; else nothing to do).
fn keep_freed_memory(gpu: &Gpu) -> GpuResult<()> {
    use cudarc::driver::sys;
    let ctx = gpu.context();
    if !ctx.has_async_alloc() {
        return Ok(());
    }
    gpu.bind()?;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    let mut threshold: u64 = u64::MAX;
    // SAFETY: `pool` receives the device's default pool; the attribute takes a pointer to a u64.
    unsafe {
        sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device())
            .result()
            .map_err(GpuError::driver("the default memory pool"))?;
        sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast(),
        )
        .result()
        .map_err(GpuError::driver("the memory pool's release threshold"))?;
    }
    Ok(())
}

impl CpGroup {
    /// `ranks` ranks on GPUs `0 .. ranks` of this process. Errors: `ranks` 0 or above the device
    /// count (naming `gpus`), no GPU or no NCCL ([`GpuError::Unavailable`]), an NCCL failure.
    pub fn open(ranks: usize) -> GpuResult<CpGroup> {
        if ranks == 0 {
            return Err(Error::param("gpus", "at least 1 GPU", 0).into());
        }
        let first = open_rank(0)?;
        let count = device_count()?;
        if ranks > count {
            return Err(Error::param(
                "gpus",
                format!("at most the {count} GPU(s) of this host"),
                ranks,
            )
            .into());
        }
        require_nccl()?;
        let mut gpus = vec![first];
        for i in 1..ranks {
            gpus.push(open_rank(i)?);
        }
        let streams = gpus.iter().map(|g| g.stream().clone()).collect();
        let comms = nccl("ncclCommInitAll", || Comm::from_devices(streams))?;
        Ok(CpGroup {
            local: gpus
                .into_iter()
                .enumerate()
                .map(|(rank, gpu)| LocalRank { rank, gpu })
                .collect(),
            world: ranks,
            comms: RefCell::new(Some(comms)),
            timeout: default_timeout(),
        })
    }

    /// This process's rank `rank` of `world`, on its GPU `ordinal`, with the group's `id`
    /// (blocks until every rank has joined and the ranks are connected: `connect`).
    pub fn join(ordinal: usize, rank: usize, world: usize, id: &CpId) -> GpuResult<CpGroup> {
        if rank >= world {
            return Err(
                Error::param("rank", format!("a rank below the world size {world}"), rank).into(),
            );
        }
        let gpu = open_rank(ordinal)?;
        require_nccl()?;
        let stream = gpu.stream().clone();
        // NCCL takes the calling thread's current device for the rank
        gpu.bind()?;
        let comm = nccl("ncclCommInitRank", || {
            Comm::from_rank(stream, rank, world, id.0)
        })?;
        let group = CpGroup {
            local: vec![LocalRank { rank, gpu }],
            world,
            comms: RefCell::new(Some(vec![comm])),
            timeout: default_timeout(),
        };
        group.connect()?;
        Ok(group)
    }

    /// One all-gather of 4 bytes a rank, waited for. NCCL connects a communicator's channels at
    /// its first collective, on the host inside `ncclGroupEnd`, which needs every peer and
    /// which no timeout reaches: a rank whose peer process had died blocked there forever
    /// (S12-6). Done at `join`, right after the init every rank has just completed, the
    /// connection is made while all ranks are known present; later collectives only queue, and
    /// a missing peer ends in [`CpGroup::synchronize`]'s timeout.
    fn connect(&self) -> GpuResult<()> {
        let gpu = &self.local[0].gpu;
        let send = DeviceTensor::from_slice(gpu, &[0f32])?;
        let mut recv = [DeviceTensor::alloc(
            gpu,
            &[self.world],
            attn_reference::Dtype::F32,
        )?];
        self.all_gather(&[&send], &mut recv)?;
        self.synchronize()
    }

    /// Ranks of the whole group `R`.
    pub fn world(&self) -> usize {
        self.world
    }

    /// The global ranks driven by this process, in order.
    pub fn local_ranks(&self) -> Vec<usize> {
        self.local.iter().map(|l| l.rank).collect()
    }

    /// The GPU of the `i`-th local rank.
    pub fn gpu(&self, i: usize) -> &Gpu {
        &self.local[i].gpu
    }

    /// The local ranks' `(global rank, GPU)`.
    pub fn ranks(&self) -> impl Iterator<Item = (usize, &Gpu)> {
        self.local.iter().map(|l| (l.rank, &l.gpu))
    }

    /// How long a collective may take before the group is aborted.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Waits for every local rank's queued work (collectives included), polling all ranks at
    /// once: the first rank whose work fails, or the timeout, aborts the group (module docs) and
    /// is reported with its rank.
    pub fn synchronize(&self) -> GpuResult<()> {
        let events = self
            .local
            .iter()
            .map(|l| l.gpu.stream().record_event(None))
            .collect::<Result<Vec<_>, _>>()
            .map_err(GpuError::driver("event at the group's synchronisation"))?;
        let start = Instant::now();
        let deadline = start + self.timeout;
        let mut done = vec![false; events.len()];
        loop {
            for ((l, e), d) in self.local.iter().zip(&events).zip(done.iter_mut()) {
                if *d {
                    continue;
                }
                match e.try_is_complete() {
                    Ok(c) => *d = c,
                    Err(err) => {
                        self.abort();
                        return Err(GpuError::Collective {
                            context: format!("rank {}", l.rank),
                            detail: format!("{err}; the group was aborted"),
                        });
                    }
                }
            }
            if done.iter().all(|&d| d) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                self.abort();
                let late = self
                    .local
                    .iter()
                    .zip(&done)
                    .filter(|(_, &d)| !d)
                    .map(|(l, _)| l.rank)
                    .collect::<Vec<_>>();
                return Err(GpuError::Collective {
                    context: format!("rank(s) {late:?}"),
                    detail: format!(
                        "not complete after {:?} (a peer failed or hung); the group was aborted",
                        self.timeout
                    ),
                });
            }
            pause(start);
        }
    }

    /// Queues the all-gather of `send[i]` (local rank `i`'s bytes) into `recv[i]` (`world` times
    /// the bytes of one send, rank-major) on every local rank's stream, after the work queued
    /// there; [`CpGroup::synchronize`] waits for it (module docs).
    pub fn all_gather(&self, send: &[&DeviceTensor], recv: &mut [DeviceTensor]) -> GpuResult<()> {
        let n = self.local.len();
        if send.len() != n || recv.len() != n {
            return Err(Error::shape(
                "send",
                format!("one tensor per local rank ({n})"),
                [send.len(), recv.len()],
            )
            .into());
        }
        let bytes = send.first().map_or(0, |t| t.num_bytes());
        for (s, r) in send.iter().zip(recv.iter()) {
            if s.num_bytes() != bytes || r.num_bytes() != bytes * self.world {
                return Err(Error::shape(
                    "recv",
                    format!("{} bytes per rank, {} in all", bytes, bytes * self.world),
                    [s.num_bytes(), r.num_bytes()],
                )
                .into());
            }
        }
        let guard = self.comms.borrow();
        let comms = guard.as_ref().ok_or_else(|| GpuError::Collective {
            context: "all-gather".into(),
            detail: "the group was aborted by an earlier failure; open a new one".into(),
        })?;
        if bytes > 0 {
            let queued = nccl("ncclGroupStart", cudarc::nccl::group_start).and_then(|_| {
                let each = comms.iter().zip(send.iter().zip(recv.iter_mut()));
                let mut first_err = Ok(());
                for (c, (s, r)) in each {
                    let src = s.buffer().slice(0..bytes);
                    let mut dst = r.buffer_mut().slice_mut(0..bytes * self.world);
                    let sent = nccl("ncclAllGather", || c.all_gather(&src, &mut dst));
                    if first_err.is_ok() {
                        first_err = sent.map(|_| ());
                    }
                }
                let ended = nccl("ncclGroupEnd", cudarc::nccl::group_end).map(|_| ());
                first_err.and(ended)
            });
            drop(guard);
            if let Err(e) = queued {
                self.abort();
                return Err(e);
            }
        }
        Ok(())
    }

    /// Aborts every communicator (`ncclCommAbort` on drop); the group refuses collectives
    /// afterwards.
    fn abort(&self) {
        if let Some(comms) = self.comms.borrow_mut().take() {
            // cudarc's drop panics if the abort itself fails: nothing more can be done then
            let _ = std::panic::catch_unwind(AssertUnwindSafe(move || drop(comms)));
        }
    }
}
