//! A case file from arbitrary bytes: read it (`Case::parse`), bind it to its op and check it
//! (`verify_case` on the CPU: registry checks, the reference, the comparison). Any outcome is
//! fine except a panic, an abort or a hang.
#![no_main]

use attn_conformance::case::Case;
use attn_conformance::verify::{verify_case, Selection};
use libfuzzer_sys::fuzz_target;
use std::path::Path;

fuzz_target!(|bytes: &[u8]| {
    if let Ok(case) = Case::parse(Path::new("fuzz.safetensors"), bytes) {
        let _ = verify_case(&case, Selection::Cpu);
    }
});
