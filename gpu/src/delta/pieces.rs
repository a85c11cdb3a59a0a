//! The piece tables of a split (`conformance/spec/ops-delta-rule.md` §5.2, §5.9), shared by the
//! split's launches ([`super::split`]) and the truncation policy ([`super::truncation`]): which
//! re-run row runs which piece, which pre-scan row summarises it, the chunk rows, and explicit
//! warm-ups. Pure host code (unit- and property-tested without a GPU); the numbering is
//! fwd_h_split.cu's.

use attn_reference::delta::{subseq_offsets, validate_warmup_chunks, Geometry, SplitPlan};

/// The host tables of a split (see fwd_h_split.cu for the numbering): `pre` `[Q, 3]` and `run`
/// `[S, 3]` rows of (first token row of the flattened `B · T`, length, first `h` row), `merge`
/// `[N, 2]` rows of (pieces, first summary row); for warm-ups and the truncation policy, per
/// re-run row the piece it runs (`piece_of`, in `subseq_cu_seqlens` order) and its first chunk
/// in its sequence (`c0`), the `[C, 2]` chunk table (first token row, tokens; 0 tokens for the
/// unused `h` rows of a padded batch row), and the explicit warm-ups (`fixed` `[S]`, clamped to
/// `c0`; `skip` `[Q]`: `-1` for a summary the merge never reads).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Tables {
    pub pre: Vec<i64>,
    pub merge: Vec<i64>,
    pub run: Vec<i64>,
    pub piece_of: Vec<usize>,
    pub c0: Vec<i64>,
    pub chunks: Vec<i64>,
    pub fixed: Vec<i64>,
    pub skip: Vec<i64>,
}

impl Tables {
    /// Validates `pieces` against the sequences of `geo`
    /// (`conformance/spec/ops-delta-rule.md` §5.2) and `warmup_chunks` (§5.9: named
    /// `warmup_chunks`, as the reference's `validate_warmup_chunks`) and numbers them; `None` when
    /// no sequence is cut (the serial kernel is then the same computation).
    pub(crate) fn new(
        geo: &Geometry,
        varlen: bool,
        pieces: &[i64],
        warmup_chunks: Option<&[i64]>,
    ) -> attn_reference::Result<Option<Tables>> {
        let bounds: Vec<(usize, usize)> = geo
            .seqs
            .iter()
            .map(|s| (s.batch * geo.t + s.bos, s.batch * geo.t + s.eos))
            .collect();
        let offs = subseq_offsets(pieces, &bounds, geo.bt)?;
        let mut plan = SplitPlan {
            geometry: geo.clone(),
            subseq_cu_seqlens: pieces.to_vec(),
            subseq_offsets: offs.clone(),
            warmup_chunks: vec![0; pieces.len() - 1],
        };
        validate_warmup_chunks(&mut plan, true, warmup_chunks)?;
        let n = geo.n();
        if pieces.len() - 1 == n {
            return Ok(None);
        }
        let nt = geo.nt(varlen);
        let starts = geo.chunk_starts(varlen);
        // (first token row, length, first h row) of piece j of sequence `seq`
        let row = |seq: usize, j: usize| {
            let sq = &geo.seqs[seq];
            let (a, e) = (pieces[j] as usize, pieces[j + 1] as usize);
            let hbase = sq.batch * nt + starts[sq.n] + (a - bounds[seq].0) / geo.bt;
            [a as i64, (e - a) as i64, hbase as i64]
        };
        let first_chunk =
            |seq: usize, j: usize| ((pieces[j] as usize - bounds[seq].0) / geo.bt) as i64;
        let mut run = Vec::with_capacity(n * 3);
        let mut pre = Vec::new();
        let mut merge = Vec::with_capacity(n * 2);
        let (mut piece_of, mut c0) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let (mut pre_piece, mut pre_c0) = (Vec::new(), Vec::new());
        for seq in 0..n {
            let (j0, j1) = (offs[seq] as usize, offs[seq + 1] as usize);
            merge.extend([(j1 - j0) as i64, (pre.len() / 3) as i64]);
            for j in j0..j1 - 1 {
                pre.extend(row(seq, j));
                pre_piece.push(j);
                pre_c0.push(first_chunk(seq, j));
            }
            run.extend(row(seq, j1 - 1));
            piece_of.push(j1 - 1);
            c0.push(first_chunk(seq, j1 - 1));
        }
        run.extend(&pre);
        piece_of.extend(pre_piece);
        c0.extend(pre_c0);
        let fixed: Vec<i64> = piece_of
            .iter()
            .zip(&c0)
            .map(|(&j, &c)| plan.warmup_chunks[j].min(c))
            .collect();
        // a summary is read iff a later piece of its sequence is exact
        let mut skip = Vec::with_capacity(pre.len() / 3);
        for seq in 0..n {
            let (m, q0) = (merge[2 * seq] as usize, merge[2 * seq + 1] as usize);
            let row_of = |i: usize| if i == m - 1 { seq } else { n + q0 + i };
            let last = (1..m).filter(|&i| fixed[row_of(i)] == 0).max().unwrap_or(0);
            skip.extend((0..m - 1).map(|i| if i < last { 0 } else { -1 }));
        }
        let mut chunks = vec![0i64; 2 * geo.b * nt];
        for sq in &geo.seqs {
            let (bos, eos) = (sq.batch * geo.t + sq.bos, sq.batch * geo.t + sq.eos);
            let h0 = sq.batch * nt + starts[sq.n];
            for (c, a) in (bos..eos).step_by(geo.bt).enumerate() {
                chunks[2 * (h0 + c)] = a as i64;
                chunks[2 * (h0 + c) + 1] = (eos - a).min(geo.bt) as i64;
            }
        }
        Ok(Some(Tables {
            pre,
            merge,
            run,
            piece_of,
            c0,
            chunks,
            fixed,
            skip,
        }))
    }

