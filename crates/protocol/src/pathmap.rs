//! `[[remote]]` path maps: an agent elsewhere's paths mapped to the host's and back.
//!
//! Paths of an agent that runs elsewhere (a container with the project bind-mounted, a dev
//! box over `ssh -R`) mapped to the host's and back, by configured prefixes. Prefixes match by
//! whole path components; `file://` URIs are mapped with their percent-encoding kept; Windows
//! drive paths are refused with a clear error instead of being mangled.

use super::Error;
use serde::Deserialize;
use serde_json::Value;
use std::path::{Component, Path, PathBuf};

/// One `[[remote]]` entry of the config: an agent-side prefix and the host folder it is.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteConfig {
    /// The remote's name, as sessions give it (`remote=<name>`, `mcp --remote NAME`).
    pub name: String,
    /// The prefix as the agent sees it (e.g. `/workspaces/app`).
    pub agent: PathBuf,
    /// The same folder on this machine (e.g. `/home/me/src/app`).
    pub host: PathBuf,
}

/// The keys whose string values are paths or file URIs, in every editor's shapes.
const PATH_KEYS: [&str; 9] = [
    "filePath",
    "fileUrl",
    "uri",
    "path",
    "rootPath",
    "fileName",
    "old_file_path",
    "new_file_path",
    "cwd",
];

/// The prefixes of one remote, both ways.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PathMap {
    /// (agent prefix, host prefix), longest agent prefix first.
    pairs: Vec<(PathBuf, PathBuf)>,
}

fn is_windows(p: &str) -> bool {
    let b = p.as_bytes();
    b.len() >= 2 && b[0].is_ascii_alphabetic() && b[1] == b':'
}

/// `a` with `prefix` replaced by `to`, when `prefix` is a whole-component prefix of `a`.
fn swap(a: &Path, prefix: &Path, to: &Path) -> Option<PathBuf> {
    let rest = a.strip_prefix(prefix).ok()?;
    if rest.components().any(|c| matches!(c, Component::ParentDir)) {
        return None;
    }
    Some(if rest.as_os_str().is_empty() {
        to.to_path_buf()
    } else {
        to.join(rest)
    })
}

impl PathMap {
    /// The map of the remote `name` from the config's entries (`None` when no entry has it).
    pub fn for_remote(entries: &[RemoteConfig], name: &str) -> Option<PathMap> {
        let mut pairs: Vec<(PathBuf, PathBuf)> = entries
            .iter()
            .filter(|r| r.name == name)
            .map(|r| (r.agent.clone(), r.host.clone()))
            .collect();
        if pairs.is_empty() {
            return None;
        }
        pairs.sort_by_key(|(a, _)| std::cmp::Reverse(a.components().count()));
        Some(PathMap { pairs })
    }

    fn map(&self, path: &str, to_host: bool) -> Result<Option<String>, Error> {
        if is_windows(path) {
            return Err(Error::WindowsPath(path.to_string()));
        }
        if !path.starts_with('/') {
            return Ok(None);
        }
        let trailing = path.len() > 1 && path.ends_with('/');
        let p = Path::new(path);
        for (agent, host) in &self.pairs {
            let (from, to) = if to_host {
                (agent, host)
            } else {
                (host, agent)
            };
            if let Some(mapped) = swap(p, from, to) {
                let mut s = mapped.display().to_string();
                if trailing && !s.ends_with('/') {
                    s.push('/');
                }
                return Ok(Some(s));
            }
        }
        Ok(None)
    }

    /// An agent-side path on the host (unchanged, `Ok(None)`, when outside every prefix).
    pub fn to_host(&self, path: &str) -> Result<Option<String>, Error> {
        self.map(path, true)
    }

    /// A host path as the agent sees it (`Ok(None)` when outside every prefix).
    pub fn to_agent(&self, path: &str) -> Result<Option<String>, Error> {
        self.map(path, false)
    }

