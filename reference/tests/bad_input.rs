//! Every public entry point of the scans, gates and decode refuses bad input with a typed error
//! naming the spec's argument (and never panics). One rstest case per distinct bad input; the
//! helpers that return a plain value are total.

use attn_reference::cumsum::{chunk_global_cumsum, chunk_local_cumsum, cumsum, validate_cumsum};
use attn_reference::decode::{
    decode_attention, kv_cache_update, validate_decode_attention, visible_keys, CacheLayout,
};
use attn_reference::gate::{
    kda_gate, kda_gate_chunk_cumsum, validate_kda_gate, KdaGateChunkCumsumParams,
};
use attn_reference::varlen::{chunk_indices, chunk_offsets, Seq};
use attn_reference::{Dtype, ErrorKind, Result};
use ndarray::{Array1, Array4, ArrayD, IxDyn};
use rstest::rstest;
use std::str::FromStr;

use CacheLayout::{Bhsd, Bshd};
use ErrorKind::{CuSeqlens, Index, Missing, Param, Shape};

/// Random-looking, finite filler (the values never matter: validation comes first).
fn tensor(shape: &[usize]) -> ArrayD<f64> {
    let mut i = 0u64;
    ArrayD::from_shape_simple_fn(IxDyn(shape), || {
        i += 1;
        ((i.wrapping_mul(2654435761) % 1000) as f64) / 500.0 - 1.0
    })
}

fn t4(shape: [usize; 4]) -> Array4<f64> {
    tensor(&shape).into_dimensionality().unwrap()
}

fn vec1(n: usize) -> Array1<f64> {
    tensor(&[n]).into_dimensionality().unwrap()
}

fn local(shape: &[usize], cu: Option<&[i64]>, chunk_size: i64) -> Result<()> {
    chunk_local_cumsum(tensor(shape).view(), cu, chunk_size, false, None).map(drop)
}

fn global(shape: &[usize], cu: Option<&[i64]>) -> Result<()> {
    chunk_global_cumsum(tensor(shape).view(), cu, true, Some(2.0)).map(drop)
}

/// `kda_gate` on `g [2, 5, 3, 4]` with `A_log`/`dt_bias` of the given lengths.
fn gate(a_log: Option<usize>, dt_bias: Option<usize>, lower_bound: Option<f64>) -> Result<()> {
    let (a, d) = (a_log.map(vec1), dt_bias.map(vec1));
    kda_gate(
        t4([2, 5, 3, 4]).view(),
        a.as_ref().map(|a| a.view()),
        d.as_ref().map(|d| d.view()),
        lower_bound,
    )
    .map(drop)
}

/// `kda_gate_chunk_cumsum` on `g [B, 10, 3, 4]`.
fn fused(
    b: usize,
    a_log: Option<usize>,
    dt_bias: usize,
    cu: Option<&[i64]>,
    chunk_size: i64,
) -> Result<()> {
    let (a, d) = (a_log.map(vec1), vec1(dt_bias));
    let params = KdaGateChunkCumsumParams {
        scale: Some(attn_reference::RCP_LN2),
        ..KdaGateChunkCumsumParams::new(chunk_size)
    };
    kda_gate_chunk_cumsum(
        t4([b, 10, 3, 4]).view(),
        a.as_ref().map(|a| a.view()),
        Some(d.view()),
        cu,
        params,
    )
    .map(drop)
}

/// `kv_cache_update` with caches `[3, 8, 2, 4]` (shape as given for `layout`) and new tokens
/// `[B, L_new, H_kv, D]`.
fn update(
    cache: [usize; 4],
    v_cache: [usize; 4],
    k: [usize; 4],
    v: [usize; 4],
    seqlens: &[i64],
    idx: Option<&[i64]>,
    layout: CacheLayout,
) -> Result<()> {
    kv_cache_update(
        t4(cache).view(),
        t4(v_cache).view(),
        t4(k).view(),
        t4(v).view(),
        seqlens,
        idx,
        layout,
    )
    .map(drop)
}

const C: [usize; 4] = [3, 8, 2, 4];
const NEW: [usize; 4] = [2, 3, 2, 4];

