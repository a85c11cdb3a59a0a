//! Native sparse attention (`conformance/spec/ops-nsa.md`): key/value compression, the compressed
//! branch, block selection, the selected branch, gating, and the whole FLA forward.
//!
//! Letters: `B` batch, `T` tokens, `HQ` query heads, `H` key/value heads, `G = HQ / H` (query
//! head `hq` reads KV head `hq / G`), `K`, `V` feature dims, `BS` = `block_size`. Every position,
//! block number and block index counts from its sequence start (varlen: `B = 1`,
//! `cu_seqlens`); block `c` covers positions `c*BS .. min(L, (c+1)*BS) - 1`. Compressed rows of
//! sequence `n` sit at rows `cmp_offsets[n] ..` of the packed `[1, sum TC_n, H, ·]` tensors (or
//! at rows `0 .. TC` of batch row `n` with fixed length).
//!
//! The shared pieces live here: the compressed layout ([`CmpLayout`]), the `partial_block`
//! variants, the `block_counts` forms, parameter checks, and the softmax attention of a query
//! group over a multiset of key ranges (`attend`).

mod attend;
pub mod nsa_compress_kv;
pub mod nsa_compression_attention;
pub mod nsa_fwd;
pub mod nsa_gate_combine;
pub mod nsa_select_blocks;
pub mod nsa_selection_attention;

pub use nsa_compress_kv::{nsa_compress_kv, CompressOut};
pub use nsa_compression_attention::{nsa_compression_attention, EmptyLse, Visibility};
pub use nsa_fwd::{nsa_fwd, window_attention, FwdGates, FwdOut};
pub use nsa_gate_combine::{nsa_gate_combine, sigmoid, GateOut, Gates};
pub use nsa_select_blocks::{nsa_select_blocks, SelectMode, SelectOut};
pub use nsa_selection_attention::nsa_selection_attention;

use crate::error::{Error, Result};
use crate::scalar::Real;
use crate::varlen::{sequences, Seq};
use ndarray::{Array3, Array4, ArrayView3};
use std::str::FromStr;

/// Outputs of the two attention branches: `o` `[B, T, HQ, V]` and `lse` `[B, T, HQ]`
/// (natural-log normalizer, `-inf` for a row without a visible key unless stated otherwise).
#[derive(Debug, Clone)]
pub struct AttnOut<T> {
    pub o: Array4<T>,
    pub lse: Array3<T>,
}

/// How a sequence's trailing partial block is compressed (`conformance/spec/ops-nsa.md` §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PartialBlock {
    /// FLA: `TC_n = ceil(L_n / BS)`; the partial block is divided by its real token count.
    #[default]
    MeanOfValid,
    /// MSLK: `TC_n = floor(L_n / BS)`; the partial block is never emitted.
    Drop,
}

impl PartialBlock {
    /// Compressed rows of a sequence of `len` tokens.
    pub fn rows(self, len: usize, bs: usize) -> usize {
        match self {
            PartialBlock::MeanOfValid => len.div_ceil(bs),
            PartialBlock::Drop => len / bs,
        }
    }
}

impl FromStr for PartialBlock {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "mean_of_valid" => Ok(PartialBlock::MeanOfValid),
            "drop" => Ok(PartialBlock::Drop),
            _ => Err(Error::param(
                "partial_block",
                "\"mean_of_valid\" or \"drop\"",
                s,
            )),
        }
    }
}

/// The number of selected blocks per row: the integer parameter or the `[B, T, H]` tensor.
#[derive(Debug, Clone, Copy)]
pub enum BlockCounts<'a> {
    Int(i64),
    Tensor(ArrayView3<'a, i64>),
}

impl<'a> BlockCounts<'a> {
    /// The form a call gave: at most one of the two (both is an error naming `block_counts`).
    pub fn from_parts(
        int: Option<i64>,
        tensor: Option<ArrayView3<'a, i64>>,
    ) -> Result<Option<Self>> {
        match (int, tensor) {
            (Some(_), Some(_)) => Err(Error::missing(
                "block_counts",
                "either the integer parameter or the tensor input, not both",
                "both",
            )),
            (Some(n), None) => Ok(Some(BlockCounts::Int(n))),
            (None, Some(t)) => Ok(Some(BlockCounts::Tensor(t))),
            (None, None) => Ok(None),
        }
    }

