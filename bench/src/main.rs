//! The `rl-bench` binary: parses the command line, runs the load, prints the report.

use clap::Parser as _;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = bench::Args::parse();
    let json = args.json;
    let report = bench::run(args).await?;
    if json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.table());
    }
    Ok(())
}
