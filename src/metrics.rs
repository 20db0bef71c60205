//! The Prometheus endpoint (`--metrics-addr`): `GET /metrics` answers the mount's report (the
//! same one `s3rdma stats` prints; see `s3rdma_metrics`) in the Prometheus text exposition
//! format (0.0.4), encoded by `prometheus-client`, plus `s3rdma_build_info` and
//! `s3rdma_mount_info` (bucket and prefix: the only place they are labels).
//!
//! The server is a task per connection on the daemon's runtime (no thread per request, no
//! HTTP framework: the daemon has no HTTP server dependency), at most 16 at once. It reads one
//! request (at most 8 KiB, 5 s), answers it and closes the connection.
//! The report reads shared counters, not the file system through FUSE: it answers while every
//! FUSE worker is busy.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use s3rdma_metrics::{Collected, Kind, Report};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, info, warn};

/// Every metric's name starts with this.
pub const PREFIX: &str = "s3rdma_";

/// Connections answered at once.
const MAX_CONNECTIONS: usize = 16;

/// The address `--metrics-addr` names, checked: a loopback address unless `allow_remote`.
pub fn check_addr(text: &str, allow_remote: bool) -> Result<SocketAddr, String> {
    let addr: SocketAddr = text.trim().parse().map_err(|_| {
        format!("metrics address '{text}' is not ADDR:PORT; give one such as 127.0.0.1:9464")
    })?;
    if !addr.ip().is_loopback() && !allow_remote {
        return Err(format!(
            "metrics address {addr} is reachable from other hosts; use 127.0.0.1:{} or add --metrics-allow-remote",
            addr.port()
        ));
    }
    Ok(addr)
}

/// What `s3rdma_build_info` and `s3rdma_mount_info` say.
#[derive(Clone, Debug)]
pub struct Info {
    pub version: String,
    pub provider: String,
    pub rdma: String,
    pub bucket: String,
    pub prefix: String,
}

/// The mount's report as a `prometheus-client` collector.
struct ReportCollector {
    report: Arc<dyn Report + Send + Sync>,
    info: Info,
}

impl std::fmt::Debug for ReportCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReportCollector").finish_non_exhaustive()
    }
}

/// `items` grouped under their full metric name (sorted), in report order within a name.
fn by_name<T>(items: &[T], name: impl Fn(&T) -> &str) -> BTreeMap<String, Vec<&T>> {
    let mut out: BTreeMap<String, Vec<&T>> = BTreeMap::new();
    for i in items {
        out.entry(format!("{PREFIX}{}", name(i)))
            .or_default()
            .push(i);
    }
    out
}

/// Encode one series of `m`: under labels `l`, or bare when it has none.
fn series_of(
    m: &mut MetricEncoder<'_>,
    l: &[(String, String)],
    f: impl FnOnce(&mut MetricEncoder<'_>) -> Result<(), std::fmt::Error>,
) -> Result<(), std::fmt::Error> {
    if l.is_empty() {
        return f(m);
    }
    let l: Vec<(&str, &str)> = l.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut family = m.encode_family(&l)?;
    f(&mut family)
}

impl Collector for ReportCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut all = Collected::default();
        self.report.report(&mut all);
        // One descriptor per metric, its labelled series under it.
        for (name, series) in &by_name(&all.values, |v| &v.name) {
            let first = series[0];
            let kind = match first.kind {
                Kind::Counter => MetricType::Counter,
                Kind::Gauge => MetricType::Gauge,
            };
            let mut metric = encoder.encode_descriptor(name, &first.help, None, kind)?;
            for v in series {
                series_of(&mut metric, &v.labels, |m| match v.kind {
                    Kind::Counter => m.encode_counter::<NoLabelSet, _, u64>(&v.value, None),
                    Kind::Gauge => m.encode_gauge(&v.value),
                })?;
            }
        }
        for (name, series) in &by_name(&all.histograms, |h| &h.name) {
            let mut metric =
                encoder.encode_descriptor(name, &series[0].help, None, MetricType::Histogram)?;
            for h in series {
                // The encoder adds the buckets up itself.
                let s = &h.snapshot;
                let mut below = 0;
                let buckets: Vec<(f64, u64)> = s
                    .buckets
                    .iter()
                    .map(|&(bound, n)| {
                        let here = n - below;
                        below = n;
                        (bound, here)
                    })
                    .collect();
                series_of(&mut metric, &h.labels, |m| {
                    m.encode_histogram::<NoLabelSet>(s.sum_seconds, s.count, &buckets, None)
                })?;
            }
        }
        let i = &self.info;
        let mut build = encoder.encode_descriptor(
            "s3rdma_build_info",
            "The daemon's version, RDMA provider and RDMA mode (always 1).",
            None,
            MetricType::Gauge,
        )?;
        let l = [
            ("version", i.version.as_str()),
            ("provider", i.provider.as_str()),
            ("rdma_mode", i.rdma.as_str()),
        ];
        build.encode_family(&l)?.encode_gauge(&1u64)?;
        let mut mount = encoder.encode_descriptor(
            "s3rdma_mount_info",
            "The bucket and prefix this mount serves (always 1).",
            None,
            MetricType::Gauge,
        )?;
        let l = [("bucket", i.bucket.as_str()), ("prefix", i.prefix.as_str())];
        mount.encode_family(&l)?.encode_gauge(&1u64)?;
        Ok(())
    }
}

/// The exposition text of a report.
pub fn exposition(report: Arc<dyn Report + Send + Sync>, info: Info) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(ReportCollector { report, info }));
    let mut text = String::new();
    if let Err(e) = prometheus_client::encoding::prometheus_text::encode(&mut text, &registry) {
        warn!(error = %e, "cannot encode the metrics");
    }
    text
}

