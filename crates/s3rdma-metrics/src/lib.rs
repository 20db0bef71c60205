//! The mount's metrics: what each part of the daemon counts, reported to a [`Sink`].
//!
//! One source of truth, two views. Every part that counts something (the transport, the page
//! cache, the uploader, the staging area, the file system…) keeps plain atomics and reports
//! them, when asked, as [`Value`]s and [`Histogram`]s to a sink. `s3rdma stats` renders them
//! as `name value` lines ([`StatsText`]); the `/metrics` endpoint encodes the same report in
//! the Prometheus text format (in the binary, with `prometheus-client`). Nothing is
//! registered ahead: a scrape or a `stats` call walks the parts and reads their atomics, so
//! recording costs a relaxed atomic add and nothing else.
//!
//! Naming: a value has its `stats` name (kept stable: scripts read them) and its Prometheus
//! name and labels, `s3rdma_` + the name, `_total` added to counters by the encoder; units in
//! names (`_bytes`, `_seconds`). Labels come from fixed sets (operation, transport, opcode):
//! no key or path is ever a label.
//!
//! [`Histogram`] is lock-free: fixed buckets (100 µs to 10 s), one atomic add per bucket hit
//! and one for the sum. Its count is the sum of its buckets at the moment it is read, so an
//! exposition's `+Inf` bucket always equals its `_count`.

#![cfg_attr(test, allow(clippy::too_many_lines))]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A counter only grows (from the start of the mount); a gauge is a level now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
}

/// One reported number.
#[derive(Clone, Copy, Debug)]
pub struct Value<'a> {
    /// Its name in `s3rdma stats`.
    pub stat: &'a str,
    /// Its Prometheus name without the `s3rdma_` prefix (and without `_total`).
    pub name: &'a str,
    pub labels: &'a [(&'a str, &'a str)],
    pub help: &'a str,
    pub kind: Kind,
    pub value: u64,
}

impl<'a> Value<'a> {
    /// A counter named `stat` in both views.
    pub fn counter(stat: &'a str, help: &'a str, value: u64) -> Self {
        Value {
            stat,
            name: stat,
            labels: &[],
            help,
            kind: Kind::Counter,
            value,
        }
    }

    /// A gauge named `stat` in both views.
    pub fn gauge(stat: &'a str, help: &'a str, value: u64) -> Self {
        Value {
            kind: Kind::Gauge,
            ..Value::counter(stat, help, value)
        }
    }

    /// Exported under another Prometheus name, with labels.
    pub fn exported(self, name: &'a str, labels: &'a [(&'a str, &'a str)]) -> Self {
        Value {
            name,
            labels,
            ..self
        }
    }
}

/// Where a report goes.
pub trait Sink {
    fn value(&mut self, v: Value<'_>);
    /// A latency histogram: `stat` prefixes its lines in `s3rdma stats`, `name` (in seconds)
    /// and `labels` name it for Prometheus.
    fn histogram(
        &mut self,
        stat: &str,
        name: &str,
        labels: &[(&str, &str)],
        help: &str,
        h: &Histogram,
    );
}

/// Anything that reports metrics.
pub trait Report {
    fn report(&self, out: &mut dyn Sink);
}

/// Upper bounds of the histogram buckets, in nanoseconds (the last bucket, `+Inf`, is implied).
pub const BOUNDS_NS: [u64; 16] = [
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
];

/// A latency histogram with fixed buckets, recorded without locks.
#[derive(Debug, Default)]
pub struct Histogram {
    /// Observations per bucket (not cumulative); the last one is above every bound.
    buckets: [AtomicU64; BOUNDS_NS.len() + 1],
    sum_ns: AtomicU64,
}

/// What a histogram held when it was read.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    /// `(upper bound in seconds, observations at or below it)`, cumulative, `+Inf` last.
    pub buckets: Vec<(f64, u64)>,
    pub count: u64,
    pub sum_seconds: f64,
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let i = BOUNDS_NS.partition_point(|&b| b < ns);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> Snapshot {
        let mut buckets = Vec::with_capacity(BOUNDS_NS.len() + 1);
        let mut count = 0;
        for (i, b) in self.buckets.iter().enumerate() {
            count += b.load(Ordering::Relaxed);
            let bound = BOUNDS_NS
                .get(i)
                .map_or(f64::INFINITY, |&ns| ns as f64 / 1e9);
            buckets.push((bound, count));
        }
        Snapshot {
            buckets,
            count,
            sum_seconds: self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }
}

impl Snapshot {
    /// The upper bound of the bucket that holds quantile `q` (0..1), in seconds: an upper
    /// estimate (None when empty; infinite when it lies above every bound).
    pub fn quantile_bound(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let rank = (q * self.count as f64).ceil().max(1.0) as u64;
        self.buckets
            .iter()
            .find(|(_, n)| *n >= rank)
            .map(|(bound, _)| *bound)
    }
}

/// `s3rdma stats`: one `name value` line per value; a histogram that saw anything as
/// `STAT_count`, `STAT_sum_us` and `STAT_p50_le_us`/`STAT_p99_le_us` (bucket bounds).
#[derive(Debug, Default)]
pub struct StatsText {
    pub text: String,
}

impl Sink for StatsText {
    fn value(&mut self, v: Value<'_>) {
        use std::fmt::Write;
        let _ = writeln!(self.text, "{} {}", v.stat, v.value);
    }

