//! How the packed tokens of a varlen call are cut over `R` ranks (pure host logic, no GPU).
//!
//! The tokens `[0, T)` of `cu_seqlens` (any number of sequences, zero-length ones included) are
//! cut at `R − 1` positions `c_1 ≤ … ≤ c_{R−1}` (`c_0 = 0`, `c_R = T`); rank `r` owns
//! `[c_r, c_{r+1})`. A cut lies on a sequence boundary or, inside a sequence `n`, on one of its
//! chunk boundaries `bos_n + j·BT` (a chunk is never split, so the chunk-local gates and the
//! intra outputs of every chunk stay those of the single-GPU call). The part of a sequence on
//! one rank is a **piece**; a rank's pieces are its local sequences (its local `cu_seqlens`).
//!
//! [`Partition::balanced`] balances by chunks, not tokens (the work of the delta-rule forward is
//! per chunk): the `r`-th cut is the valid cut whose chunk prefix is nearest to `r·C/R`
//! (`C = Σ_n ceil(L_n / BT)`), where a sequence may be cut inside only if it has at least
//! `2·min_piece_chunks` chunks, and then only `min_piece_chunks` chunks or more from either end:
//! short sequences stay whole on one rank. Ranks may be empty (fewer chunks than ranks).
//!
//! A zero-length sequence at position `p` belongs to the last non-empty rank starting at or
//! before `p` (rank 0 when there is none), so every sequence has at least one piece and the
//! pieces of a rank are in global sequence order.

use attn_reference::{Error, Result};

/// Inner-cut margin of [`Partition::balanced`] used by the context-parallel ops: sequences of
/// fewer than 2 × 16 chunks (2048 tokens at `BT = 64`) stay whole.
pub const DEFAULT_MIN_PIECE_CHUNKS: usize = 16;

/// The part of one sequence held by one rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// The global sequence `n`.
    pub seq: usize,
    /// First token, local to the rank's shard.
    pub start: usize,
    /// Tokens.
    pub len: usize,
    /// The piece starts its sequence (`start` is `bos_n`): its initial state is
    /// `initial_state[n]`; otherwise it continues a sequence begun on an earlier rank.
    pub first: bool,
    /// The piece ends its sequence: its exit state is the sequence's final state; otherwise
    /// the sequence goes on on the next non-empty rank.
    pub last: bool,
}

/// The tokens `[start, end)` of one rank and their pieces, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    pub start: usize,
    pub end: usize,
    pub pieces: Vec<Piece>,
}

impl Shard {
    /// Tokens of the shard.
    pub fn tokens(&self) -> usize {
        self.end - self.start
    }

    /// The local `cu_seqlens`: one sequence per piece.
    pub fn cu_seqlens(&self) -> Vec<i64> {
        std::iter::once(0)
            .chain(self.pieces.iter().map(|p| (p.start + p.len) as i64))
            .collect()
    }

    /// Chunks of the shard (`Σ ceil(len / BT)` over its pieces).
    pub fn chunks(&self, bt: usize) -> usize {
        self.pieces.iter().map(|p| p.len.div_ceil(bt)).sum()
    }

    /// The piece that continues a sequence from an earlier rank (always the first piece).
    pub fn continued(&self) -> Option<&Piece> {
        self.pieces.first().filter(|p| !p.first)
    }

    /// The piece whose sequence goes on on a later rank (always the last piece): the one this
    /// rank summarises.
    pub fn continuing(&self) -> Option<&Piece> {
        self.pieces.last().filter(|p| !p.last)
    }
}

/// A cut of the packed tokens over ranks (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    chunk_size: usize,
    cu_seqlens: Vec<i64>,
    shards: Vec<Shard>,
}

/// `cu_seqlens` as validated sequence bounds `(bos, eos)`.
fn bounds(cu_seqlens: &[i64]) -> Result<Vec<(usize, usize)>> {
    if cu_seqlens.len() < 2 || cu_seqlens[0] != 0 {
        return Err(Error::cu_seqlens(
            "at least two entries, the first 0",
            format!("{cu_seqlens:?}"),
        ));
    }
    cu_seqlens
        .windows(2)
        .map(|w| {
            if w[1] < w[0] {
                Err(Error::cu_seqlens(
                    "non-decreasing entries",
                    format!("{cu_seqlens:?}"),
                ))
            } else {
                Ok((w[0] as usize, w[1] as usize))
            }
        })
        .collect()
}

