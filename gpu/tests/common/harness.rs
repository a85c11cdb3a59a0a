//! The GPU tests' harness (`harness = false` in gpu/Cargo.toml, `libtest-mimic`): a test that
//! needs the GPU and finds none is reported `ignored, no GPU available: ...`, not `ok`; with
//! `ATTN_REQUIRE_GPU=1` it fails instead. The standard test arguments work (a name filter,
//! `--exact`, `--skip`, `--list`, `--ignored`, `--test-threads`, ...). Usage: see
//! [`gpu_tests!`](crate::gpu_tests) and the top of `common/mod.rs`.

use attn_gpu::Gpu;
use libtest_mimic::{Arguments, Completion, Failed, Trial};

/// Whether a missing GPU (or NVRTC) fails a test instead of marking it not run.
fn gpu_required() -> bool {
    std::env::var("ATTN_REQUIRE_GPU").as_deref() == Ok("1")
}

/// The outcome of a test that could not run for `why` (no GPU, no NVRTC): ignored with the
/// reason, or a failure with `ATTN_REQUIRE_GPU=1`.
pub fn not_run(why: impl std::fmt::Display) -> Result<Completion, Failed> {
    if gpu_required() {
        Err(format!("ATTN_REQUIRE_GPU=1 but {why}").into())
    } else {
        Ok(Completion::ignored_with(why))
    }
}

/// What a test returns: nothing (it passed unless it panicked), or a [`Completion`] (a test
/// that found out itself that it could not run, through [`not_run`]).
pub trait Outcome {
    fn into_result(self) -> Result<Completion, Failed>;
}

impl Outcome for () {
    fn into_result(self) -> Result<Completion, Failed> {
        Ok(Completion::Completed)
    }
}

impl Outcome for Result<Completion, Failed> {
    fn into_result(self) -> Result<Completion, Failed> {
        self
    }
}

/// A test fn: `fn()` (needs no GPU) or `fn(&Gpu)` (gets the shared GPU, not run without one).
/// `M` only tells the two impls apart.
pub trait TestFn<M> {
    fn trial(self, name: &str) -> Trial;
}

/// Marks [`TestFn`]s that take no GPU.
pub struct NoGpu;
/// Marks [`TestFn`]s that take the GPU.
pub struct WithGpu;

impl<F, R> TestFn<(NoGpu, R)> for F
where
    F: FnOnce() -> R + Send + 'static,
    R: Outcome,
{
    fn trial(self, name: &str) -> Trial {
        Trial::ignorable_test(name, move || self().into_result())
    }
}

impl<F, R> TestFn<(WithGpu, R)> for F
where
    F: FnOnce(&'static Gpu) -> R + Send + 'static,
    R: Outcome,
{
    fn trial(self, name: &str) -> Trial {
        Trial::ignorable_test(name, move || match Gpu::shared() {
            Ok(gpu) => self(gpu).into_result(),
            Err(e) => not_run(e),
        })
    }
}

/// One trial of a [`TestFn`] (what [`gpu_tests!`](crate::gpu_tests) calls per test).
pub fn trial<M>(name: &str, test: impl TestFn<M>) -> Trial {
    test.trial(name)
}

/// Runs `trials` under the command-line arguments and exits with libtest's status.
pub fn run(trials: Vec<Trial>) -> ! {
    libtest_mimic::run(&Arguments::from_args(), trials).exit()
}

/// The `main` of a GPU test file: `gpu_tests!(test_a, test_b, module::test_c);` lists its test
/// fns, each named as libtest would name it (the path as written). A test fn is `fn()` (runs
/// everywhere) or `fn(&Gpu)` (gets the shared GPU; without one it is reported ignored, and fails
/// with `ATTN_REQUIRE_GPU=1`), returning `()` or the [`not_run`] result of a test that finds out
/// itself that it cannot run.
#[macro_export]
macro_rules! gpu_tests {
    ($($test:path),+ $(,)?) => {
        fn main() {
            $crate::common::harness::run(vec![
                $($crate::common::harness::trial(stringify!($test), $test)),+
            ])
        }
    };
}
