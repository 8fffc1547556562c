//! Which byte ranges of a partly downloaded file are on disk.
//!
//! A download fetches a file as many ranges at once and may be killed at any point, so a partial
//! file is not a prefix: it is a sparse file of the full length plus a record of the ranges that
//! were written and synced. A later run reads the record and fetches only the gaps. A range
//! enters the record only after its bytes are synced, so a crash can lose work but never claim
//! bytes that are not there.

use std::path::Path;

use crate::error::{IoContext, Result};

/// A set of half-open byte ranges, kept sorted and merged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RangeSet {
    ranges: Vec<(u64, u64)>,
}

impl RangeSet {
    /// The empty set.
    pub fn new() -> RangeSet {
        RangeSet::default()
    }

    /// The ranges, sorted, disjoint and not touching.
    pub fn ranges(&self) -> &[(u64, u64)] {
        &self.ranges
    }

    /// Bytes held.
    pub fn len(&self) -> u64 {
        self.ranges.iter().map(|(a, b)| b - a).sum()
    }

    /// Whether no byte is held.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Adds `[start, end)`.
    pub fn insert(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let (mut s, mut e) = (start, end);
        let mut out = Vec::with_capacity(self.ranges.len() + 1);
        let mut placed = false;
        for &(a, b) in &self.ranges {
            if b < s {
                out.push((a, b));
            } else if a > e {
                if !placed {
                    out.push((s, e));
                    placed = true;
                }
                out.push((a, b));
            } else {
                s = s.min(a);
                e = e.max(b);
            }
        }
        if !placed {
            out.push((s, e));
        }
        self.ranges = out;
    }

    /// Whether every byte of `[start, end)` is held.
    pub fn contains(&self, start: u64, end: u64) -> bool {
        start >= end || self.ranges.iter().any(|&(a, b)| a <= start && end <= b)
    }

    /// The parts of `[start, end)` not held, in order.
    pub fn gaps(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut at = start;
        for &(a, b) in &self.ranges {
            if b <= at {
                continue;
            }
            if a >= end {
                break;
            }
            if a > at {
                out.push((at, a.min(end)));
            }
            at = at.max(b);
            if at >= end {
                break;
            }
        }
        if at < end {
            out.push((at, end));
        }
        out
    }

    /// Reads a record written by [`save`](Self::save); a missing file is the empty set. A
    /// record that does not parse is treated as empty (its bytes are fetched again) rather
    /// than trusted.
    pub fn load(path: &Path) -> Result<RangeSet> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(RangeSet::new()),
            Err(e) => return Err(e).at("reading", path),
        };
        let mut set = RangeSet::new();
        for line in text.lines() {
            let mut it = line.split_ascii_whitespace().map(str::parse::<u64>);
            match (it.next(), it.next(), it.next()) {
                (Some(Ok(a)), Some(Ok(b)), None) if a < b => set.insert(a, b),
                _ => {
                    tracing::warn!(record = %path.display(), "unreadable range record; refetching");
                    return Ok(RangeSet::new());
                }
            }
        }
        Ok(set)
    }

    /// Writes the record atomically (a temporary file renamed over it).
    pub fn save(&self, path: &Path) -> Result<()> {
        let text: String = self
            .ranges
            .iter()
            .map(|(a, b)| format!("{a} {b}\n"))
            .collect();
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).at("writing", &tmp)?;
        std::fs::rename(&tmp, path).at("renaming", &tmp)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn ranges_merge_and_gaps_are_the_rest() {
        let mut s = RangeSet::new();
        s.insert(10, 20);
        s.insert(30, 40);
        s.insert(20, 25);
        assert_eq!(s.ranges(), &[(10, 25), (30, 40)]);
        assert_eq!(s.gaps(0, 50), vec![(0, 10), (25, 30), (40, 50)]);
        assert_eq!(s.gaps(12, 24), vec![]);
        assert!(s.contains(30, 40) && !s.contains(24, 31));
        s.insert(5, 45);
        assert_eq!(s.ranges(), &[(5, 45)]);
        assert_eq!(s.len(), 40);
    }

    #[test]
    fn a_record_survives_a_round_trip_and_a_torn_one_is_not_trusted() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("r");
        assert!(RangeSet::load(&p).unwrap().is_empty());
        let mut s = RangeSet::new();
        s.insert(0, 7);
        s.insert(100, 4096);
        s.save(&p).unwrap();
        assert_eq!(RangeSet::load(&p).unwrap(), s);
        std::fs::write(&p, "0 7\n").unwrap();
        assert_eq!(RangeSet::load(&p).unwrap().len(), 7);
        std::fs::write(&p, "0 7\n100 40").unwrap();
        assert!(RangeSet::load(&p).unwrap().is_empty());
        std::fs::write(&p, "0 7\n100").unwrap();
        assert!(RangeSet::load(&p).unwrap().is_empty());
    }
}
