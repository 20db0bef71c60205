use s3rdma::cli::Invocation;

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
    let cli = match s3rdma::cli::parse(args) {
        Invocation::Stats(a) => std::process::exit(s3rdma::stats::run(&a)),
        Invocation::Warm(a) => std::process::exit(s3rdma::warm::run(&a)),
        Invocation::Mount(cli) => *cli,
    };
    match s3rdma::cli::Settings::from_cli(cli) {
        Ok(settings) => s3rdma::mount::run(settings),
        Err(msg) => {
            eprintln!("s3rdma: error: {msg}");
            std::process::exit(2);
        }
    }
}
