//! Which pi package source this build's extension is, and what pi already has installed.
//!
//! `cargo install --git URL` records `git+URL[?tag=T]#COMMIT` for the binary in
//! `<root>/.crates2.json`, beside `<root>/bin`: the extension of the same commit (or tag) is
//! `git:URL@COMMIT`. A build from a checkout falls back to that checkout's path.

use serde_json::Value;
use std::path::{Path, PathBuf};

/// Where the extension comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// A `pi install` source: `git:<url>@<ref>` (or what `--pi-source` gave).
    Package(String),
    /// A checkout of this repository on disk (its root, with `package.json`).
    Checkout(PathBuf),
}

impl Source {
    /// The argument to `pi install`.
    pub fn arg(&self) -> String {
        match self {
            Source::Package(s) => s.clone(),
            Source::Checkout(p) => p.display().to_string(),
        }
    }
}

/// The pi source of a cargo source id (`git+URL?tag=T#COMMIT`); `None` for other sources.
pub fn from_cargo_source(id: &str) -> Option<String> {
    let rest = id.strip_prefix("git+")?;
    let (url_query, commit) = rest.split_once('#')?;
    let (url, query) = url_query.split_once('?').unwrap_or((url_query, ""));
    let tag = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("tag="))
        .filter(|t| !t.is_empty());
    Some(format!("git:{url}@{}", tag.unwrap_or(commit)))
}

/// The cargo source id of the installed `pi-ide-broker` in `crates2` (`.crates2.json`).
pub fn installed_source_id(crates2: &str) -> Option<String> {
    let v: Value = serde_json::from_str(crates2).ok()?;
    v["installs"].as_object()?.iter().find_map(|(key, info)| {
        let bins = info["bins"].as_array()?;
        let ours = key.starts_with("pi-ide-broker ")
            && bins.iter().any(|b| b.as_str() == Some("pi-ide-broker"));
        let id = key.split_once(" (")?.1.strip_suffix(')')?;
        ours.then(|| id.to_string())
    })
}

/// The source for this binary at `exe`: `--pi-source`, else what cargo recorded for it, else
/// the checkout it was built from (`manifest_dir`) when it is still there.
pub fn resolve(flag: Option<&str>, exe: &Path, manifest_dir: &Path) -> Option<Source> {
    if let Some(s) = flag {
        return Some(Source::Package(s.to_string()));
    }
    let root = exe.parent()?.parent()?;
    if let Ok(text) = std::fs::read_to_string(root.join(".crates2.json")) {
        if let Some(s) = installed_source_id(&text).and_then(|id| from_cargo_source(&id)) {
            return Some(Source::Package(s));
        }
    }
    manifest_dir
        .join("package.json")
        .exists()
        .then(|| Source::Checkout(manifest_dir.to_path_buf()))
}

/// pi's settings file (`$PI_CODING_AGENT_DIR/settings.json`, default `~/.pi/agent`).
pub fn settings_file(home: &Path) -> PathBuf {
    std::env::var_os("PI_CODING_AGENT_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| home.join(".pi").join("agent"))
        .join("settings.json")
}

/// The package sources pi's settings name.
pub fn installed(settings: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(settings).unwrap_or_default();
    let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    v["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| {
            p.as_str()
                .or_else(|| p["source"].as_str())
                .map(String::from)
        })
        .collect()
}

/// A git source without its `@ref` (the source itself when it has none).
pub fn without_ref(source: &str) -> &str {
    match source.rsplit_once('@') {
        Some((base, r)) if !r.contains('/') && base.contains("://") => base,
        _ => source,
    }
}

/// Whether an installed source is this package (any ref of it, or a checkout of it).
pub fn is_ours(source: &str) -> bool {
    source.contains("pi-ide-broker")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cargo_sources_become_pi_sources() {
        assert_eq!(
            from_cargo_source("git+https://github.com/o/pi-ide-broker?tag=v0.2.0#0123abc")
                .as_deref(),
            Some("git:https://github.com/o/pi-ide-broker@v0.2.0")
        );
        assert_eq!(
            from_cargo_source("git+git://127.0.0.1:9/local/pi-ide-broker.git#deadbeef").as_deref(),
            Some("git:git://127.0.0.1:9/local/pi-ide-broker.git@deadbeef")
        );
        assert_eq!(
            from_cargo_source("git+https://h/o/r?branch=main#c0ffee").as_deref(),
            Some("git:https://h/o/r@c0ffee")
        );
        assert_eq!(
            from_cargo_source("path+file:///home/u/src/pi-ide-broker"),
            None
        );
        assert_eq!(
            from_cargo_source("registry+https://github.com/rust-lang/crates.io-index"),
            None
        );
    }

    #[test]
    fn a_ref_is_cut_from_git_sources_only() {
        assert_eq!(without_ref("git:https://h/o/r@v1"), "git:https://h/o/r");
        assert_eq!(
            without_ref("git:git://127.0.0.1:9/l/r.git@abc"),
            "git:git://127.0.0.1:9/l/r.git"
        );
        assert_eq!(without_ref("git:https://h/o/r"), "git:https://h/o/r");
        assert_eq!(without_ref("/home/u@x/src"), "/home/u@x/src");
    }

    #[test]
    fn the_installed_binary_is_found_in_crates2() {
        let crates2 = r#"{"installs": {
            "ripgrep 14.1.0 (registry+https://github.com/rust-lang/crates.io-index)": {"bins": ["rg"]},
            "pi-ide-broker 0.1.0 (git+https://h/o/pi-ide-broker#abc)": {"bins": ["pi-ide-broker"]}
        }}"#;
        assert_eq!(
            installed_source_id(crates2).as_deref(),
            Some("git+https://h/o/pi-ide-broker#abc")
        );
        assert_eq!(installed_source_id("{}"), None);
        assert_eq!(installed_source_id("not json"), None);
    }
}