    /// A `file://` URI mapped (the path part is percent-decoded to match and encoded again
    /// byte for byte as it was where it is unchanged).
    pub fn uri(&self, uri: &str, to_host: bool) -> Result<Option<String>, Error> {
        let Some(rest) = uri.strip_prefix("file://") else {
            return Ok(None);
        };
        let decoded = crate::percent::decode_path(rest);
        let Some(mapped) = self.map(&decoded, to_host)? else {
            return Ok(None);
        };
        Ok(Some(format!(
            "file://{}",
            crate::percent::encode_path(&mapped)
        )))
    }

    /// A path or a `file://` URI mapped (`None` when outside every prefix, or not mappable).
    fn one(&self, s: &str, to_host: bool) -> Option<String> {
        let mapped = if s.starts_with("file://") {
            self.uri(s, to_host)
        } else {
            self.map(s, to_host)
        };
        mapped.ok().flatten()
    }

    /// Maps, in place, every path or file URI in `v` (see [`rewrite_json`]); how many changed.
    pub fn map_json(&self, v: &mut Value, to_host: bool) -> usize {
        rewrite_json(v, &|s| self.one(s, to_host))
    }

    /// The first path or file URI under a path key of `v` that no prefix covers (it passes
    /// through unchanged; the session logs it once).
    pub fn first_unmapped(&self, v: &Value, to_host: bool) -> Option<String> {
        match v {
            Value::Object(map) => map.iter().find_map(|(k, val)| match val {
                Value::String(s)
                    if PATH_KEYS.contains(&k.as_str())
                        && (s.starts_with('/') || s.starts_with("file:///")) =>
                {
                    let mapped = if s.starts_with("file://") {
                        self.uri(s, to_host)
                    } else {
                        self.map(s, to_host)
                    };
                    matches!(mapped, Ok(None)).then(|| s.clone())
                }
                other => self.first_unmapped(other, to_host),
            }),
            Value::Array(items) => items.iter().find_map(|i| self.first_unmapped(i, to_host)),
            _ => None,
        }
    }

    /// A tool result's JSON texts mapped (see [`rewrite_result_texts`]).
    pub fn map_result_texts(&self, result: &mut Value, to_host: bool) -> usize {
        rewrite_result_texts(result, &|s| self.one(s, to_host))
    }
}

/// Rewrites, in place, every value under a key that holds a path or a file URI (`filePath`,
/// `fileUrl`, `uri`, `path`, `rootPath`, `fileName`, `old_file_path`, `new_file_path`, `cwd`)
/// and every object key that is a file URI (getDiagnostics' map), anywhere in `v`, by `f`
/// (`None`: left as it is). File contents are never looked at: only those keys. Returns how
/// many values changed. Shared by the `[[remote]]` maps and the WSL ↔ Windows paths.
pub fn rewrite_json(v: &mut Value, f: &dyn Fn(&str) -> Option<String>) -> usize {
    let mut n = 0;
    match v {
        Value::Object(map) => {
            let keys: Vec<String> = map.keys().cloned().collect();
            for k in keys {
                if k.starts_with("file://") {
                    if let Some(m) = f(&k) {
                        if let Some(val) = map.remove(&k) {
                            map.insert(m, val);
                            n += 1;
                        }
                    }
                }
            }
            for (k, val) in map.iter_mut() {
                if let (true, Value::String(s)) = (PATH_KEYS.contains(&k.as_str()), &*val) {
                    if let Some(m) = f(s) {
                        *val = Value::String(m);
                        n += 1;
                    }
                } else {
                    n += rewrite_json(val, f);
                }
            }
        }
        Value::Array(items) => {
            for item in items {
                n += rewrite_json(item, f);
            }
        }
        _ => {}
    }
    n
}

/// A tool result whose text items hold JSON (diagnostics, tabs, folders, selections): each
/// such text is parsed, rewritten by [`rewrite_json`] and written back. Texts that are not
/// JSON (an `openDiff`'s file contents) are left alone.
pub fn rewrite_result_texts(result: &mut Value, f: &dyn Fn(&str) -> Option<String>) -> usize {
    let mut n = 0;
    if let Some(Value::Array(items)) = result.get_mut("content") {
        for item in items {
            let Some(Value::String(text)) = item.get_mut("text") else {
                continue;
            };
            let trimmed = text.trim_start();
            if !(trimmed.starts_with('{') || trimmed.starts_with('[')) {
                continue;
            }
            if let Ok(mut inner) = serde_json::from_str::<Value>(text) {
                let changed = rewrite_json(&mut inner, f);
                if changed > 0 {
                    *text = inner.to_string();
                    n += changed;
                }
            }
        }
    }
    n
}