/// Bind `addr` (before the mount is ready: a taken port fails the start-up).
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, String> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot serve metrics on {addr}: {e}; choose another --metrics-addr"))
}

/// Serve `/metrics` on `listener` until the runtime ends.
pub async fn serve(listener: TcpListener, report: Arc<dyn Report + Send + Sync>, info: Info) {
    if let Ok(addr) = listener.local_addr() {
        info!(%addr, "metrics at http://{addr}/metrics");
    }
    // At most this many connections are answered at once; more are closed at once (a
    // scraper takes one).
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (conn, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of file descriptors and the like: try again shortly.
                debug!(error = %e, "metrics: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            debug!(%peer, "metrics: too many connections; closed");
            continue;
        };
        let (report, info) = (report.clone(), info.clone());
        tokio::spawn(async move {
            let _slot = slot;
            if let Err(e) = answer(conn, report, info).await {
                debug!(%peer, error = %e, "metrics: request not answered");
            }
        });
    }
}

/// Read one request and answer it.
async fn answer(
    mut conn: TcpStream,
    report: Arc<dyn Report + Send + Sync>,
    info: Info,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; 8 << 10];
    let mut len = 0;
    let head = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let n = conn.read(&mut buf[len..]).await?;
            len += n;
            if n == 0 || buf[..len].windows(4).any(|w| w == b"\r\n\r\n") || len == buf.len() {
                return Ok::<_, std::io::Error>(());
            }
        }
    })
    .await;
    match head {
        // A client that sends nothing for 5 s gets nothing.
        Err(_) => return Ok(()),
        Ok(r) => r?,
    }
    let line = buf[..len]
        .split(|&b| b == b'\r' || b == b'\n')
        .next()
        .unwrap_or(&[]);
    let mut parts = line.split(|&b| b == b' ');
    let (method, target) = (parts.next().unwrap_or(&[]), parts.next().unwrap_or(&[]));
    let path = target.split(|&b| b == b'?').next().unwrap_or(&[]);
    let (status, kind, body) = match (method, path) {
        (b"GET", b"/metrics") | (b"HEAD", b"/metrics") => (
            "200 OK",
            prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            exposition(report, info),
        ),
        (b"GET", _) | (b"HEAD", _) => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "s3rdma serves its metrics at /metrics\n".to_string(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            "only GET /metrics\n".to_string(),
        ),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await?;
    if method != b"HEAD" {
        conn.write_all(body.as_bytes()).await?;
    }
    conn.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use s3rdma_metrics::{Histogram, Sink, Value};

    struct Fixed(Histogram);

    impl Report for Fixed {
        fn report(&self, out: &mut dyn Sink) {
            out.value(Value::counter("cache_hits", "Hits.", 3));
            let l: &[(&str, &str)] = &[("direction", "read"), ("transport", "http")];
            out.value(
                Value::counter("http_bytes_read", "Moved.", 10).exported("transfer_bytes", l),
            );
            let l: &[(&str, &str)] = &[("direction", "read"), ("transport", "rdma")];
            out.value(
                Value::counter("rdma_bytes_read", "Moved.", 20).exported("transfer_bytes", l),
            );
            out.value(Value::gauge("open_files", "Open.", 2));
            out.histogram(
                "fuse_read",
                "fuse_request_seconds",
                &[("opcode", "read")],
                "Time.",
                &self.0,
            );
        }
    }

    #[test]
    fn the_exposition_groups_series_and_names_them_the_prometheus_way() {
        let h = Histogram::default();
        h.observe(Duration::from_millis(2));
        h.observe(Duration::from_millis(20));
        let info = Info {
            version: "1.2.3".into(),
            provider: "loopback".into(),
            rdma: "auto".into(),
            bucket: "b".into(),
            prefix: "p/".into(),
        };
        let text = exposition(Arc::new(Fixed(h)), info);
        for want in [
            "# TYPE s3rdma_cache_hits_total counter\n",
            "s3rdma_cache_hits_total 3\n",
            "s3rdma_transfer_bytes_total{direction=\"read\",transport=\"http\"} 10\n",
            "s3rdma_transfer_bytes_total{direction=\"read\",transport=\"rdma\"} 20\n",
            "# TYPE s3rdma_open_files gauge\ns3rdma_open_files 2\n",
            "s3rdma_fuse_request_seconds_bucket{opcode=\"read\",le=\"0.0025\"} 1\n",
            "s3rdma_fuse_request_seconds_bucket{opcode=\"read\",le=\"0.025\"} 2\n",
            "s3rdma_fuse_request_seconds_bucket{opcode=\"read\",le=\"+Inf\"} 2\n",
            "s3rdma_fuse_request_seconds_count{opcode=\"read\"} 2\n",
            "s3rdma_build_info{version=\"1.2.3\",provider=\"loopback\",rdma_mode=\"auto\"} 1\n",
            "s3rdma_mount_info{bucket=\"b\",prefix=\"p/\"} 1\n",
        ] {
            assert!(text.contains(want), "{want:?} missing from:\n{text}");
        }
        assert_eq!(
            text.matches("# TYPE s3rdma_transfer_bytes_total").count(),
            1
        );
    }

    #[test]
    fn remote_addresses_need_the_flag() {
        assert!(check_addr("127.0.0.1:9464", false).is_ok());
        assert!(check_addr("[::1]:9464", false).is_ok());
        let e = check_addr("0.0.0.0:9464", false).unwrap_err();
        assert!(e.contains("--metrics-allow-remote"), "{e}");
        assert!(check_addr("0.0.0.0:9464", true).is_ok());
        let e = check_addr("localhost", false).unwrap_err();
        assert!(e.contains("metrics address"), "{e}");
    }
}
