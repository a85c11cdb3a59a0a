//! Tuning knobs read from the environment at run time, for experiments only (`tools/GPU.md`,
//! `NOTES.md`). They sit at the bottom of the crate: kernel modules and the NVRTC options in
//! [`crate::device`] import them, and this module imports nothing of the crate. Unset or
//! out-of-range values mean "the tuned default".

/// A knob's value, parsed, when set and accepted by `ok`.
fn knob(name: &str, ok: impl Fn(usize) -> bool) -> Option<usize> {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&v| ok(v))
}

/// `$ATTN_LB_U`: chunks per warp of a look-back tile, 1..=32 (passed to NVRTC too).
pub(crate) fn lookback_u() -> Option<usize> {
    knob("ATTN_LB_U", |u| (1..=32).contains(&u))
}

/// `$ATTN_TILE_RP`: rows per part of the chunk tiles, 4 or 8; 0 sends the chunk scans to the
/// strided kernel.
pub(crate) fn tile_rows() -> Option<usize> {
    knob("ATTN_TILE_RP", |r| [0, 4, 8].contains(&r))
}

/// `$ATTN_STRIDED_WIDTH`: elements per thread of the strided scans, when `allowed` has it.
pub(crate) fn strided_width(allowed: &[usize]) -> Option<usize> {
    knob("ATTN_STRIDED_WIDTH", |w| allowed.contains(&w))
}

/// `$ATTN_STRIDED_WAVES`: waves of resident threads the strided width rule aims for.
pub(crate) fn strided_waves() -> Option<usize> {
    knob("ATTN_STRIDED_WAVES", |_| true)
}

/// `$ATTN_FWDH_BV`: state columns per block of the fwd_h / pre-scan tensor-core kernels (16, 32
/// or 64; the call's own rule still refuses widths its shapes do not allow).
pub(crate) fn fwd_h_bv() -> Option<usize> {
    knob("ATTN_FWDH_BV", |b| [16, 32, 64].contains(&b))
}

/// `$ATTN_FWD_BV`: state columns per block of the fused delta-rule forward (16, 32 or 64).
pub(crate) fn fwd_bv() -> Option<usize> {
    knob("ATTN_FWD_BV", |b| [16, 32, 64].contains(&b))
}

/// `$ATTN_PRESCAN_SPLIT=0`: the pre-scan's `M` columns without hi + lo operands (plain half
/// operands, as cuLA rounds them); anything else keeps the pairs.
pub(crate) fn prescan_split() -> bool {
    std::env::var("ATTN_PRESCAN_SPLIT").as_deref() != Ok("0")
}

/// `$ATTN_KDA_INTRA=mma`: the fused KDA path's intra stage on today's `kda_intra_mma*` kernels
/// (plans made while it is set); unset or anything else, on the persistent `kda_intra_pipe`
/// kernel where the call and the device fit it (the default since S16).
pub(crate) fn kda_intra_pipe() -> bool {
    std::env::var("ATTN_KDA_INTRA").as_deref() != Ok("mma")
}

/// `$ATTN_NVRTC_OPTS`: extra NVRTC options, e.g. `-DATTN_MIN_BLOCKS=2`.
pub(crate) fn nvrtc_opts() -> Vec<String> {
    std::env::var("ATTN_NVRTC_OPTS")
        .map(|s| s.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default()
}

/// `$ATTN_DECODE_CHUNK`: keys per split of `decode_attention` (at least 1).
pub(crate) fn decode_chunk() -> Option<usize> {
    knob("ATTN_DECODE_CHUNK", |c| c > 0)
}

/// `$ATTN_DECODE_BLOCKS_PER_SM`: blocks per multiprocessor the decode split rule aims for.
pub(crate) fn decode_blocks_per_sm() -> Option<usize> {
    knob("ATTN_DECODE_BLOCKS_PER_SM", |c| c > 0)
}

/// `$ATTN_DECODE_RING_ROWS`: the least rows per pass whose decode kernels load through the
/// cp.async ring, 1..=16 (16: none; passed to NVRTC too).
pub(crate) fn decode_ring_rows() -> Option<usize> {
    knob("ATTN_DECODE_RING_ROWS", |r| (1..=16).contains(&r))
}
