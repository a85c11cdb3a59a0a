//! Sequences and chunks of the packed (varlen) layout.
//!
//! Without `cu_seqlens`, sequence `n` is batch row `n` (`T` tokens each). With it, `B == 1` and
//! sequence `n` is tokens `cu_seqlens[n] .. cu_seqlens[n+1]`. Chunks of `BT` tokens restart at
//! every sequence start; `chunk_indices` lists `(n, c)` for every chunk in packed order and
//! `chunk_offsets[n]` counts the chunks before sequence `n`.

use crate::error::{Error, ErrorKind, Result};

/// One sequence of a batch: batch row `batch`, tokens `bos .. eos` of that row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seq {
    /// Sequence index `n` (`0 .. N`).
    pub n: usize,
    /// Batch row holding it (always 0 with `cu_seqlens`).
    pub batch: usize,
    /// First token (inclusive) within the batch row.
    pub bos: usize,
    /// Last token (exclusive) within the batch row.
    pub eos: usize,
}

impl Seq {
    /// `eos − bos` (0 for a malformed `eos < bos`).
    pub fn len(&self) -> usize {
        self.eos.saturating_sub(self.bos)
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Number of chunks of `bt` tokens: `ceil(len / bt)` (`bt = 0` counts as 1, as in
    /// [`Seq::chunks`]).
    pub fn num_chunks(&self, bt: usize) -> usize {
        self.len().div_ceil(bt.max(1))
    }
    /// Token ranges `[start, end)` (within the batch row) of its chunks, the last one partial
    /// (`bt = 0` counts as 1).
    pub fn chunks(&self, bt: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
        (self.bos..self.eos)
            .step_by(bt.max(1))
            .map(move |s| (s, (s + bt).min(self.eos)))
    }
}

/// Check `cu_seqlens` against the spec: 1-D of length `N + 1 >= 2`, starts at 0,
/// non-decreasing, ends at `T`, and only with `B == 1`.
pub fn validate_cu_seqlens(cu: &[i64], b: usize, t: usize) -> Result<()> {
    if b != 1 {
        return Err(Error::new(
            ErrorKind::Shape,
            "cu_seqlens",
            "batch size B == 1 when cu_seqlens is given",
            format!("B = {b}"),
        ));
    }
    if cu.len() < 2 {
        return Err(Error::cu_seqlens(
            "length N + 1 >= 2",
            format!("length {}", cu.len()),
        ));
    }
    if cu[0] != 0 {
        return Err(Error::cu_seqlens(
            "cu_seqlens[0] == 0",
            format!("cu_seqlens[0] = {}", cu[0]),
        ));
    }
    if let Some(i) = (1..cu.len()).find(|&i| cu[i] < cu[i - 1]) {
        return Err(Error::cu_seqlens(
            "non-decreasing values",
            format!(
                "cu_seqlens[{}] = {} < cu_seqlens[{}] = {}",
                i,
                cu[i],
                i - 1,
                cu[i - 1]
            ),
        ));
    }
    let last = cu[cu.len() - 1];
    if last != t as i64 {
        return Err(Error::cu_seqlens(
            format!("last value == T = {t}"),
            format!("cu_seqlens[{}] = {last}", cu.len() - 1),
        ));
    }
    Ok(())
}

/// The sequences of a `[B, T, ...]` tensor, validating `cu_seqlens` when given.
pub fn sequences(b: usize, t: usize, cu_seqlens: Option<&[i64]>) -> Result<Vec<Seq>> {
    match cu_seqlens {
        None => Ok((0..b)
            .map(|n| Seq {
                n,
                batch: n,
                bos: 0,
                eos: t,
            })
            .collect()),
        Some(cu) => {
            validate_cu_seqlens(cu, b, t)?;
            Ok(cu
                .windows(2)
                .enumerate()
                .map(|(n, w)| Seq {
                    n,
                    batch: 0,
                    bos: w[0] as usize,
                    eos: w[1] as usize,
                })
                .collect())
        }
    }
}

/// `chunk_size` must be a power of two (and, when `allowed` is given, one of those values).
pub fn check_chunk_size(chunk_size: i64, allowed: Option<&[usize]>) -> Result<usize> {
    let ok_pow2 = chunk_size > 0 && (chunk_size as u64).is_power_of_two();
    let ok_set = allowed.is_none_or(|a| a.iter().any(|&v| v as i64 == chunk_size));
    if ok_pow2 && ok_set {
        Ok(chunk_size as usize)
    } else {
        let expected = match allowed {
            Some(a) => format!("one of {a:?}"),
            None => "a power of two".to_string(),
        };
        Err(Error::param("chunk_size", expected, chunk_size))
    }
}

/// Rows `(n, c)` for every sequence `n` and each of its chunks `c`, in packed order.
pub fn chunk_indices(seqs: &[Seq], bt: usize) -> Vec<(usize, usize)> {
    seqs.iter()
        .flat_map(|s| (0..s.num_chunks(bt)).map(move |c| (s.n, c)))
        .collect()
}

/// `chunk_offsets[n]` = number of chunks before sequence `n`; length `N + 1`.
pub fn chunk_offsets(seqs: &[Seq], bt: usize) -> Vec<usize> {
    let mut out = Vec::with_capacity(seqs.len() + 1);
    let mut acc = 0;
    out.push(0);
    for s in seqs {
        acc += s.num_chunks(bt);
        out.push(acc);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_restart_at_sequence_starts() {
        let seqs = sequences(1, 10, Some(&[0, 3, 3, 10])).unwrap();
        assert_eq!(chunk_indices(&seqs, 4), vec![(0, 0), (2, 0), (2, 1)]);
        assert_eq!(chunk_offsets(&seqs, 4), vec![0, 1, 1, 3]);
        let ranges: Vec<_> = seqs[2].chunks(4).collect();
        assert_eq!(ranges, vec![(3, 7), (7, 10)]);
    }

    #[test]
    fn bad_cu_seqlens_name_the_argument() {
        for (cu, b, t) in [
            (&[0, 5][..], 2, 5),
            (&[0][..], 1, 0),
            (&[1, 5][..], 1, 5),
            (&[0, 4, 3, 5][..], 1, 5),
            (&[0, 4][..], 1, 5),
        ] {
            let e = sequences(b, t, Some(cu)).unwrap_err();
            assert_eq!(e.arg, "cu_seqlens", "{e}");
        }
    }
}