fn check_chunk(chunk_size: usize) -> Result<()> {
    if chunk_size == 0 {
        return Err(Error::param("chunk_size", "a positive chunk size", 0));
    }
    Ok(())
}

impl Partition {
    /// The chunk-balanced cut of `cu_seqlens` over `ranks` ranks (module docs); sequences with
    /// fewer than `2 · min_piece_chunks` chunks stay whole (`min_piece_chunks = 0` counts as 1).
    pub fn balanced(
        cu_seqlens: &[i64],
        chunk_size: usize,
        ranks: usize,
        min_piece_chunks: usize,
    ) -> Result<Partition> {
        check_chunk(chunk_size)?;
        if ranks == 0 {
            return Err(Error::param("ranks", "at least 1 rank", 0));
        }
        let seqs = bounds(cu_seqlens)?;
        let m = min_piece_chunks.max(1);
        let nt: Vec<usize> = seqs
            .iter()
            .map(|&(b, e)| (e - b).div_ceil(chunk_size))
            .collect();
        let mut prefix = vec![0usize];
        for &c in &nt {
            prefix.push(prefix.last().copied().unwrap_or(0) + c);
        }
        let total = *prefix.last().unwrap_or(&0);
        let t = seqs.last().map_or(0, |s| s.1);
        let mut cuts = vec![0usize];
        for r in 1..ranks {
            // target chunk prefix x = r·C/R; distances are compared as |R·chunk − r·C|
            let x = r * total;
            let n = (0..seqs.len())
                .find(|&n| prefix[n + 1] * ranks >= x)
                .unwrap_or(seqs.len().saturating_sub(1));
            let (bos, eos) = seqs.get(n).copied().unwrap_or((0, 0));
            let mut cands = vec![(prefix[n], bos), (prefix[n + 1].min(total), eos)];
            if nt.get(n).is_some_and(|&c| c >= 2 * m) {
                let rel = x.saturating_sub(ranks * prefix[n]);
                let j = ((rel + ranks / 2) / ranks).clamp(m, nt[n] - m);
                cands.push((prefix[n] + j, bos + j * chunk_size));
            }
            let dist = |c: usize| (c * ranks).abs_diff(x);
            let best = cands
                .into_iter()
                .min_by_key(|&(c, tok)| (dist(c), tok))
                .map_or(t, |(_, tok)| tok);
            let prev = *cuts.last().unwrap_or(&0);
            cuts.push(best.max(prev));
        }
        cuts.push(t);
        Ok(Self::build(&seqs, cu_seqlens, chunk_size, &cuts))
    }

    /// The partition at explicit cuts `[0, c_1, …, c_{R−1}, T]` (`R + 1` entries,
    /// non-decreasing, each inner cut a sequence boundary or a chunk boundary of the sequence it
    /// falls in): an error naming `cuts` otherwise.
    pub fn from_cuts(cu_seqlens: &[i64], chunk_size: usize, cuts: &[i64]) -> Result<Partition> {
        check_chunk(chunk_size)?;
        let seqs = bounds(cu_seqlens)?;
        let t = seqs.last().map_or(0, |s| s.1) as i64;
        let bad = |why: &str| Err(Error::param("cuts", why.to_string(), format!("{cuts:?}")));
        if cuts.len() < 2 || cuts[0] != 0 || cuts[cuts.len() - 1] != t {
            return bad(&format!(
                "at least 2 entries from 0 to the token count {t} (one shard per rank)"
            ));
        }
        if cuts.windows(2).any(|w| w[1] < w[0]) {
            return bad("non-decreasing cuts");
        }
        for &c in &cuts[1..cuts.len() - 1] {
            let c = c as usize;
            let inside = seqs.iter().find(|&&(b, e)| b < c && c < e);
            if let Some(&(b, _)) = inside {
                if (c - b) % chunk_size != 0 {
                    return bad(&format!(
                        "cuts on chunk boundaries of chunk_size {chunk_size} (a sequence starting at {b} is cut at {c})"
                    ));
                }
            }
        }
        let cuts: Vec<usize> = cuts.iter().map(|&c| c as usize).collect();
        Ok(Self::build(&seqs, cu_seqlens, chunk_size, &cuts))
    }

