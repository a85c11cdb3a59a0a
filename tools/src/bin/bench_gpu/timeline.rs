//! `--decode-timeline DIR`: where the time of one `decode_attention` launch goes, block by block
//! (the kernels built with `-DDECODE_TIMELINE`, [`attn_gpu::decode::timeline`]). Writes
//! `DIR/<row>.csv` (block, sm, start_ns, end_ns, relative to the first start) and returns a
//! summary: with `t0` the first start and `t1` the last end (`span = t1 − t0`),
//! - busy = Σ over multiprocessors of the union of their blocks' intervals / (SMs · span): the
//!   share of multiprocessor time with at least one block resident;
//! - ramp = the latest first start over the multiprocessors − `t0` (all of them have work);
//! - tail = `t1` − the earliest last end over the multiprocessors (the first one idle for good);
//! - resident blocks a multiprocessor at 10 evenly spaced instants (waves show as steps).

use attn_gpu::decode::timeline::{BlockSpan, BLOCKS};
use std::fmt::Write as _;
use std::path::Path;

/// Writes the CSV of `row` into `dir` and returns the summary lines.
pub fn report(dir: &Path, row: &str, spans: &[BlockSpan], sms: usize) -> std::io::Result<String> {
    let Some(t0) = spans.iter().map(|s| s.start_ns).min() else {
        return Ok(format!("{row}: no block recorded\n"));
    };
    let t1 = spans.iter().map(|s| s.end_ns).max().unwrap_or(t0);
    let span = (t1 - t0).max(1) as f64;
    let mut csv = String::from("block,sm,start_ns,end_ns\n");
    for s in spans {
        let _ = writeln!(
            csv,
            "{},{},{},{}",
            s.block,
            s.sm,
            s.start_ns - t0,
            s.end_ns - t0
        );
    }
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join(format!("{row}.csv")), csv)?;
    let mut per_sm: Vec<Vec<(u64, u64)>> = vec![Vec::new(); sms.max(1)];
    for s in spans {
        if let Some(v) = per_sm.get_mut(s.sm as usize) {
            v.push((s.start_ns, s.end_ns));
        }
    }
    let (mut busy, mut first_max, mut last_min, mut used) = (0u64, t0, t1, 0usize);
    for v in per_sm.iter_mut().filter(|v| !v.is_empty()) {
        used += 1;
        v.sort_unstable();
        let (mut a, mut b) = v[0];
        for &(s, e) in &v[1..] {
            if s > b {
                busy += b - a;
                (a, b) = (s, e);
            } else {
                b = b.max(e);
            }
        }
        busy += b - a;
        first_max = first_max.max(v[0].0);
        last_min = last_min.min(v.iter().map(|x| x.1).max().unwrap_or(t1));
    }
    let mut durs: Vec<u64> = spans.iter().map(|s| s.end_ns - s.start_ns).collect();
    durs.sort_unstable();
    let short = durs.iter().filter(|&&d| d < 2000).count();
    let resident: Vec<String> = (0..10)
        .map(|i| {
            let t = t0 + ((i as f64 + 0.5) / 10.0 * span) as u64;
            let n = spans
                .iter()
                .filter(|s| s.start_ns <= t && t < s.end_ns)
                .count();
            format!("{:.1}", n as f64 / sms.max(1) as f64)
        })
        .collect();
    Ok(format!(
        "{row}: {} blocks on {used} of {sms} SMs, span {:.1} us, busy {:.1}%, ramp {:.1} us, \
         tail {:.1} us ({:.1}% of the span), block us median {:.1} / max {:.1}, {short} blocks \
         under 2 us; resident blocks per SM at tenths of the span: {}{}\n",
        spans.len(),
        span / 1e3,
        100.0 * busy as f64 / (sms.max(1) as f64 * span),
        (first_max - t0) as f64 / 1e3,
        (t1 - last_min) as f64 / 1e3,
        100.0 * (t1 - last_min) as f64 / span,
        durs[durs.len() / 2] as f64 / 1e3,
        durs[durs.len() - 1] as f64 / 1e3,
        resident.join(" "),
        if spans.len() >= BLOCKS {
            " (the table is full: later blocks were not recorded)"
        } else {
            ""
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(block: usize, sm: u32, start: u64, end: u64) -> BlockSpan {
        BlockSpan {
            block,
            start_ns: 1_000_000 + start,
            end_ns: 1_000_000 + end,
            sm,
        }
    }

    /// Two SMs: SM 0 busy over [0, 10) µs with a gap [4, 6), SM 1 from 2 µs to 8 µs.
    #[test]
    fn busy_ramp_and_tail() {
        let spans = [
            span(0, 0, 0, 4_000),
            span(1, 0, 6_000, 10_000),
            span(2, 1, 2_000, 5_000),
            span(3, 1, 3_000, 8_000),
        ];
        let dir = std::env::temp_dir().join(format!("timeline-test-{}", std::process::id()));
        let s = report(&dir, "row", &spans, 2).unwrap();
        // busy (8 + 6) / (2 · 10) = 70%; ramp 2 µs; tail 10 − 8 = 2 µs
        assert!(
            s.contains("4 blocks on 2 of 2 SMs, span 10.0 us, busy 70.0%"),
            "{s}"
        );
        assert!(
            s.contains("ramp 2.0 us, tail 2.0 us (20.0% of the span)"),
            "{s}"
        );
        let csv = std::fs::read_to_string(dir.join("row.csv")).unwrap();
        assert_eq!(csv.lines().count(), 5);
        assert!(csv.contains("\n1,0,6000,10000\n"), "{csv}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