#[cfg(test)]
#[cfg(unix)] // `[[remote]]` maps hold POSIX host paths (a Windows host's are not mapped yet)
mod tests {
    use super::*;
    use serde_json::json;

    fn map() -> PathMap {
        PathMap::for_remote(
            &[
                RemoteConfig {
                    name: "box".into(),
                    agent: "/workspaces/app".into(),
                    host: "/home/me/src/app".into(),
                },
                RemoteConfig {
                    name: "box".into(),
                    agent: "/workspaces/app/vendor".into(),
                    host: "/opt/vendor".into(),
                },
                RemoteConfig {
                    name: "other".into(),
                    agent: "/x".into(),
                    host: "/y".into(),
                },
            ],
            "box",
        )
        .unwrap()
    }

    #[test]
    fn prefixes_match_whole_components_and_the_longest_wins() {
        let m = map();
        assert_eq!(
            m.to_host("/workspaces/app").unwrap().as_deref(),
            Some("/home/me/src/app")
        );
        assert_eq!(
            m.to_host("/workspaces/app/src/a.rs").unwrap().as_deref(),
            Some("/home/me/src/app/src/a.rs")
        );
        assert_eq!(m.to_host("/workspaces/application/a.rs").unwrap(), None);
        assert_eq!(
            m.to_host("/workspaces/app/vendor/x.rs").unwrap().as_deref(),
            Some("/opt/vendor/x.rs")
        );
        assert_eq!(
            m.to_agent("/home/me/src/app/b.rs").unwrap().as_deref(),
            Some("/workspaces/app/b.rs")
        );
        assert_eq!(m.to_agent("/home/me/src/apple").unwrap(), None);
        assert_eq!(m.to_host("relative/path").unwrap(), None);
        assert_eq!(m.to_host("/workspaces/app/../etc/passwd").unwrap(), None);
        assert!(PathMap::for_remote(&[], "box").is_none());
    }

    #[test]
    fn trailing_slashes_are_kept() {
        let m = map();
        assert_eq!(
            m.to_host("/workspaces/app/").unwrap().as_deref(),
            Some("/home/me/src/app/")
        );
        assert_eq!(
            m.to_host("/workspaces/app/docs/").unwrap().as_deref(),
            Some("/home/me/src/app/docs/")
        );
        // The root itself has no trailing slash to keep: an agent whose `/` is a host folder
        // sees that folder, not the folder with a slash.
        let root = PathMap::for_remote(
            &[RemoteConfig {
                name: "box".into(),
                agent: "/".into(),
                host: "/srv/box".into(),
            }],
            "box",
        )
        .unwrap();
        assert_eq!(root.to_host("/").unwrap().as_deref(), Some("/srv/box"));
        assert_eq!(root.to_host("/a/").unwrap().as_deref(), Some("/srv/box/a/"));
    }

    #[test]
    fn uris_keep_their_encoding() {
        let m = map();
        assert_eq!(
            m.uri("file:///workspaces/app/my%20file%23.rs", true)
                .unwrap()
                .as_deref(),
            Some("file:///home/me/src/app/my%20file%23.rs")
        );
        assert_eq!(
            m.uri("file:///home/me/src/app/%C3%A9t%C3%A9.rs", false)
                .unwrap()
                .as_deref(),
            Some("file:///workspaces/app/%C3%A9t%C3%A9.rs")
        );
        assert_eq!(m.uri("file:///elsewhere/a.rs", true).unwrap(), None);
        assert_eq!(m.uri("untitled:Untitled-1", true).unwrap(), None);
    }

    #[test]
    fn windows_drive_paths_are_refused_not_mangled() {
        let m = map();
        for p in ["C:\\Users\\me\\a.rs", "c:/Users/me/a.rs"] {
            let e = m.to_host(p).unwrap_err();
            assert!(e.to_string().contains("Windows drive path"), "{e}");
        }
    }