    fn histogram(&mut self, stat: &str, _: &str, _: &[(&str, &str)], _: &str, h: &Histogram) {
        use std::fmt::Write;
        let s = h.snapshot();
        if s.count == 0 {
            return;
        }
        let us = |seconds: f64| {
            if seconds.is_finite() {
                format!("{:.0}", seconds * 1e6)
            } else {
                "inf".to_string()
            }
        };
        let _ = writeln!(self.text, "{stat}_count {}", s.count);
        let _ = writeln!(self.text, "{stat}_sum_us {}", us(s.sum_seconds));
        for (q, label) in [(0.5, "p50"), (0.99, "p99")] {
            if let Some(b) = s.quantile_bound(q) {
                let _ = writeln!(self.text, "{stat}_{label}_le_us {}", us(b));
            }
        }
    }
}

/// A sink that keeps what it was given (tests, and the encoders that must group samples by
/// metric before writing them).
#[derive(Debug, Default)]
pub struct Collected {
    pub values: Vec<OwnedValue>,
    pub histograms: Vec<OwnedHistogram>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct OwnedValue {
    pub stat: String,
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub help: String,
    pub kind: Kind,
    pub value: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct OwnedHistogram {
    pub stat: String,
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub help: String,
    pub snapshot: Snapshot,
}

fn owned(labels: &[(&str, &str)]) -> Vec<(String, String)> {
    labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

impl Sink for Collected {
    fn value(&mut self, v: Value<'_>) {
        self.values.push(OwnedValue {
            stat: v.stat.into(),
            name: v.name.into(),
            labels: owned(v.labels),
            help: v.help.into(),
            kind: v.kind,
            value: v.value,
        });
    }

    fn histogram(
        &mut self,
        stat: &str,
        name: &str,
        labels: &[(&str, &str)],
        help: &str,
        h: &Histogram,
    ) {
        self.histograms.push(OwnedHistogram {
            stat: stat.into(),
            name: name.into(),
            labels: owned(labels),
            help: help.into(),
            snapshot: h.snapshot(),
        });
    }
}

/// Load a counter (the usual read of a report).
pub fn load(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_their_bucket_and_the_count_is_the_last_bucket() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(50)); // <= 100 us
        h.observe(Duration::from_micros(100)); // <= 100 us (bounds are inclusive)
        h.observe(Duration::from_millis(3)); // <= 5 ms
        h.observe(Duration::from_secs(60)); // +Inf
        let s = h.snapshot();
        assert_eq!(s.count, 4);
        assert_eq!(s.buckets[0], (0.0001, 2));
        assert_eq!(s.buckets[5], (0.005, 3));
        assert_eq!(s.buckets[15], (10.0, 3));
        assert_eq!(s.buckets.last().unwrap(), &(f64::INFINITY, 4));
        assert!(s.buckets.windows(2).all(|w| w[0].1 <= w[1].1));
        assert!((s.sum_seconds - 60.00315).abs() < 1e-9);
        assert_eq!(s.quantile_bound(0.5), Some(0.0001));
        assert_eq!(s.quantile_bound(0.75), Some(0.005));
        assert_eq!(s.quantile_bound(0.99), Some(f64::INFINITY));
        assert_eq!(Histogram::default().snapshot().quantile_bound(0.5), None);
    }

    #[test]
    fn stats_text_lines() {
        let h = Histogram::default();
        let mut t = StatsText::default();
        t.value(Value::counter("cache_hits", "hits", 7));
        t.histogram("empty", "x_seconds", &[], "", &h);
        h.observe(Duration::from_millis(2));
        t.histogram("s3_get_http", "s3_request_seconds", &[], "", &h);
        assert_eq!(
            t.text,
            "cache_hits 7\ns3_get_http_count 1\ns3_get_http_sum_us 2000\ns3_get_http_p50_le_us 2500\ns3_get_http_p99_le_us 2500\n"
        );
    }
}
