//! `acp`: the ACP door (`frontdoor::acp`) on this process's stdio.

use crate::frontdoor::acp;

/// `acp`: the ACP agent on stdio; logs go to stderr (warnings only unless `RUST_LOG`).
pub(super) async fn command(
    config: crate::sys::config::Config,
) -> anyhow::Result<std::process::ExitCode> {
    let mut quiet = config.clone();
    if std::env::var_os("RUST_LOG").is_none() {
        quiet.log = "warn".into();
    }
    crate::sys::logging::init(&quiet);
    let opts = acp::Options {
        socket: config.socket_to_dial(),
        max_line: config.max_frame_bytes,
    };
    let stdin = tokio::io::BufReader::new(tokio::io::stdin());
    acp::run(opts, stdin, tokio::io::stdout()).await?;
    Ok(std::process::ExitCode::SUCCESS)
}
