//! `chunk_gated_delta_rule_fwd_h_split` (`conformance/spec/ops-delta-rule.md` §5): section 2
//! computed by splitting sequences at chunk boundaries into sub-sequences, summarising them
//! (`fwd_h_pre_scan`), merging the summaries into the pieces' initial states (`fwd_h_merge`) and
//! running section 2 on the pieces. Also the validation of a split (5.2), the project's split
//! policy (5.4) and warm-up pieces (`warmup_chunks`, 5.9).

use super::check::{boundary, Geometry};
use super::fwd_h::{self, chunk_gated_delta_rule_fwd_h, FwdHInputs, FwdHParams, FwdHShapes};
use super::merge::{fwd_h_merge, FwdHMergeInputs, FwdHMergeParams};
use super::prescan::{fwd_h_pre_scan, FwdHPreScanParams};
use crate::error::ErrorKind;
use crate::error::{Error, Result};
use crate::scalar::Real;
use ndarray::{s, Array3, Array4, ArrayView3, ArrayView4, Axis};

/// The SM count assumed by the automatic split policy when none is given (H100/H200: 132).
pub const DEFAULT_NUM_SMS: usize = 132;

/// The project's split policy (`conformance/spec/ops-delta-rule.md` §5.4, used when
/// `subseq_cu_seqlens` is absent), over sequences of `seq_lens` tokens packed in order, for `HV`
/// heads, value dim `V`, chunk `BT`:
///
/// - a section-2 kernel runs `HV · ceil(V / 64)` work units per sequence; nothing is split when
///   `N · HV · ceil(V/64) >= num_sms / 2` (the GPU is already half full);
/// - only sequences of at least 256 chunks are split, into `p = min(32, NT_n / 64)` pieces of
///   `ceil(NT_n / p)` chunks (the last shorter), so pieces have at least 64 chunks;
/// - while the total number of pieces exceeds `max(N, num_sms / (HV · ceil(V/64)))`, the sequence
///   with the most pieces loses one.
///
/// Returns the `subseq_cu_seqlens` (chunk-aligned inner boundaries, one empty piece per empty
/// sequence), a valid split in the sense of `conformance/spec/ops-delta-rule.md` §5.2. `bt == 0` is
/// refused (named `chunk_size`).
pub fn auto_subseq_cu_seqlens(
    seq_lens: &[usize],
    hv: usize,
    v: usize,
    bt: usize,
    num_sms: usize,
) -> Result<Vec<i64>> {
    positive_chunk(bt)?;
    let units = hv.max(1).saturating_mul(v.div_ceil(64).max(1));
    let nts: Vec<usize> = seq_lens.iter().map(|l| l.div_ceil(bt)).collect();
    let mut pieces: Vec<usize> = vec![1; nts.len()];
    if nts.len().saturating_mul(units) < num_sms / 2 {
        for (p, &nt) in pieces.iter_mut().zip(&nts) {
            if nt >= 256 {
                *p = (nt / 64).min(32);
            }
        }
        let budget = nts.len().max(num_sms / units);
        while pieces.iter().sum::<usize>() > budget {
            // the sequence with the most pieces (the first of equals) loses one
            let Some((i, _)) = pieces
                .iter()
                .enumerate()
                .max_by_key(|&(i, &p)| (p, std::cmp::Reverse(i)))
            else {
                break;
            };
            pieces[i] -= 1;
        }
    }
    Ok(subseq_from_counts(seq_lens, bt, &pieces))
}

/// The `subseq_cu_seqlens` cutting sequence `n` (`seq_lens[n]` tokens, packed in order) into
/// `counts[n]` pieces of `ceil(NT_n / counts[n])` chunks of `bt` tokens, the last shorter (fewer
/// pieces when the chunks run out; a count of 0 is taken as 1). A valid split
/// (`conformance/spec/ops-delta-rule.md` §5.2) for `bt >= 1`.
pub fn subseq_from_counts(seq_lens: &[usize], bt: usize, counts: &[usize]) -> Vec<i64> {
    let mut out = vec![0i64];
    let mut bos = 0usize;
    for (&len, &c) in seq_lens.iter().zip(counts) {
        let per = len.div_ceil(bt).div_ceil(c.max(1)).max(1) * bt;
        let mut at = bos + per;
        while at < bos + len {
            out.push(at as i64);
            at += per;
        }
        bos += len;
        out.push(bos as i64);
    }
    out
}