    /// The chunks of every row of a `[rows, 3]` table.
    pub(crate) fn chunks(rows: &[i64], bt: usize) -> Vec<usize> {
        rows.chunks(3)
            .map(|r| (r[1] as usize).div_ceil(bt))
            .collect()
    }

    /// The pre-scan rows with the last sequence's last piece appended (its re-run row, row
    /// `N − 1`), and where the last sequence's summaries then lie: its first row and its
    /// pieces, every piece of it in order. The last sequence's other summaries are the table's
    /// last rows, so the appended row continues them. `None` where the split leaves the last
    /// sequence whole: its one summary would be a serial chain over all of it.
    pub(crate) fn with_exit_row(&self) -> Option<(Vec<i64>, usize, usize)> {
        let n = self.merge.len() / 2;
        let last = &self.merge[2 * (n - 1)..2 * n];
        if last[0] < 2 {
            return None;
        }
        let pre = self.pre.iter().chain(&self.run[(n - 1) * 3..n * 3]);
        Some((pre.copied().collect(), last[1] as usize, last[0] as usize))
    }

    /// Per-row values (`[S]`, re-run order) in `subseq_cu_seqlens` piece order.
    pub(crate) fn warmup_in_piece_order(&self, rows: &[i64]) -> Vec<i64> {
        let mut out = vec![0; rows.len()];
        for (r, &j) in self.piece_of.iter().enumerate() {
            out[j] = rows[r];
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use attn_reference::delta::{validate_chunk_gated_delta_rule_fwd_h, FwdHParams, FwdHShapes};
    use proptest::prelude::*;

    /// The geometry of `lens` (varlen) or of `B = lens.len()` rows of `lens[0]` tokens.
    fn geometry(lens: &[usize], varlen: bool, bt: usize) -> Geometry {
        let (b, t) = if varlen {
            (1, lens.iter().sum())
        } else {
            (lens.len(), lens[0])
        };
        let cu: Vec<i64> = std::iter::once(0)
            .chain(lens.iter().scan(0i64, |a, &l| {
                *a += l as i64;
                Some(*a)
            }))
            .collect();
        let (k, u) = ([b, t, 1, 4], [b, t, 1, 4]);
        let shapes = FwdHShapes {
            k: &k,
            w: &k,
            u: &u,
            ..FwdHShapes::default()
        };
        let p = FwdHParams {
            chunk_size: bt as i64,
            ..FwdHParams::default()
        };
        validate_chunk_gated_delta_rule_fwd_h(&shapes, varlen.then_some(cu.as_slice()), &p).unwrap()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        /// For random layouts and random valid splits: the re-run rows partition the tokens
        /// and the `h` rows exactly once, rows `0 .. N` are the sequences' last pieces, the
        /// pre-scan rows are the re-run rows `N ..` in order, and the merge table counts each
        /// sequence's pieces with running summary offsets.
        #[test]
        fn piece_tables_cover_every_chunk_once(
            lens in proptest::collection::vec(0usize..300, 1..6),
            cuts in proptest::collection::vec(0usize..8, 6),
            bi in 0usize..3,
            varlen in any::<bool>(),
        ) {
            let bt = [16, 32, 64][bi];
            let lens = if varlen { lens } else { vec![lens[0]; lens.len()] };
            let geo = geometry(&lens, varlen, bt);
            // cut sequence n after every cuts[n]-th chunk
            let mut pieces = vec![0i64];
            let mut bos = 0usize;
            for (i, &l) in lens.iter().enumerate() {
                let step = cuts[i % cuts.len()];
                if step > 0 {
                    let mut at = bos + step * bt;
                    while at < bos + l {
                        pieces.push(at as i64);
                        at += step * bt;
                    }
                }
                bos += l;
                pieces.push(bos as i64);
            }
            let n = lens.len();
            match Tables::new(&geo, varlen, &pieces, None).unwrap() {
                None => prop_assert_eq!(pieces.len() - 1, n),
                Some(t) => {
                    let s = pieces.len() - 1;
                    prop_assert_eq!(t.run.len(), 3 * s);
                    prop_assert_eq!(&t.run[3 * n..], &t.pre[..]);
                    let total: usize = lens.iter().sum();
                    let nt = geo.nt(varlen);
                    let h_rows = geo.b * nt;
                    let (mut tok, mut h) = (vec![0u8; total], vec![0u8; h_rows]);
                    for r in t.run.chunks(3) {
                        let (a, l, hb) = (r[0] as usize, r[1] as usize, r[2] as usize);
                        tok[a..a + l].iter_mut().for_each(|x| *x += 1);
                        for c in 0..l.div_ceil(bt) {
                            h[hb + c] += 1;
                        }
                    }
                    prop_assert!(tok.iter().all(|&x| x == 1));
                    // every h row that exists (partial batch rows have unused tail rows)
                    let used: usize = lens.iter().map(|l| l.div_ceil(bt)).sum();
                    prop_assert_eq!(h.iter().filter(|&&x| x == 1).count(), used);
                    prop_assert!(h.iter().all(|&x| x <= 1));
                    let mut q = 0i64;
                    let mut end = 0usize;
                    for (i, &l) in lens.iter().enumerate() {
                        end += l;
                        let r = &t.run[3 * i..3 * i + 3];
                        prop_assert_eq!((r[0] + r[1]) as usize, end);
                        let m = t.merge[2 * i];
                        prop_assert_eq!(t.merge[2 * i + 1], q);
                        q += m - 1;
                    }
                    prop_assert_eq!(q as usize, t.pre.len() / 3);
                    // with the exit row, the last sequence's pieces are consecutive summary
                    // rows, in order, covering its tokens; none where it is one piece
                    match t.with_exit_row() {
                        None => prop_assert!(t.merge[2 * n - 2] == 1),
                        Some((pre, first, m)) => {
                            prop_assert!(m >= 2);
                            prop_assert_eq!(pre.len() / 3, first + m);
                            let mut at = total - lens[n - 1];
                            for r in pre[3 * first..].chunks(3) {
                                prop_assert_eq!(r[0] as usize, at);
                                at += r[1] as usize;
                            }
                            prop_assert_eq!(at, total);
                        }
                    }
                }
            }
        }

        /// With random warm-ups: `fixed` is each piece's count clamped to its first chunk, in
        /// re-run order; a summary is skipped exactly when no later piece of its sequence is
        /// exact; the chunk table lists every chunk's tokens at its `h` row.
        #[test]
        fn warmup_tables_clamp_and_skip(
            lens in proptest::collection::vec(0usize..400, 1..5),
            step in 1usize..4,
            warm in proptest::collection::vec(0i64..6, 64),
            varlen in any::<bool>(),
        ) {
            let bt = 16;
            let lens = if varlen { lens } else { vec![lens[0]; lens.len()] };
            let geo = geometry(&lens, varlen, bt);
            let mut pieces = vec![0i64];
            let mut bos = 0usize;
            let mut firsts = Vec::new();
            for &l in &lens {
                firsts.push(pieces.len() - 1);
                let mut at = bos + step * bt;
                while at < bos + l {
                    pieces.push(at as i64);
                    at += step * bt;
                }
                bos += l;
                pieces.push(bos as i64);
            }
            let s = pieces.len() - 1;
            let w: Vec<i64> = (0..s).map(|j| if firsts.contains(&j) { 0 } else { warm[j % 64] }).collect();
            let Some(t) = Tables::new(&geo, varlen, &pieces, Some(&w)).unwrap() else {
                return Ok(());
            };
            let n = lens.len();
            for (r, &j) in t.piece_of.iter().enumerate() {
                prop_assert_eq!(t.fixed[r], w[j].min(t.c0[r]));
                prop_assert_eq!(t.c0[r] == 0, firsts.contains(&j));
            }
            let in_order = t.warmup_in_piece_order(&t.fixed);
            for (r, &j) in t.piece_of.iter().enumerate() {
                prop_assert_eq!(in_order[j], t.fixed[r]);
            }
            for seq in 0..n {
                let (m, q0) = (t.merge[2 * seq] as usize, t.merge[2 * seq + 1] as usize);
                let row = |i: usize| if i == m - 1 { seq } else { n + q0 + i };
                for i in 0..m - 1 {
                    let read = (i + 1..m).any(|k| t.fixed[row(k)] == 0);
                    prop_assert_eq!(t.skip[q0 + i], if read { 0 } else { -1 });
                }
            }
            let total: i64 = t.chunks.chunks(2).map(|c| c[1]).sum();
            prop_assert_eq!(total as usize, lens.iter().sum::<usize>());
            for r in t.run.chunks(3) {
                let (a, hb) = (r[0], r[2] as usize);
                if r[1] > 0 {
                    prop_assert_eq!(t.chunks[2 * hb], a);
                }
            }
        }
    }
}