    fn build(
        seqs: &[(usize, usize)],
        cu_seqlens: &[i64],
        chunk_size: usize,
        cuts: &[usize],
    ) -> Partition {
        let ranks = cuts.len() - 1;
        // owner of a zero-length sequence at p: the last non-empty rank starting at or before p
        let owner = |p: usize| {
            (0..ranks)
                .rev()
                .find(|&r| cuts[r] < cuts[r + 1] && cuts[r] <= p)
                .unwrap_or(0)
        };
        let mut shards: Vec<Shard> = (0..ranks)
            .map(|r| Shard {
                start: cuts[r],
                end: cuts[r + 1],
                pieces: Vec::new(),
            })
            .collect();
        for (n, &(bos, eos)) in seqs.iter().enumerate() {
            if bos == eos {
                let r = owner(bos);
                let s = &mut shards[r];
                s.pieces.push(Piece {
                    seq: n,
                    start: bos.saturating_sub(s.start).min(s.tokens()),
                    len: 0,
                    first: true,
                    last: true,
                });
                continue;
            }
            for s in shards.iter_mut() {
                let (lo, hi) = (bos.max(s.start), eos.min(s.end));
                if lo < hi {
                    s.pieces.push(Piece {
                        seq: n,
                        start: lo - s.start,
                        len: hi - lo,
                        first: lo == bos,
                        last: hi == eos,
                    });
                }
            }
        }
        Partition {
            chunk_size,
            cu_seqlens: cu_seqlens.to_vec(),
            shards,
        }
    }

    /// Ranks `R`.
    pub fn ranks(&self) -> usize {
        self.shards.len()
    }

    pub fn chunk_size(&self) -> usize {
        self.chunk_size
    }

    /// The global `cu_seqlens`.
    pub fn cu_seqlens(&self) -> &[i64] {
        &self.cu_seqlens
    }

    /// Sequences `N`.
    pub fn sequences(&self) -> usize {
        self.cu_seqlens.len() - 1
    }

    /// Total tokens `T`.
    pub fn tokens(&self) -> usize {
        *self.cu_seqlens.last().unwrap_or(&0) as usize
    }

    pub fn shards(&self) -> &[Shard] {
        &self.shards
    }

    pub fn shard(&self, rank: usize) -> &Shard {
        &self.shards[rank]
    }

    /// The cuts `[0, c_1, …, T]`.
    pub fn cuts(&self) -> Vec<usize> {
        std::iter::once(0)
            .chain(self.shards.iter().map(|s| s.end))
            .collect()
    }

    /// The ranks whose summaries, chained in this order from `initial_state[n]`, give the state
    /// entering `rank`'s continued first piece (of sequence `n`): every earlier rank holding a
    /// piece of `n`. Empty when the rank's first piece starts its sequence.
    pub fn chain(&self, rank: usize) -> Vec<usize> {
        match self.shards[rank].continued() {
            Some(p) => (0..rank)
                .filter(|&q| self.shards[q].continuing().is_some_and(|c| c.seq == p.seq))
                .collect(),
            None => Vec::new(),
        }
    }

    /// Where each sequence's final state lies: `(rank, local piece)` of its last piece.
    pub fn final_pieces(&self) -> Vec<(usize, usize)> {
        let mut at = vec![(0, 0); self.sequences()];
        for (r, s) in self.shards.iter().enumerate() {
            for (i, p) in s.pieces.iter().enumerate() {
                if p.last {
                    at[p.seq] = (r, i);
                }
            }
        }
        at
    }