    /// Checks a tensor form against `[B, T, H]` with entries in `0 ..= max` (`None`: no upper
    /// bound); an integer form passes unchecked.
    pub fn check_tensor(&self, bth: [usize; 3], max: Option<i64>) -> Result<()> {
        let BlockCounts::Tensor(t) = self else {
            return Ok(());
        };
        if t.shape() != bth {
            return Err(Error::shape(
                "block_counts",
                format!("[B, T, H] = {bth:?}"),
                t.shape(),
            ));
        }
        if let Some(((b, i, h), &n)) = t
            .indexed_iter()
            .find(|(_, &n)| n < 0 || max.is_some_and(|m| n > m))
        {
            let range = max.map_or("n >= 0".to_string(), |m| format!("0 <= n <= S = {m}"));
            return Err(Error::index(
                "block_counts",
                format!("entries {range}"),
                format!("block_counts[{b}, {i}, {h}] = {n}"),
            ));
        }
        Ok(())
    }
}

/// `block_size` must be a power of two `>= 1`.
pub fn check_block_size(block_size: i64) -> Result<usize> {
    if block_size > 0 && (block_size as u64).is_power_of_two() {
        Ok(block_size as usize)
    } else {
        Err(Error::param(
            "block_size",
            "a power of two >= 1",
            block_size,
        ))
    }
}

/// `scale` (default `K ** -0.5`) must be finite and `> 0`.
pub fn check_scale<T: Real>(scale: Option<f64>, k: usize) -> Result<T> {
    let s = scale.unwrap_or(1.0 / (k as f64).sqrt());
    if s.is_finite() && s > 0.0 {
        Ok(T::c(s))
    } else {
        Err(Error::param("scale", "a finite value > 0", s))
    }
}

/// Group size `G = HQ / H` (`H >= 1`, `HQ % H == 0`); `q_arg` and `kv_arg` name the tensors.
pub fn check_groups(hq: usize, h: usize, q_arg: &str, kv_arg: &str) -> Result<usize> {
    if h == 0 {
        return Err(Error::shape(kv_arg, "H >= 1 key/value heads", h));
    }
    if hq % h != 0 {
        return Err(Error::shape(
            q_arg,
            format!("a number of query heads HQ that is a multiple of H = {h}"),
            hq,
        ));
    }
    Ok(hq / h)
}

/// The sequences of a `[B, T, ...]` batch and where their compressed rows live.
#[derive(Debug, Clone)]
pub struct CmpLayout {
    pub seqs: Vec<Seq>,
    /// `TC_n` of every sequence.
    pub tc: Vec<usize>,
    /// First compressed row of every sequence within its batch row (`cmp_offsets[n]` with
    /// varlen, 0 with fixed length).
    pub base: Vec<usize>,
    /// Extent of dimension 1 of the compressed tensors: `TC`, or `sum_n TC_n` with varlen.
    pub rows: usize,
    pub varlen: bool,
    pub bs: usize,
}

impl CmpLayout {
    /// Validates `cu_seqlens` against `[B, T]` and lays out the compressed rows.
    pub fn new(
        b: usize,
        t: usize,
        cu_seqlens: Option<&[i64]>,
        bs: usize,
        partial: PartialBlock,
    ) -> Result<Self> {
        let seqs = sequences(b, t, cu_seqlens)?;
        let tc: Vec<usize> = seqs.iter().map(|s| partial.rows(s.len(), bs)).collect();
        let varlen = cu_seqlens.is_some();
        let (base, rows) = if varlen {
            let base: Vec<usize> = tc
                .iter()
                .scan(0, |acc, &n| {
                    let start = *acc;
                    *acc += n;
                    Some(start)
                })
                .collect();
            (base, tc.iter().sum())
        } else {
            (vec![0; seqs.len()], partial.rows(t, bs))
        };
        Ok(CmpLayout {
            seqs,
            tc,
            base,
            rows,
            varlen,
            bs,
        })
    }

    /// Index of the sequence holding token `t` of batch row `b`.
    pub fn seq_of(&self, b: usize, t: usize) -> usize {
        if self.varlen {
            self.seqs.partition_point(|s| s.eos <= t)
        } else {
            b
        }
    }

    /// Checks that a compressed tensor `[B', TC', H', ·]` has `B' = B` rows and `TC' = rows`.
    pub fn check_rows(&self, arg: &str, b: usize, shape: &[usize], rule: &str) -> Result<()> {
        if shape[0] != b || shape[1] != self.rows {
            return Err(Error::shape(
                arg,
                format!(
                    "[B, TC, H, ·] with B = {b}, TC = {} ({rule}, block_size {})",
                    self.rows, self.bs
                ),
                shape,
            ));
        }
        Ok(())
    }
}

/// An attention input's feature dim (last extent) must be `>= 1`.
pub fn check_features(arg: &str, shape: &[usize]) -> Result<()> {
    if shape[shape.len() - 1] == 0 {
        return Err(Error::shape(arg, "a feature dim >= 1", shape));
    }
    Ok(())
}
