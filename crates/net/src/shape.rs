//! The link emulator's settings: latency added to every message and a bandwidth cap.
//!
//! tc netem is not available where strata is tested, so slow links are simulated inside the
//! transport: the sender stamps each message with the earliest time it may be delivered (its
//! link is busy for `bytes / bandwidth` after the previous message, then the message travels for
//! `latency`), and the receiver waits for that time before handing the message over.

use std::time::Duration;

use crate::{Error, Result};

/// Latency and bandwidth of an emulated link. The default is a perfect link (no delay).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LinkShape {
    /// One-way delay added to every message.
    pub latency: Duration,
    /// Bytes per second; `None` is unlimited.
    pub bandwidth: Option<f64>,
}

impl LinkShape {
    /// Whether this shape changes anything.
    pub fn is_ideal(&self) -> bool {
        self.latency.is_zero() && self.bandwidth.is_none()
    }

    /// Nanoseconds a message of `bytes` occupies the link.
    pub(crate) fn wire_ns(&self, bytes: usize) -> u64 {
        self.bandwidth
            .map_or(0, |bw| (bytes as f64 / bw * 1e9).ceil() as u64)
    }
}

/// Parses a duration such as `300us`, `1ms`, `0.5s`, `50ns` or `0`.
pub fn parse_latency(s: &str) -> Result<Duration> {
    let t = s.trim();
    let bad = || Error::BadLinkSetting(s.to_string());
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(bad)?;
    let (num, unit) = t.split_at(split);
    let v: f64 = num.parse().map_err(|_| bad())?;
    let ns = match unit.trim() {
        "ns" => v,
        "us" | "µs" => v * 1e3,
        "ms" => v * 1e6,
        "s" => v * 1e9,
        _ => return Err(bad()),
    };
    if !ns.is_finite() || !(0.0..=60e9).contains(&ns) {
        return Err(bad());
    }
    Ok(Duration::from_nanos(ns.round() as u64))
}

/// Parses a rate such as `10gbit`, `100mbit`, `2.5GB/s` or `800MB/s` into bytes per second.
pub fn parse_bandwidth(s: &str) -> Result<f64> {
    let t = s.trim();
    let bad = || Error::BadLinkSetting(s.to_string());
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(bad)?;
    let (num, unit) = t.split_at(split);
    let v: f64 = num.parse().map_err(|_| bad())?;
    let bytes_per_s = match unit.trim() {
        "bit" | "bps" => v / 8.0,
        "kbit" | "kbps" => v * 1e3 / 8.0,
        "mbit" | "mbps" | "Mbit" => v * 1e6 / 8.0,
        "gbit" | "gbps" | "Gbit" => v * 1e9 / 8.0,
        "B/s" => v,
        "KB/s" | "kB/s" => v * 1e3,
        "MB/s" => v * 1e6,
        "GB/s" => v * 1e9,
        _ => return Err(bad()),
    };
    if !bytes_per_s.is_finite() || bytes_per_s <= 0.0 {
        return Err(bad());
    }
    Ok(bytes_per_s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latencies() {
        assert_eq!(
            parse_latency("300us").ok(),
            Some(Duration::from_micros(300))
        );
        assert_eq!(parse_latency("1ms").ok(), Some(Duration::from_millis(1)));
        assert_eq!(parse_latency("0").ok(), Some(Duration::ZERO));
        assert_eq!(
            parse_latency("2.5us").ok(),
            Some(Duration::from_nanos(2500))
        );
        for bad in ["", "fast", "10", "-1ms", "1 parsec", "1e9s"] {
            assert!(parse_latency(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn bandwidths() {
        assert_eq!(parse_bandwidth("10gbit").ok(), Some(1.25e9));
        assert_eq!(parse_bandwidth("800MB/s").ok(), Some(8e8));
        for bad in ["", "0gbit", "10", "lots"] {
            assert!(parse_bandwidth(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn wire_time() {
        let s = LinkShape {
            latency: Duration::ZERO,
            bandwidth: Some(1e9),
        };
        assert_eq!(s.wire_ns(1000), 1000);
        assert_eq!(LinkShape::default().wire_ns(1 << 20), 0);
    }
}