    /// Where each sequence's initial state is needed: for each rank, the global sequence of
    /// each local piece (the row of `initial_state` its local initial state is taken from).
    pub fn piece_sequences(&self, rank: usize) -> Vec<usize> {
        self.shards[rank].pieces.iter().map(|p| p.seq).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn seqs_of(p: &Partition) -> Vec<Vec<(usize, usize, usize)>> {
        p.shards()
            .iter()
            .map(|s| s.pieces.iter().map(|q| (q.seq, q.start, q.len)).collect())
            .collect()
    }

    #[test]
    fn one_long_sequence_is_cut_into_equal_chunk_counts() {
        let p = Partition::balanced(&[0, 64 * 100], 64, 4, 1).unwrap();
        assert_eq!(p.cuts(), vec![0, 1600, 3200, 4800, 6400]);
        assert!(p.shard(0).pieces[0].first && !p.shard(0).pieces[0].last);
        assert!(!p.shard(3).pieces[0].first && p.shard(3).pieces[0].last);
        assert_eq!(p.chain(3), vec![0, 1, 2]);
        assert_eq!(p.chain(0), Vec::<usize>::new());
        assert_eq!(p.final_pieces(), vec![(3, 0)]);
    }

    #[test]
    fn balances_chunks_not_tokens() {
        // 10 one-token sequences (10 chunks) then one of 10 full chunks: 2 ranks get 10 each
        let mut cu: Vec<i64> = (0..=10).collect();
        cu.push(10 + 640);
        let p = Partition::balanced(&cu, 64, 2, 1).unwrap();
        assert_eq!(p.cuts(), vec![0, 10, 650]);
        assert_eq!(p.shard(0).chunks(64), 10);
        assert_eq!(p.shard(1).chunks(64), 10);
    }

    #[test]
    fn short_sequences_stay_whole() {
        // three sequences of 5 chunks, margin 3: none may be cut (5 < 6)
        let cu = [0, 320, 640, 960];
        let p = Partition::balanced(&cu, 64, 2, 3).unwrap();
        for s in p.shards() {
            assert!(
                s.pieces.iter().all(|q| q.first && q.last),
                "{:?}",
                seqs_of(&p)
            );
        }
        // with margin 1 the middle one is cut at its chunk boundary nearest 7.5 chunks (8: half up)
        let p = Partition::balanced(&cu, 64, 2, 1).unwrap();
        assert_eq!(p.cuts(), vec![0, 512, 960]);
    }

    #[test]
    fn fewer_chunks_than_ranks_leaves_ranks_empty() {
        let p = Partition::balanced(&[0, 100], 64, 4, 1).unwrap();
        let non_empty: Vec<usize> = p.shards().iter().map(Shard::tokens).collect();
        assert_eq!(non_empty.iter().sum::<usize>(), 100);
        assert!(non_empty.contains(&0));
        assert!(p.shards().iter().all(|s| s.pieces.len() <= 1));
    }

    #[test]
    fn zero_length_sequences_have_one_owner() {
        let cu = [0, 0, 128, 128, 256, 256];
        let p = Partition::balanced(&cu, 64, 2, 1).unwrap();
        assert_eq!(p.cuts(), vec![0, 128, 256]);
        assert_eq!(
            seqs_of(&p),
            vec![
                vec![(0, 0, 0), (1, 0, 128)],
                vec![(2, 0, 0), (3, 0, 128), (4, 128, 0)]
            ]
        );
        let p = Partition::balanced(&[0, 0, 0], 64, 3, 1).unwrap();
        assert_eq!(seqs_of(&p)[0], vec![(0, 0, 0), (1, 0, 0)]);
    }

    #[test]
    fn explicit_cuts_are_checked() {
        let cu = [0, 100, 300];
        assert!(Partition::from_cuts(&cu, 64, &[0, 100, 300]).is_ok());
        assert!(Partition::from_cuts(&cu, 64, &[0, 164, 300]).is_ok());
        for bad in [
            &[0, 150, 300][..],
            &[0, 300, 100, 300],
            &[0, 100, 299],
            &[1, 300],
            &[0],
        ] {
            let e = Partition::from_cuts(&cu, 64, bad).unwrap_err();
            assert!(e.to_string().contains("cuts"), "{e}");
        }
        let e = Partition::balanced(&cu, 64, 0, 1).unwrap_err();
        assert!(e.to_string().contains("ranks"), "{e}");
        let e = Partition::balanced(&[0, 5, 3], 64, 2, 1).unwrap_err();
        assert!(e.to_string().contains("cu_seqlens"), "{e}");
    }

    fn cu_strategy() -> impl Strategy<Value = Vec<i64>> {
        prop::collection::vec(prop_oneof![Just(0usize), 1usize..70, 60usize..3000], 1..12).prop_map(
            |lens| {
                let mut cu = vec![0i64];
                for l in lens {
                    cu.push(cu.last().unwrap() + l as i64);
                }
                cu
            },
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        /// Every token once, in order; every inner cut chunk-aligned in its sequence; short
        /// sequences whole; flags, chains and final pieces consistent; each cut within half the
        /// largest gap between valid cuts of its chunk target.
        #[test]
        fn partition_invariants(
            cu in cu_strategy(),
            bt in prop::sample::select(vec![16usize, 32, 64]),
            ranks in 1usize..6,
            m in 1usize..8,
        ) {
            let p = Partition::balanced(&cu, bt, ranks, m).unwrap();
            prop_assert_eq!(p.ranks(), ranks);
            let seqs = bounds(&cu).unwrap();
            let nt: Vec<usize> = seqs.iter().map(|&(b, e)| (e - b).div_ceil(bt)).collect();
            let mut pieces_of = vec![Vec::new(); seqs.len()];
            let mut next = 0;
            for (r, s) in p.shards().iter().enumerate() {
                prop_assert_eq!(s.start, next);
                next = s.end;
                let mut at = 0;
                for (i, q) in s.pieces.iter().enumerate() {
                    prop_assert_eq!(q.start, at);
                    at += q.len;
                    prop_assert!(q.first || i == 0);
                    prop_assert!(q.last || i + 1 == s.pieces.len());
                    pieces_of[q.seq].push((r, s.start + q.start, q.len, q.first, q.last));
                }
                prop_assert_eq!(at, s.tokens());
                prop_assert_eq!(s.cu_seqlens().len(), s.pieces.len() + 1);
            }
            prop_assert_eq!(next, p.tokens());
            for (n, ps) in pieces_of.iter().enumerate() {
                let (bos, eos) = seqs[n];
                prop_assert!(!ps.is_empty());
                prop_assert!(ps[0].3 && ps[ps.len() - 1].4);
                let mut at = bos;
                for &(_, start, len, _, _) in ps {
                    prop_assert_eq!(start, at);
                    prop_assert_eq!((start - bos) % bt, 0);
                    at += len;
                }
                prop_assert_eq!(at, eos);
                if nt[n] < 2 * m {
                    prop_assert_eq!(ps.len(), 1, "sequence {} of {} chunks was cut", n, nt[n]);
                } else {
                    for &(_, start, len, first, last) in ps {
                        prop_assert!(first || (start - bos) / bt >= m);
                        prop_assert!(last || (start + len - bos) / bt <= nt[n] - m);
                    }
                }
                let (fr, fi) = p.final_pieces()[n];
                prop_assert_eq!(p.shard(fr).pieces[fi].seq, n);
                prop_assert!(p.shard(fr).pieces[fi].last);
                for (j, &(r, ..)) in ps.iter().enumerate().skip(1) {
                    let before: Vec<usize> = ps[..j].iter().map(|x| x.0).collect();
                    prop_assert_eq!(p.chain(r), before);
                }
            }
            // balance: the nearest valid cut is within half the widest gap between valid cuts
            let total: usize = nt.iter().sum();
            let gap = nt.iter().map(|&c| if c >= 2 * m { m } else { c }).max().unwrap_or(0).max(1);
            let mut prefix = 0;
            let mut cut_chunks = vec![0];
            for s in p.shards() {
                prefix += s.chunks(bt);
                cut_chunks.push(prefix);
            }
            for (r, &c) in cut_chunks.iter().enumerate().take(ranks).skip(1) {
                let err = (c * ranks).abs_diff(r * total) as f64 / ranks as f64;
                prop_assert!(err <= gap as f64 / 2.0 + 1.0, "cut {} at {} chunks, target {}", r, c, (r * total) as f64 / ranks as f64);
            }
        }
    }
}
