//! The conformance report of `attn-conform report`: over a folder of case files, per upstream
//! implementation (each case's `source.impl`) and op, how many cases passed, failed or could not
//! be used, and the worst ratio against its threshold. Only the outputs stored in the cases are
//! checked (the implementations' own results); as plain text, a GitHub markdown table or a
//! standalone HTML page.

use crate::case::Case;
use crate::error::{Error, Problem};
use crate::fixtures::Manifests;
use crate::table;
use crate::verify::{verify_case, Row, Selection};
use std::collections::BTreeMap;
use std::path::Path;

/// How `report` writes its table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Text,
    Markdown,
    Html,
}

/// The implementation of a case whose metadata could not be read.
pub const UNKNOWN: &str = "?";

/// What one case file gave: its implementation and op, and its compared rows or why it could not
/// be used.
#[derive(Debug)]
pub struct Outcome {
    pub implementation: String,
    pub op: String,
    pub result: Result<Vec<Row>, Error>,
}

/// Reads, checks against its manifest and verifies (stored outputs only) one case file.
pub fn outcome(path: &Path, manifests: &mut Manifests) -> Outcome {
    let read = std::fs::read(path)
        .map_err(|e| Problem::Io(e).at(path))
        .and_then(|bytes| {
            manifests.check(path, &bytes)?;
            Case::from_bytes(path, &bytes)
        });
    match read {
        Err(e) => Outcome {
            implementation: UNKNOWN.into(),
            op: UNKNOWN.into(),
            result: Err(e),
        },
        Ok(case) => Outcome {
            implementation: case.impl_name().unwrap_or(UNKNOWN).to_string(),
            op: case.op.clone(),
            result: verify_case(&case, Selection::Cpu).map_err(|p| p.at(path)),
        },
    }
}

/// One line of the report: the cases of one implementation and op.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Line {
    pub passed: usize,
    pub failed: usize,
    pub unusable: usize,
    /// The largest `ratio / threshold` of any compared output (0 for an exact match, infinite
    /// for an exact mismatch; `None` when nothing was measured).
    pub worst: Option<f64>,
}

impl Line {
    pub fn cases(&self) -> usize {
        self.passed + self.failed + self.unusable
    }
}

/// The report: one [`Line`] per (implementation, op), sorted.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub lines: BTreeMap<(String, String), Line>,
}

impl Report {
    /// Counts one case.
    pub fn add(&mut self, o: &Outcome) {
        let line = self
            .lines
            .entry((o.implementation.clone(), o.op.clone()))
            .or_default();
        match &o.result {
            Err(_) => line.unusable += 1,
            Ok(rows) => {
                if rows.iter().all(|r| r.pass) {
                    line.passed += 1;
                } else {
                    line.failed += 1;
                }
                for m in rows.iter().filter_map(Row::margin) {
                    line.worst = Some(line.worst.map_or(m, |w| w.max(m)));
                }
            }
        }
    }

    /// `(passed, failed, unusable)` over every line.
    pub fn totals(&self) -> (usize, usize, usize) {
        self.lines.values().fold((0, 0, 0), |(p, f, u), l| {
            (p + l.passed, f + l.failed, u + l.unusable)
        })
    }

    /// The report as a table in `format`.
    pub fn render(&self, format: Format) -> String {
        let header = [
            "implementation",
            "op",
            "cases",
            "passed",
            "failed",
            "unusable",
            "worst ratio / threshold",
        ];
        let rows: Vec<Vec<String>> = self
            .lines
            .iter()
            .map(|((implementation, op), l)| {
                vec![
                    implementation.clone(),
                    op.clone(),
                    l.cases().to_string(),
                    l.passed.to_string(),
                    l.failed.to_string(),
                    l.unusable.to_string(),
                    l.worst.map_or("-".into(), worst),
                ]
            })
            .collect();
        match format {
            Format::Text => table::plain(&header, &rows),
            Format::Markdown => table::markdown(&header, &rows),
            Format::Html => table::html("Conformance report", &header, &rows),
        }
    }
}

/// A margin as the report shows it: `0.042`, `1.500` (over the threshold), `2.5e-5`; `0` for a
/// match under the exact or index rule, `inf` for a mismatch under the exact rule.
fn worst(m: f64) -> String {
    if m == 0.0 {
        "0".into()
    } else if m.is_infinite() {
        "inf".into()
    } else if m < 1e-3 {
        format!("{m:.1e}")
    } else {
        format!("{m:.3}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn margins_read_as_fractions_of_the_threshold() {
        assert_eq!(worst(0.0), "0");
        assert_eq!(worst(0.04213), "0.042");
        assert_eq!(worst(1.5), "1.500");
        assert_eq!(worst(2.5e-5), "2.5e-5");
        assert_eq!(worst(f64::INFINITY), "inf");
    }
}
