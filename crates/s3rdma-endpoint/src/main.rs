//! `s3rdma-endpoint`: the loopback S3-over-RDMA endpoint (see the `s3rdma_endpoint` library).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use clap::Parser;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use s3rdma_endpoint::http_layer::{self, Peer};
use s3rdma_endpoint::{Endpoint, FaultPlan};
use s3s::auth::SimpleAuth;
use s3s::service::{S3Service, S3ServiceBuilder};

/// Serve S3 on loopback in front of BACKEND, moving payloads of requests that carry a loopback
/// RDMA token straight to and from the client's registered memory.
#[derive(Parser, Debug)]
#[command(name = "s3rdma-endpoint", version = env!("CARGO_PKG_VERSION"))]
struct Args {
    /// Address to listen on; must be a loopback address
    #[arg(long, default_value = "127.0.0.1:9100")]
    listen: SocketAddr,
    /// The S3 server behind this endpoint, e.g. http://127.0.0.1:8333
    #[arg(long)]
    backend: String,
    /// Access key clients sign with, and the endpoint uses with the backend [env: AWS_ACCESS_KEY_ID]
    #[arg(long, env = "AWS_ACCESS_KEY_ID")]
    access_key: String,
    /// Secret key [env: AWS_SECRET_ACCESS_KEY]
    #[arg(long, env = "AWS_SECRET_ACCESS_KEY", hide_env_values = true)]
    secret_key: String,
    /// A file holding `MODE [COUNT] [op=OP|any] [after=N] [for=MS]` to make requests misbehave
    /// (decline, ignore, corrupt, short, badreply, throttle, delay:MS, drop, error; for plain
    /// GETs reset, trickle:MS; for any answer noetag, for XML answers garbage; none); re-read on
    /// every request. Without op= it hits RDMA requests; for=MS hits every matching request for
    /// MS after the file changed (an outage)
    #[arg(long)]
    fault_file: Option<PathBuf>,
    /// Log filter
    #[arg(long, default_value = "info")]
    log_level: String,
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    init_logging(&args.log_level);
    if !args.listen.ip().is_loopback() {
        eprintln!("s3rdma-endpoint: error: --listen {} is not a loopback address; this test endpoint serves 127.0.0.1 or ::1 only", args.listen);
        std::process::exit(2);
    }
    let (service, faults) = service(&args);
    let listener = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!(
                "s3rdma-endpoint: error: cannot listen on {}: {e}",
                args.listen
            );
            std::process::exit(1);
        }
    };
    tracing::info!(listen = %args.listen, backend = %args.backend, "s3rdma-endpoint ready");
    serve(listener, service, faults).await;
}

/// Logs to stderr, filtered by `--log-level`; colours only for a terminal (the tests redirect
/// stderr to a log file).
fn init_logging(level: &str) {
    let filter = match tracing_subscriber::EnvFilter::try_new(level) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("s3rdma-endpoint: error: --log-level {level:?}: {e}");
            std::process::exit(2);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
}

/// The S3 service in front of the backend, and its fault plan.
fn service(args: &Args) -> (S3Service, Arc<FaultPlan>) {
    let conf = aws_sdk_s3::config::Builder::new()
        .behavior_version(BehaviorVersion::latest())
        .endpoint_url(&args.backend)
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new(
            &args.access_key,
            &args.secret_key,
            None,
            None,
            "s3rdma-endpoint",
        ))
        .force_path_style(true)
        .build();
    let faults = Arc::new(FaultPlan::new(args.fault_file.clone()));
    let endpoint = Endpoint::new(aws_sdk_s3::Client::from_conf(conf), faults.clone());
    let mut b = S3ServiceBuilder::new(endpoint);
    b.set_auth(SimpleAuth::from_single(
        args.access_key.clone(),
        args.secret_key.clone(),
    ));
    (b.build(), faults)
}

/// Serve connections until SIGTERM or SIGINT, then let those under way finish (at most 5 s).
async fn serve(listener: tokio::net::TcpListener, service: S3Service, faults: Arc<FaultPlan>) {
    let http = ConnBuilder::new(TokioExecutor::new());
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut stop = std::pin::pin!(async {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut t) => {
                tokio::select! { _ = t.recv() => {}, _ = tokio::signal::ctrl_c() => {} }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    });
    loop {
        let (socket, peer_addr) = tokio::select! {
            res = listener.accept() => match res {
                Ok(c) => c,
                Err(e) => { tracing::error!("accept failed: {e}"); continue; }
            },
            _ = stop.as_mut() => break,
        };
        // Who connected: the owner of the client's socket decides which processes' memory its
        // RDMA tokens may name.
        let peer = Peer {
            addr: peer_addr,
            uid: socket
                .local_addr()
                .ok()
                .and_then(|local| http_layer::peer_uid(peer_addr, local)),
        };
        let (svc, plan) = (service.clone(), faults.clone());
        let handler = hyper::service::service_fn(move |req| {
            http_layer::serve(svc.clone(), plan.clone(), peer, req)
        });
        let conn = http.serve_connection(TokioIo::new(socket), handler);
        let conn = graceful.watch(conn.into_owned());
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
    tokio::select! {
        () = graceful.shutdown() => {},
        () = tokio::time::sleep(std::time::Duration::from_secs(5)) => {},
    }
}
