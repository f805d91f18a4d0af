//! `mycni-agent`: the mycni node agent (DaemonSet). The command line is
//! `cli/`; everything it runs is the library's.

mod cli;

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("MYCNI_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    cli::main()
}