/// `decode_attention` with `q`, caches of the given shapes.
fn attend(
    q: [usize; 4],
    cache: [usize; 4],
    v_cache: [usize; 4],
    seqlens: &[i64],
    idx: Option<&[i64]>,
    scale: Option<f64>,
) -> Result<()> {
    decode_attention(
        t4(q).view(),
        t4(cache).view(),
        t4(v_cache).view(),
        seqlens,
        idx,
        scale,
        true,
        Bshd,
    )
    .map(drop)
}

const Q: [usize; 4] = [2, 2, 4, 8];
const KV: [usize; 4] = [3, 16, 2, 8];

#[rstest]
// cumsum
#[case::cumsum_rank_0(|| cumsum(tensor(&[]).view(), 0, false).map(drop), Shape, "x")]
#[case::cumsum_dim_eq_rank(|| cumsum(tensor(&[2, 3]).view(), 2, false).map(drop), Param, "dim")]
#[case::cumsum_dim_below_minus_rank(|| cumsum(tensor(&[2, 3, 4]).view(), -4, true).map(drop), Param, "dim")]
#[case::cumsum_dim_huge(|| cumsum(tensor(&[5]).view(), i64::MAX, false).map(drop), Param, "dim")]
#[case::cumsum_dim_min(|| cumsum(tensor(&[5]).view(), i64::MIN, false).map(drop), Param, "dim")]
#[case::cumsum_numel_overflow(|| validate_cumsum(&[usize::MAX, 2, 3], 0).map(drop), Shape, "x")]
#[case::dtype_unknown(|| Dtype::from_str("float8").map(drop), ErrorKind::Dtype, "dtype")]
// chunk_local_cumsum
#[case::local_rank_2(|| local(&[2, 8], None, 4), Shape, "g")]
#[case::local_rank_5(|| local(&[1, 8, 2, 2, 2], None, 4), Shape, "g")]
#[case::local_chunk_size_0(|| local(&[1, 8, 2], None, 0), Param, "chunk_size")]
#[case::local_chunk_size_48(|| local(&[1, 8, 2], None, 48), Param, "chunk_size")]
#[case::local_chunk_size_negative(|| local(&[1, 8, 2], None, -16), Param, "chunk_size")]
#[case::local_cu_with_batch_2(|| local(&[2, 8, 2], Some(&[0, 8]), 4), Shape, "cu_seqlens")]
#[case::local_cu_first_not_0(|| local(&[1, 8, 2], Some(&[1, 8]), 4), CuSeqlens, "cu_seqlens")]
#[case::local_cu_decreasing(|| local(&[1, 8, 2, 3], Some(&[0, 5, 3, 8]), 4), CuSeqlens, "cu_seqlens")]
#[case::local_cu_last_not_t(|| local(&[1, 8, 2], Some(&[0, 3, 7]), 4), CuSeqlens, "cu_seqlens")]
#[case::local_cu_too_short(|| local(&[1, 8, 2], Some(&[0]), 4), CuSeqlens, "cu_seqlens")]
#[case::local_cu_empty(|| local(&[1, 0, 2], Some(&[]), 4), CuSeqlens, "cu_seqlens")]
// chunk_global_cumsum
#[case::global_rank_1(|| global(&[8], None), Shape, "g")]
#[case::global_cu_last_past_t(|| global(&[1, 8, 2], Some(&[0, 4, 9])), CuSeqlens, "cu_seqlens")]
#[case::global_cu_with_batch_3(|| global(&[3, 8, 2], Some(&[0, 8])), Shape, "cu_seqlens")]
#[case::global_cu_negative_start(|| global(&[1, 8, 2], Some(&[-1, 8])), CuSeqlens, "cu_seqlens")]
// kda_gate
#[case::gate_a_log_absent(|| gate(None, Some(12), None), Missing, "A_log")]
#[case::gate_a_log_len(|| gate(Some(4), None, None), Shape, "A_log")]
#[case::gate_a_log_len_bounded(|| gate(Some(2), None, Some(-5.0)), Shape, "A_log")]
#[case::gate_dt_bias_len(|| gate(Some(3), Some(4), None), Shape, "dt_bias")]
#[case::gate_dt_bias_len_bounded(|| gate(None, Some(13), Some(-1.0)), Shape, "dt_bias")]
#[case::gate_lower_bound_nan(|| gate(Some(3), None, Some(f64::NAN)), Param, "lower_bound")]
#[case::gate_lower_bound_positive(|| gate(None, None, Some(2.0)), Param, "lower_bound")]
#[case::gate_lower_bound_zero(|| gate(Some(3), None, Some(0.0)), Param, "lower_bound")]
#[case::gate_rank_3(|| validate_kda_gate(&[2, 5, 12], Some(2), None, None).map(drop), Shape, "g")]
// kda_gate_chunk_cumsum
#[case::fused_chunk_size_100(|| fused(1, Some(3), 12, None, 100), Param, "chunk_size")]
#[case::fused_a_log_absent(|| fused(1, None, 12, None, 16), Missing, "A_log")]
#[case::fused_dt_bias_len(|| fused(1, Some(3), 3, None, 16), Shape, "dt_bias")]
#[case::fused_cu_batch_2(|| fused(2, Some(3), 12, Some(&[0, 10]), 16), Shape, "cu_seqlens")]
#[case::fused_cu_decreasing(|| fused(1, Some(3), 12, Some(&[0, 6, 2, 10]), 16), CuSeqlens, "cu_seqlens")]
#[case::fused_cu_last_not_t(|| fused(1, Some(3), 12, Some(&[0, 9]), 16), CuSeqlens, "cu_seqlens")]
// kv_cache_update
#[case::update_write_past_s(|| update(C, C, NEW, NEW, &[5, 6], None, Bshd), Index, "cache_seqlens")]
#[case::update_negative_seqlen(|| update(C, C, NEW, NEW, &[0, -1], None, Bshd), Index, "cache_seqlens")]
#[case::update_seqlens_len(|| update(C, C, NEW, NEW, &[0, 1, 2], None, Bshd), Shape, "cache_seqlens")]
#[case::update_idx_out_of_range(|| update(C, C, NEW, NEW, &[0, 0], Some(&[0, 3]), Bshd), Index, "cache_batch_idx")]
#[case::update_idx_negative(|| update(C, C, NEW, NEW, &[0, 0], Some(&[-1, 0]), Bshd), Index, "cache_batch_idx")]
#[case::update_idx_repeated(|| update(C, C, NEW, NEW, &[0, 0], Some(&[2, 2]), Bshd), Index, "cache_batch_idx")]
#[case::update_idx_len(|| update(C, C, NEW, NEW, &[0, 0], Some(&[0]), Bshd), Shape, "cache_batch_idx")]
#[case::update_k_heads(|| update(C, C, [2, 3, 1, 4], [2, 3, 1, 4], &[0, 0], None, Bshd), Shape, "k")]
#[case::update_k_head_dim(|| update(C, C, [2, 3, 2, 5], [2, 3, 2, 5], &[0, 0], None, Bshd), Shape, "k")]
#[case::update_v_shape(|| update(C, C, NEW, [2, 2, 2, 4], &[0, 0], None, Bshd), Shape, "v")]
#[case::update_v_cache_shape(|| update(C, [3, 9, 2, 4], NEW, NEW, &[0, 0], None, Bshd), Shape, "v_cache")]
#[case::update_batch_past_cache(|| update([1, 8, 2, 4], [1, 8, 2, 4], NEW, NEW, &[0, 0], None, Bshd), Shape, "k")]
#[case::update_bhsd_heads(|| update(C, C, NEW, NEW, &[0, 0], None, Bhsd), Shape, "k")]
#[case::update_bhsd_past_s(|| update([3, 2, 4, 4], [3, 2, 4, 4], NEW, NEW, &[2, 0], None, Bhsd), Index, "cache_seqlens")]
// decode_attention
#[case::attend_gqa_not_divisible(|| attend([2, 2, 3, 8], KV, KV, &[1, 1], None, None), Shape, "q")]
#[case::attend_head_dim_over_256(|| attend([1, 1, 2, 257], [1, 4, 2, 257], [1, 4, 2, 257], &[1], None, None), Shape, "q")]
#[case::attend_head_dim_0(|| attend([1, 1, 2, 0], [1, 4, 2, 0], [1, 4, 2, 0], &[1], None, None), Shape, "q")]
#[case::attend_head_dim_mismatch(|| attend([2, 2, 4, 16], KV, KV, &[1, 1], None, None), Shape, "q")]
#[case::attend_seqlen_past_s(|| attend(Q, KV, KV, &[16, 17], None, None), Index, "cache_seqlens")]
#[case::attend_seqlen_negative(|| attend(Q, KV, KV, &[-3, 1], None, None), Index, "cache_seqlens")]
#[case::attend_seqlens_len(|| attend(Q, KV, KV, &[3], None, None), Shape, "cache_seqlens")]
#[case::attend_idx_out_of_range(|| attend(Q, KV, KV, &[1, 1], Some(&[7, 0]), None), Index, "cache_batch_idx")]
#[case::attend_idx_repeated(|| attend(Q, KV, KV, &[1, 1], Some(&[1, 1]), None), Index, "cache_batch_idx")]
#[case::attend_idx_len(|| attend(Q, KV, KV, &[1, 1], Some(&[0, 1, 2]), None), Shape, "cache_batch_idx")]
#[case::attend_v_cache_shape(|| attend(Q, KV, [3, 16, 2, 4], &[1, 1], None, None), Shape, "v_cache")]
#[case::attend_batch_past_cache(|| attend([4, 1, 4, 8], KV, KV, &[1, 1, 1, 1], None, None), Shape, "q")]
#[case::attend_no_kv_heads(|| attend(Q, [3, 16, 0, 8], [3, 16, 0, 8], &[1, 1], None, None), Shape, "k_cache")]
#[case::attend_scale_nan(|| attend(Q, KV, KV, &[1, 1], None, Some(f64::NAN)), Param, "softmax_scale")]
#[case::attend_scale_inf(|| attend(Q, KV, KV, &[1, 1], None, Some(f64::INFINITY)), Param, "softmax_scale")]
#[case::attend_q_rank_3(|| validate_decode_attention(&[2, 4, 8], &KV, &KV, &[1, 1], None, Bshd).map(drop), Shape, "q")]
#[case::attend_cache_rank_3(|| validate_decode_attention(&Q, &[3, 16, 16], &[3, 16, 16], &[1, 1], None, Bhsd).map(drop), Shape, "k_cache")]
#[case::layout_unknown(|| CacheLayout::from_str("bsdh").map(drop), Param, "cache_layout")]
fn refused_with_named_argument(
    #[case] call: fn() -> Result<()>,
    #[case] kind: ErrorKind,
    #[case] arg: &str,
) {
    let err = call().expect_err("bad input must be refused");
    assert_eq!(err.kind, kind, "{err}");
    assert_eq!(err.arg, arg, "{err}");
    assert!(!err.expected.is_empty() && !err.got.is_empty(), "{err:?}");
}

