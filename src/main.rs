use clap::Parser;

fn main() {
    let cli = s3rdma::cli::Cli::parse();
    match s3rdma::cli::Settings::from_cli(cli) {
        Ok(settings) => s3rdma::mount::run(settings),
        Err(msg) => {
            eprintln!("s3rdma: error: {msg}");
            std::process::exit(2);
        }
    }
}
