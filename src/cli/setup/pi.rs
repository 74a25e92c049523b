//! Which pi package source setup installs, what pi already has, and whether pi loads it.
//!
//! By default the source is the extension this binary carries ([`super::extension`]), written
//! to the broker's data dir: a local package, the same version as the binary, with nothing
//! for npm to do. `--pi-source` names any other (`npm:pi-ide-broker`, `git:<url>@<ref>`, a dir).

use serde_json::Value;
use std::path::{Path, PathBuf};

/// Where the extension comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// A `pi install` source the user gave (`--pi-source`).
    Given(String),
    /// The extension this binary carries, written to this dir.
    Bundled(PathBuf),
}

impl Source {
    /// The source for this run: `--pi-source`, else the carried extension in `data_dir`.
    pub fn resolve(flag: Option<&str>, data_dir: &Path) -> Source {
        match flag {
            Some(s) => Source::Given(s.to_string()),
            None => Source::Bundled(super::extension::dir(data_dir)),
        }
    }

    /// The argument to `pi install` (and the name pi's settings keep it under).
    pub fn arg(&self) -> String {
        match self {
            Source::Given(s) => s.clone(),
            Source::Bundled(p) => p.display().to_string(),
        }
    }
}

/// pi's settings file (`$PI_CODING_AGENT_DIR/settings.json`, default `~/.pi/agent`).
pub fn settings_file(home: &Path) -> PathBuf {
    std::env::var_os("PI_CODING_AGENT_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| home.join(".pi").join("agent"))
        .join("settings.json")
}

/// The package sources pi's settings name; a local one as the absolute path pi resolves it to
/// (pi writes a relative path, from the settings file's folder).
pub fn installed(settings: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(settings).unwrap_or_default();
    let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    let base = settings.parent().unwrap_or(Path::new("/"));
    v["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p.as_str().or_else(|| p["source"].as_str()))
        .map(|s| resolve_local(base, s))
        .collect()
}

/// `source` as pi reads it: a relative local path joined to `base` and normalised; anything
/// else (`npm:`, `git:`, a URL, an absolute path) as it is.
fn resolve_local(base: &Path, source: &str) -> String {
    let remote = ["npm:", "git:", "git@", "http://", "https://", "ssh://"];
    if remote.iter().any(|r| source.starts_with(r)) || Path::new(source).is_absolute() {
        return source.to_string();
    }
    let mut out = PathBuf::new();
    for part in base.join(source).components() {
        match part {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out.display().to_string()
}

/// Whether an installed source is this package (from npm, git, a clone or setup's copy): by
/// its name, or for a folder of another name, by the name its `package.json` gives.
pub fn is_ours(source: &str) -> bool {
    if source.contains("pi-ide-broker") {
        return true;
    }
    let manifest = Path::new(source).join("package.json");
    std::fs::read_to_string(manifest)
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .and_then(|v| v["name"].as_str().map(|n| n.starts_with("pi-ide-broker")))
        .unwrap_or(false)
}

/// The flag only this extension registers: `pi --help` lists it once pi has loaded it.
pub const LOADED_MARK: &str = "--pi-ide-suggestion-model";

/// What `pi --help` (which loads every installed extension, then prints their flags) says of
/// the extension: `Ok` when pi loaded it, else pi's own error line about it (or a line saying
/// pi did not list it).
pub fn load_verdict(help_output: &str, source: &str) -> Result<(), String> {
    let failure = help_output
        .lines()
        .find(|l| l.contains("Failed to load extension") && (is_ours(l) || l.contains(source)));
    match failure {
        Some(line) => Err(line.trim().to_string()),
        None if help_output.contains(LOADED_MARK) => Ok(()),
        None => Err(format!(
            "pi does not list the extension's flag {LOADED_MARK} in `pi --help`"
        )),
    }
}

/// The node pi needs (its `engines`; the README says the same).
pub const MIN_NODE: (u32, u32) = (22, 19);

/// When `output` is node dying on a version too old for pi (node ends an uncaught error with
/// `Node.js v20.20.2`): that version and node's own error line (`SyntaxError: …`), which the
/// stack between them would otherwise hide.
pub fn old_node(output: &str) -> Option<(String, String)> {
    let version = output
        .lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix("Node.js v"))?;
    let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
    let major = parts.next().flatten()?;
    let minor = parts.next().flatten().unwrap_or(0);
    if (major, minor) >= MIN_NODE {
        return None;
    }
    let error = output
        .lines()
        .map(str::trim)
        .find(|l| {
            l.split(':')
                .next()
                .is_some_and(|head| head.ends_with("Error") && !head.contains(' '))
        })
        .unwrap_or("node stopped with an error");
    Some((format!("v{version}"), error.to_string()))
}

/// What to tell the user when pi died on an old node: the cause and the repair.
pub fn old_node_line(output: &str) -> Option<(String, String)> {
    let (version, error) = old_node(output)?;
    let (major, minor) = MIN_NODE;
    Some((
        format!("pi cannot run on node {version} (it needs {major}.{minor} or newer): {error}"),
        format!(
            "install node {major} (nodejs.org, or `nvm install {major}` / `fnm install {major}`), put it first on your PATH (`node --version` says v{major}.{minor} or newer), then run setup again"
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pi_dying_on_an_old_node_names_the_version_and_nodes_own_error() {
        let out = "file:///x/cli.js:2\nimport { createRequire, enableCompileCache } from \"node:module\";\n                        ^^^^^^^^^^^^^^^^^^\nSyntaxError: The requested module 'node:module' does not provide an export named 'enableCompileCache'\n    at ModuleJob._instantiate (node:internal/modules/esm/module_job:213:21)\n\nNode.js v20.20.2\n";
        let (version, error) = old_node(out).expect("an old node");
        assert_eq!(version, "v20.20.2");
        assert!(
            error.starts_with("SyntaxError: The requested module"),
            "{error}"
        );
        let (message, fix) = old_node_line(out).expect("a line");
        assert!(
            message.contains("v20.20.2") && message.contains("22.19"),
            "{message}"
        );
        assert!(fix.contains("install node 22"), "{fix}");
        assert_eq!(old_node("boom\nNode.js v22.19.0\n"), None);
        assert_eq!(old_node("boom\nNode.js v24.1.0\n"), None);
        assert_eq!(old_node("npm error 404\n"), None);
    }

    #[cfg(unix)] // POSIX paths, FIFOs or child processes
    #[test]
    fn the_carried_extension_is_the_default_and_a_flag_overrides_it() {
        let data = Path::new("/home/u/.local/share/pi-ide-broker");
        assert_eq!(
            Source::resolve(None, data).arg(),
            "/home/u/.local/share/pi-ide-broker/pi-extension"
        );
        assert_eq!(
            Source::resolve(Some("npm:pi-ide-broker"), data),
            Source::Given("npm:pi-ide-broker".into())
        );
    }

    #[cfg(unix)] // POSIX paths, FIFOs or child processes
    #[test]
    fn a_relative_local_source_is_read_as_pi_resolves_it() {
        let base = Path::new("/home/u/.pi/agent");
        assert_eq!(
            resolve_local(base, "../../.local/share/pi-ide-broker/pi-extension"),
            "/home/u/.local/share/pi-ide-broker/pi-extension"
        );
        assert_eq!(resolve_local(base, "./x"), "/home/u/.pi/agent/x");
        for kept in [
            "npm:pi-ide-broker",
            "git:github.com/o/r@v1",
            "https://h/r",
            "/abs/p",
        ] {
            assert_eq!(resolve_local(base, kept), kept);
        }
    }

    /// Recorded from pi 1.6.0's `pi --help` with the extension installed, and with a copy of it
    /// that pi refused (its flag registered twice).
    #[test]
    fn pi_help_tells_a_loaded_extension_from_a_refused_one() {
        let loaded = "Usage: pi [options]\n  --pi-ide-suggestion-model <value>Model for inline suggestions\n";
        assert_eq!(load_verdict(loaded, "/h/x"), Ok(()));
        let refused = "Error: Failed to load extension \"/h/.local/share/pi-ide-broker/pi-extension/index.ts\": Cannot find module 'ws'\nUsage: pi [options]\n";
        assert_eq!(
            load_verdict(refused, "/h/x"),
            Err("Error: Failed to load extension \"/h/.local/share/pi-ide-broker/pi-extension/index.ts\": Cannot find module 'ws'".into())
        );
        let other = "Error: Failed to load extension \"/h/other/index.ts\": boom\nUsage: pi\n";
        assert!(load_verdict(other, "/h/x").is_err_and(|e| e.contains("does not list")));
        // A source of another name (`--pi-source /h/other`) is told by its path.
        assert_eq!(
            load_verdict(other, "/h/other"),
            Err("Error: Failed to load extension \"/h/other/index.ts\": boom".into())
        );
    }
}
