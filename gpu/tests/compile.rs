//! Every kernel module compiles with NVRTC for Hopper. Needs NVRTC but no GPU: where NVRTC is
//! absent the test is reported not run (fails with `ATTN_REQUIRE_GPU=1`).

mod common;

use attn_gpu::device::compile_all_ptx;
use attn_gpu::GpuError;
use common::harness::not_run;
use libtest_mimic::{Completion, Failed};

fn all_modules_compile_for_sm90() -> Result<Completion, Failed> {
    match compile_all_ptx((9, 0)) {
        Ok(mods) => {
            for (m, ptx) in mods {
                assert!(
                    ptx.contains(".entry"),
                    "module {} has no kernel entry",
                    m.name()
                );
                if let Ok(dir) = std::env::var("ATTN_PTX_DIR") {
                    std::fs::write(format!("{dir}/{}.ptx", m.name()), &ptx).unwrap();
                }
            }
            Ok(Completion::Completed)
        }
        Err(GpuError::Unavailable(why)) => not_run(why),
        Err(e) => panic!("{e}"),
    }
}

gpu_tests!(all_modules_compile_for_sm90);