/// A chunk size given as `usize` must be at least 1.
fn positive_chunk(bt: usize) -> Result<()> {
    if bt == 0 {
        return Err(Error::param("chunk_size", "a chunk size >= 1", bt));
    }
    Ok(())
}

/// `subseq_offsets` of a valid split: sequence `n` owns pieces `offsets[n] .. offsets[n+1]`.
/// Validates `subseq_cu_seqlens` against the sequences (`conformance/spec/ops-delta-rule.md` §5.2):
/// each sequence `n` is cut at `bos_n = p_0 < … < p_m = eos_n` (`m >= 1`, inner boundaries
/// `chunk_size`-aligned), a zero-length sequence is exactly one empty piece, and the list ends at
/// the last `eos`. `bounds` are the sequences' `(bos, eos)` in flattened token coordinates.
pub fn subseq_offsets(subseq: &[i64], bounds: &[(usize, usize)], bt: usize) -> Result<Vec<i64>> {
    positive_chunk(bt)?;
    let arg = "subseq_cu_seqlens";
    if subseq.len() < 2 || subseq[0] != 0 {
        return Err(boundary(
            arg,
            "length >= 2 starting at 0",
            format!("{subseq:?}"),
        ));
    }
    let mut offsets = vec![0i64];
    let mut i = 0usize; // index of the current piece start in `subseq`
    for (n, &(bos, eos)) in bounds.iter().enumerate() {
        if subseq[i] != bos as i64 {
            return Err(boundary(
                arg,
                format!("a boundary at the start {bos} of sequence {n}"),
                format!("subseq_cu_seqlens[{i}] = {}", subseq[i]),
            ));
        }
        loop {
            let Some(&next) = subseq.get(i + 1) else {
                return Err(boundary(
                    arg,
                    format!("pieces up to the end {eos} of sequence {n}"),
                    format!("the list ends at {}", subseq[i]),
                ));
            };
            let start = subseq[i];
            i += 1;
            if bos == eos {
                if next != start {
                    return Err(boundary(
                        arg,
                        format!("one empty piece for the empty sequence {n}"),
                        format!("subseq_cu_seqlens[{i}] = {next}"),
                    ));
                }
                break;
            }
            if next <= start {
                return Err(boundary(
                    arg,
                    format!("non-empty increasing pieces inside sequence {n}"),
                    format!("subseq_cu_seqlens[{i}] = {next} after {start}"),
                ));
            }
            if next > eos as i64 {
                return Err(boundary(
                    arg,
                    format!("pieces inside sequence {n} (ending at {eos})"),
                    format!("subseq_cu_seqlens[{i}] = {next}"),
                ));
            }
            if next == eos as i64 {
                break;
            }
            if (next as usize - bos) % bt != 0 {
                return Err(boundary(
                    arg,
                    format!("inner boundaries of sequence {n} at multiples of chunk_size = {bt} from {bos}"),
                    format!("subseq_cu_seqlens[{i}] = {next}"),
                ));
            }
        }
        offsets.push(i as i64);
    }
    if i + 1 != subseq.len() {
        return Err(boundary(
            arg,
            format!("the list to end at the last sequence end, index {i}"),
            format!("length {} ({subseq:?})", subseq.len()),
        ));
    }
    Ok(offsets)
}

