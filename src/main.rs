use clap::Parser;

fn main() {
    s3rdma_fs::limit_heap_arenas();
    let args: Vec<String> = std::env::args().collect();
    if args.len() == 2 && matches!(args[1].as_str(), "--version" | "-V") {
        print!(
            "{}",
            s3rdma_client::mode::version_report(s3rdma::cli::VERSION)
        );
        return;
    }
    match args.get(1).map(String::as_str) {
        Some("stats") => std::process::exit(s3rdma::stats::run(&args[2..])),
        Some("warm") => std::process::exit(s3rdma::warm::run(&args[2..])),
        _ => {}
    }
    let cli = s3rdma::cli::Cli::parse();
    match s3rdma::cli::Settings::from_cli(cli) {
        Ok(settings) => s3rdma::mount::run(settings),
        Err(msg) => {
            eprintln!("s3rdma: error: {msg}");
            std::process::exit(2);
        }
    }
}