/// The public helpers that return a plain value are total: extreme or malformed arguments give
/// a value, never an overflow or a division by zero.
#[rstest]
#[case::visible_all_causal(5, 1, 0, true, 5)]
#[case::visible_none_yet(2, 4, 0, true, 0)]
#[case::visible_huge_n(usize::MAX, 1, 0, true, usize::MAX)]
#[case::visible_huge_i(3, usize::MAX, usize::MAX, true, 3)]
#[case::visible_not_causal(7, usize::MAX, usize::MAX, false, 7)]
fn visible_keys_never_overflows(
    #[case] n: usize,
    #[case] l_q: usize,
    #[case] i: usize,
    #[case] causal: bool,
    #[case] want: usize,
) {
    assert_eq!(visible_keys(n, l_q, i, causal), want);
}

#[rstest]
#[case::chunks_of_4(Seq { n: 0, batch: 0, bos: 3, eos: 10 }, 4, 7, 2)]
#[case::chunk_size_0_counts_as_1(Seq { n: 0, batch: 0, bos: 3, eos: 6 }, 0, 3, 3)]
#[case::eos_before_bos_is_empty(Seq { n: 0, batch: 0, bos: 6, eos: 3 }, 4, 0, 0)]
fn seq_helpers_are_total(
    #[case] seq: Seq,
    #[case] bt: usize,
    #[case] len: usize,
    #[case] chunks: usize,
) {
    assert_eq!((seq.len(), seq.is_empty()), (len, len == 0));
    assert_eq!(seq.num_chunks(bt), chunks);
    assert_eq!(seq.chunks(bt).count(), chunks);
    assert_eq!(chunk_offsets(&[seq], bt), vec![0, chunks]);
    assert_eq!(chunk_indices(&[seq], bt).len(), chunks);
}