/// The tensors of one [`chunk_gated_delta_rule_fwd_h_split`] call: section 2's, plus the
/// optional split points.
#[derive(Debug, Clone)]
pub struct FwdHSplitInputs<'a, T> {
    pub fwd_h: FwdHInputs<'a, T>,
    /// `[S + 1]` sub-sequence boundaries over the (flattened) tokens; `None` = the policy of
    /// [`auto_subseq_cu_seqlens`] with [`DEFAULT_NUM_SMS`].
    pub subseq_cu_seqlens: Option<&'a [i64]>,
    /// `[S]` warm-up chunk counts per piece (`conformance/spec/ops-delta-rule.md` §5.9; requires
    /// `subseq_cu_seqlens`); `None` = all 0 (every piece starts from its exact state).
    pub warmup_chunks: Option<&'a [i64]>,
}

/// A validated split: the geometry of section 2 and the pieces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitPlan {
    pub geometry: Geometry,
    /// The pieces used (given, or chosen by the policy).
    pub subseq_cu_seqlens: Vec<i64>,
    /// `subseq_offsets` of section 4 derived from them.
    pub subseq_offsets: Vec<i64>,
    /// Per piece, the warm-up chunk count (§5.9): all 0 unless given and validated by
    /// [`validate_warmup_chunks`].
    pub warmup_chunks: Vec<i64>,
}

/// Validates a [`chunk_gated_delta_rule_fwd_h_split`] call
/// (`conformance/spec/ops-delta-rule.md` §5.6): section 2's checks plus a valid split (5.2).
pub fn validate_chunk_gated_delta_rule_fwd_h_split(
    shapes: &FwdHShapes<'_>,
    cu_seqlens: Option<&[i64]>,
    subseq_cu_seqlens: Option<&[i64]>,
    params: &FwdHParams,
) -> Result<SplitPlan> {
    let geo = fwd_h::validate_chunk_gated_delta_rule_fwd_h(shapes, cu_seqlens, params)?;
    let bounds: Vec<(usize, usize)> = geo
        .seqs
        .iter()
        .map(|s| (s.batch * geo.t + s.bos, s.batch * geo.t + s.eos))
        .collect();
    let pieces = match subseq_cu_seqlens {
        Some(p) => p.to_vec(),
        None => {
            let lens: Vec<usize> = geo.seqs.iter().map(|s| s.len()).collect();
            auto_subseq_cu_seqlens(&lens, geo.hv, geo.v, geo.bt, DEFAULT_NUM_SMS)?
        }
    };
    let offsets = subseq_offsets(&pieces, &bounds, geo.bt)?;
    Ok(SplitPlan {
        geometry: geo,
        warmup_chunks: vec![0; pieces.len() - 1],
        subseq_cu_seqlens: pieces,
        subseq_offsets: offsets,
    })
}

/// Validates `warmup_chunks` (`conformance/spec/ops-delta-rule.md` §5.9) against a validated
/// split and stores it in the plan. `subseq_given` says whether the caller gave
/// `subseq_cu_seqlens` (warm-ups require explicit pieces). Refused, each error naming
/// `warmup_chunks`: given without `subseq_cu_seqlens` ([`ErrorKind::Missing`]), a length other
/// than the number of pieces `S` ([`ErrorKind::Shape`]), a negative count, or a non-zero count on
/// the first piece of a sequence ([`ErrorKind::Index`]). `None` leaves every count 0.
pub fn validate_warmup_chunks(
    plan: &mut SplitPlan,
    subseq_given: bool,
    warmup_chunks: Option<&[i64]>,
) -> Result<()> {
    let arg = "warmup_chunks";
    let Some(w) = warmup_chunks else {
        return Ok(());
    };
    if !subseq_given {
        return Err(Error::missing(
            arg,
            "subseq_cu_seqlens alongside warmup_chunks (warm-ups need explicit pieces)",
            "warmup_chunks without subseq_cu_seqlens",
        ));
    }
    let s = plan.subseq_cu_seqlens.len() - 1;
    if w.len() != s {
        return Err(Error::shape(
            arg,
            format!("[S] = [{s}] (one count per piece of subseq_cu_seqlens)"),
            [w.len()],
        ));
    }
    if let Some((i, &x)) = w.iter().enumerate().find(|&(_, &x)| x < 0) {
        return Err(Error::new(
            ErrorKind::Index,
            arg,
            "counts >= 0",
            format!("warmup_chunks[{i}] = {x}"),
        ));
    }
    for (n, &first) in plan.subseq_offsets[..plan.subseq_offsets.len() - 1]
        .iter()
        .enumerate()
    {
        let i = first as usize;
        if w[i] != 0 {
            return Err(Error::new(
                ErrorKind::Index,
                arg,
                format!("0 on piece {i}, the first piece of sequence {n}"),
                format!("warmup_chunks[{i}] = {}", w[i]),
            ));
        }
    }
    plan.warmup_chunks = w.to_vec();
    Ok(())
}