    #[test]
    fn json_keys_and_diagnostic_maps_are_mapped_contents_are_not() {
        let m = map();
        let mut sel = json!({"filePath": "/home/me/src/app/a.rs", "fileUrl": "file:///home/me/src/app/a.rs",
                             "text": "/home/me/src/app in a string the user selected"});
        assert_eq!(m.map_json(&mut sel, false), 2);
        assert_eq!(sel["filePath"], "/workspaces/app/a.rs");
        assert_eq!(
            sel["text"],
            "/home/me/src/app in a string the user selected"
        );
        let mut diag = json!({"content": [{"type": "text", "text": json!({"file:///home/me/src/app/a.rs": [{"message": "x"}]}).to_string()}]});
        assert_eq!(m.map_result_texts(&mut diag, false), 1);
        let inner: Value =
            serde_json::from_str(diag["content"][0]["text"].as_str().unwrap()).unwrap();
        assert!(
            inner.get("file:///workspaces/app/a.rs").is_some(),
            "{inner}"
        );
        let mut saved = json!({"content": [{"type": "text", "text": "FILE_SAVED"}, {"type": "text", "text": "let p = \"/home/me/src/app\";"}]});
        assert_eq!(m.map_result_texts(&mut saved, false), 0);
        assert_eq!(
            m.first_unmapped(&json!({"a": [{"uri": "file:///etc/x"}]}), true)
                .as_deref(),
            Some("file:///etc/x")
        );
        assert_eq!(
            m.first_unmapped(&json!({"filePath": "/workspaces/app/a"}), true),
            None
        );
        let mut args = json!({"old_file_path": "/workspaces/app/a.rs", "new_file_path": "/workspaces/app/a.rs", "new_file_contents": "/workspaces/app", "tab_name": "t"});
        assert_eq!(m.map_json(&mut args, true), 2);
        assert_eq!(args["new_file_contents"], "/workspaces/app");
    }

    /// Arrays are walked (getOpenEditors' tabs, a folder list), and the count is the number
    /// of values that changed, nested or not.
    #[test]
    fn arrays_are_walked_and_every_change_is_counted() {
        let m = map();
        let mut tabs = json!({"tabs": [
            {"uri": "file:///home/me/src/app/a.rs", "label": "a.rs"},
            {"uri": "file:///home/me/src/app/b.rs", "label": "b.rs"},
            [{"path": "/home/me/src/app/c.rs"}],
            {"uri": "file:///elsewhere/d.rs"}
        ]});
        assert_eq!(m.map_json(&mut tabs, false), 3);
        assert_eq!(tabs["tabs"][0]["uri"], "file:///workspaces/app/a.rs");
        assert_eq!(tabs["tabs"][2][0]["path"], "/workspaces/app/c.rs");
        assert_eq!(tabs["tabs"][3]["uri"], "file:///elsewhere/d.rs");
        let mut nested =
            json!({"a": {"filePath": "/home/me/src/app/x"}, "b": {"cwd": "/home/me/src/app"}});
        assert_eq!(m.map_json(&mut nested, false), 2);
    }

    /// Only a path key holding an absolute path or a file URI can be unmapped: text that
    /// merely looks like a path, and relative paths, are not reported.
    #[test]
    fn only_absolute_paths_under_path_keys_are_reported_unmapped() {
        let m = map();
        for v in [
            json!({"text": "/etc/passwd is mentioned"}),
            json!({"label": "hello"}),
            json!({"filePath": "src/relative.rs"}),
            json!({"text": "file:///etc/x"}),
        ] {
            assert_eq!(m.first_unmapped(&v, true), None, "{v}");
        }
        assert_eq!(
            m.first_unmapped(&json!({"label": "x", "path": "/etc/x"}), true)
                .as_deref(),
            Some("/etc/x")
        );
    }

    /// A JSON text in which nothing maps is left byte for byte as the editor wrote it.
    #[test]
    fn a_json_text_with_nothing_to_map_is_left_as_written() {
        let m = map();
        let text = "{ \"tabs\": [ {\"label\": \"a\"} ] }";
        let mut result = json!({"content": [{"type": "text", "text": text}]});
        assert_eq!(m.map_result_texts(&mut result, false), 0);
        assert_eq!(result["content"][0]["text"], text);
    }
}