/// Section 2 computed through the split (`conformance/spec/ops-delta-rule.md` §5.3): pre-scan of
/// the pieces, merge into the pieces' initial states, section 2 on the pieces. Equal to
/// [`chunk_gated_delta_rule_fwd_h`] on the same inputs whatever the (valid) split.
///
/// With `warmup_chunks` (§5.9), piece `i` of sequence `n` starting at local chunk `c0` with
/// `w_i > 0` starts instead from the state of section 2's recurrence run over chunks
/// `max(0, c0 − w_i) .. c0 − 1` of its sequence from a zero state (from `initial_state[n]` when
/// `c0 − w_i <= 0`); the warm-up writes no `h` or `v_new`.
pub fn chunk_gated_delta_rule_fwd_h_split<T: Real>(
    inp: &FwdHSplitInputs<'_, T>,
    params: &FwdHParams,
) -> Result<fwd_h::FwdHOutputs<T>> {
    let f = &inp.fwd_h;
    let mut plan = validate_chunk_gated_delta_rule_fwd_h_split(
        &f.shapes(),
        f.cu_seqlens,
        inp.subseq_cu_seqlens,
        params,
    )?;
    validate_warmup_chunks(
        &mut plan,
        inp.subseq_cu_seqlens.is_some(),
        inp.warmup_chunks,
    )?;
    let geo = &plan.geometry;
    let (b, t) = (geo.b, geo.t);
    let (k, w, u) = (flat4("k", f.k)?, flat4("w", f.w)?, flat4("u", f.u)?);
    let g = f.g.map(|g| flat3("g", g)).transpose()?;
    let gk = f.gk.map(|gk| flat4("gk", gk)).transpose()?;
    let pieces = FwdHInputs {
        k: k.view(),
        w: w.view(),
        u: u.view(),
        g: g.as_ref().map(|g| g.view()),
        gk: gk.as_ref().map(|gk| gk.view()),
        initial_state: None,
        cu_seqlens: Some(&plan.subseq_cu_seqlens),
    };
    let hm = fwd_h_pre_scan(
        &pieces,
        &FwdHPreScanParams {
            chunk_size: params.chunk_size,
        },
    )?
    .hm;
    let merged = fwd_h_merge(
        &FwdHMergeInputs {
            hm: hm.view(),
            subseq_offsets: &plan.subseq_offsets,
            initial_state: f.initial_state.as_ref().map(|a| a.view()),
        },
        &FwdHMergeParams {
            state_v_first: params.state_v_first,
            output_final_state: false,
        },
    )?;
    let mut starts = merged.initial_states;
    warm_up(
        &plan,
        &pieces,
        f.initial_state.as_ref(),
        params,
        &mut starts,
    )?;
    let run = chunk_gated_delta_rule_fwd_h(
        &FwdHInputs {
            initial_state: Some(starts.view()),
            ..pieces
        },
        params,
    )?;
    let h = if f.cu_seqlens.is_some() {
        run.h
    } else {
        let sh = run.h.shape().to_vec();
        run.h
            .into_shape_with_order((b, sh[1] / b, sh[2], sh[3], sh[4]))
            .map_err(|e| Error::shape("h", "a [B, NT, ...] layout", e.to_string()))?
    };
    let v_new = match run.v_new {
        Some(vn) => Some(
            vn.into_shape_with_order((b, t, geo.hv, geo.v))
                .map_err(|e| Error::shape("v_new", "a [B, T, HV, V] layout", e.to_string()))?,
        ),
        None => None,
    };
    let final_state = run.final_state.map(|fs| {
        let last: Vec<usize> = plan.subseq_offsets[1..]
            .iter()
            .map(|&o| o as usize - 1)
            .collect();
        fs.select(Axis(0), &last)
    });
    Ok(fwd_h::FwdHOutputs {
        h,
        v_new,
        final_state,
    })
}

/// Replaces the start state of every piece with `w_i > 0` by its warm-up state
/// (`conformance/spec/ops-delta-rule.md` §5.9): section 2 on the tokens of chunks
/// `max(0, c0 − w_i) .. c0 − 1` of the piece's sequence, from zero (from `initial_state[n]` when
/// the warm-up reaches the sequence start). `flat` holds the flattened `[1, B·T, ...]` tensors;
/// `starts` the pieces' exact start states `[S, HV, ...]` (layout of `state_v_first`).
fn warm_up<T: Real>(
    plan: &SplitPlan,
    flat: &FwdHInputs<'_, T>,
    initial_state: Option<&ArrayView4<'_, T>>,
    params: &FwdHParams,
    starts: &mut Array4<T>,
) -> Result<()> {
    let bt = plan.geometry.bt;
    let offs = &plan.subseq_offsets;
    let p = &plan.subseq_cu_seqlens;
    for n in 0..offs.len() - 1 {
        let (first, end) = (offs[n] as usize, offs[n + 1] as usize);
        let bos = p[first] as usize;
        for (i, &w) in plan.warmup_chunks.iter().enumerate().take(end).skip(first) {
            if w <= 0 {
                continue;
            }
            let at = p[i] as usize;
            let c0 = (at - bos) / bt;
            let from_chunk = c0.saturating_sub(usize::try_from(w).unwrap_or(usize::MAX));
            let from = bos + from_chunk * bt;
            let h0 = if from_chunk == 0 {
                initial_state.map(|a| a.slice(s![n..n + 1, .., .., ..]))
            } else {
                None
            };
            let run = chunk_gated_delta_rule_fwd_h(
                &FwdHInputs {
                    k: flat.k.slice(s![.., from..at, .., ..]),
                    w: flat.w.slice(s![.., from..at, .., ..]),
                    u: flat.u.slice(s![.., from..at, .., ..]),
                    g: flat.g.as_ref().map(|g| g.slice(s![.., from..at, ..])),
                    gk: flat.gk.as_ref().map(|g| g.slice(s![.., from..at, .., ..])),
                    initial_state: h0,
                    cu_seqlens: None,
                },
                &FwdHParams {
                    output_final_state: true,
                    save_new_value: false,
                    ..*params
                },
            )?;
            let fs = run
                .final_state
                .ok_or_else(|| Error::missing("final_state", "a warm-up final state", "none"))?;
            starts
                .slice_mut(s![i, .., .., ..])
                .assign(&fs.index_axis(Axis(0), 0));
        }
    }
    Ok(())
}

/// A `[B, T, X, Y]` tensor as `[1, B·T, X, Y]` (standard layout copy).
fn flat4<T: Real>(arg: &str, a: ArrayView4<'_, T>) -> Result<Array4<T>> {
    let sh = a.shape().to_vec();
    a.as_standard_layout()
        .into_owned()
        .into_shape_with_order((1, sh[0] * sh[1], sh[2], sh[3]))
        .map_err(|e| Error::shape(arg, "a [B, T, ...] tensor", e.to_string()))
}

/// A `[B, T, X]` tensor as `[1, B·T, X]`.
fn flat3<T: Real>(arg: &str, a: ArrayView3<'_, T>) -> Result<Array3<T>> {
    let sh = a.shape().to_vec();
    a.as_standard_layout()
        .into_owned()
        .into_shape_with_order((1, sh[0] * sh[1], sh[2]))
        .map_err(|e| Error::shape(arg, "a [B, T, ...] tensor", e.to_string()))
}
