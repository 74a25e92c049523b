//! Windows paths as they reach the broker, and the WSL ↔ Windows mapping.
//!
//! An editor on Windows writes `C:\Users\me\app` (or `c:/Users/me/app`, `\\?\C:\…`,
//! `file:///c%3A/Users/me/app`); an agent in WSL sees the same folder as `/mnt/c/Users/me/app`,
//! and its own files as `\\wsl.localhost\<distro>\home\me\…` from the Windows side. [`Wsl`]
//! maps every path that crosses between a Windows editor and the broker in WSL, both ways;
//! [`compare_key`] is how paths compare on Windows itself (drive letter and case folded,
//! either slash, the verbatim and UNC forms). Pure string work: tested on every platform.

use serde_json::Value;

/// A Windows absolute path, taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WinPath {
    /// `C:\a\b`: the drive letter (upper case) and the components.
    Drive(char, Vec<String>),
    /// `\\server\share\a`: server, share and the components after them.
    Unc(String, String, Vec<String>),
}

fn parts(rest: &str) -> Vec<String> {
    rest.split(['\\', '/'])
        .filter(|p| !p.is_empty() && *p != ".")
        .fold(Vec::new(), |mut out, p| {
            if p == ".." {
                out.pop();
            } else {
                out.push(p.to_string());
            }
            out
        })
}

/// `C:\…`, `c:/…`, `\\?\C:\…`, `\\?\UNC\server\share\…`, `\\server\share\…` (either slash);
/// `None` for anything else (a POSIX path, a relative one, a bare `C:`).
pub fn parse(s: &str) -> Option<WinPath> {
    let s = s
        .strip_prefix(r"\\?\")
        .or_else(|| s.strip_prefix("//?/"))
        .map(|rest| {
            rest.strip_prefix("UNC\\")
                .map(|unc| format!(r"\\{unc}"))
                .unwrap_or_else(|| rest.to_string())
        })
        .unwrap_or_else(|| s.to_string());
    let b = s.as_bytes();
    if b.len() >= 3 && b[0].is_ascii_alphabetic() && b[1] == b':' && matches!(b[2], b'\\' | b'/') {
        return Some(WinPath::Drive(
            char::from(b[0].to_ascii_uppercase()),
            parts(&s[3..]),
        ));
    }
    let unc = s.strip_prefix(r"\\").or_else(|| s.strip_prefix("//"))?;
    let mut it = parts(unc).into_iter();
    let (server, share) = (it.next()?, it.next()?);
    Some(WinPath::Unc(server, share, it.collect()))
}

/// Whether a path a peer sent is absolute on this platform: `/…` everywhere, and on Windows
/// also a drive, verbatim or UNC path (a peer's cwd, a tool's `filePath`).
pub fn is_absolute(s: &str) -> bool {
    s.starts_with('/') || (cfg!(windows) && parse(s).is_some())
}

/// A path as a Windows user (and `cmd.exe`) writes it: the verbatim prefix that
/// `canonicalize` adds taken off (`\\?\C:\x` → `C:\x`, `\\?\UNC\srv\s` → `\\srv\s`);
/// anything else unchanged.
pub fn plain(s: &str) -> String {
    match s.strip_prefix(r"\\?\") {
        Some(rest) => match rest.strip_prefix(r"UNC\") {
            Some(unc) => format!(r"\\{unc}"),
            None => rest.to_string(),
        },
        None => s.to_string(),
    }
}

/// [`plain`] on a path, on Windows only (elsewhere the path is kept byte for byte).
pub fn plain_path(p: std::path::PathBuf) -> std::path::PathBuf {
    if cfg!(windows) {
        std::path::PathBuf::from(plain(&p.to_string_lossy()))
    } else {
        p
    }
}

/// The form Windows paths compare in: drive letter upper case, the rest case-folded (NTFS
/// and the editors compare without case), `\` between components, the verbatim prefix gone.
/// `None` for a path that is not a Windows absolute path.
pub fn compare_key(s: &str) -> Option<String> {
    let (head, rest) = match parse(s)? {
        WinPath::Drive(d, rest) => (format!("{d}:"), rest),
        WinPath::Unc(server, share, rest) => (
            format!(r"\\{}\{}", server.to_lowercase(), share.to_lowercase()),
            rest,
        ),
    };
    let mut key = head;
    for p in rest {
        key.push('\\');
        key.push_str(&p.to_lowercase());
    }
    if !key.contains('\\') || key.ends_with(':') {
        key.push('\\');
    }
    Some(key)
}

/// What Gemini CLI's companion puts between folders in `workspacePath` on this platform
/// (node's `path.delimiter`: `;` on Windows, where `:` is in every drive path).
pub const FOLDER_LIST_DELIMITER: &str = if cfg!(windows) { ";" } else { ":" };

/// The WSL side of a Windows machine: where the drives are mounted (`/mnt` unless
/// `/etc/wsl.conf` says otherwise) and the distro's name (for `\\wsl.localhost\<distro>\…`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wsl {
    /// The drives' mount root, without a trailing slash (`/mnt`).
    pub mount_root: String,
    /// This distro's name (`WSL_DISTRO_NAME`), if known.
    pub distro: Option<String>,
}

impl Wsl {
    /// A Windows path as WSL sees it: `C:\a` → `/mnt/c/a`; `\\wsl.localhost\<distro>\x` (or
    /// `\\wsl$\…`) → `/x`; `None` for what WSL cannot reach (another machine's share).
    pub fn to_linux(&self, s: &str) -> Option<String> {
        match parse(s)? {
            WinPath::Drive(d, rest) => {
                let mut out = format!("{}/{}", self.mount_root, d.to_ascii_lowercase());
                for p in rest {
                    out.push('/');
                    out.push_str(&p);
                }
                Some(out)
            }
            WinPath::Unc(server, share, rest) => {
                let ours = matches!(
                    server.to_ascii_lowercase().as_str(),
                    "wsl$" | "wsl.localhost"
                ) && self
                    .distro
                    .as_deref()
                    .is_none_or(|d| d.eq_ignore_ascii_case(&share));
                ours.then(|| format!("/{}", rest.join("/")))
            }
        }
    }

    /// A WSL path as Windows sees it: `/mnt/c/a` → `C:\a`; another absolute path →
    /// `\\wsl.localhost\<distro>\…` when the distro is known; `None` otherwise.
    pub fn to_windows(&self, s: &str) -> Option<String> {
        if !s.starts_with('/') {
            return None;
        }
        if let Some(rest) = s.strip_prefix(self.mount_root.as_str()) {
            let b = rest.as_bytes();
            if b.len() >= 2
                && b[0] == b'/'
                && b[1].is_ascii_alphabetic()
                && (b.len() == 2 || b[2] == b'/')
            {
                let drive = char::from(b[1].to_ascii_uppercase());
                let tail = parts(&rest[2..]).join("\\");
                return Some(format!("{drive}:\\{tail}"));
            }
        }
        let distro = self.distro.as_deref()?;
        Some(format!(r"\\wsl.localhost\{distro}{}", s.replace('/', "\\")))
    }

    /// A path or `file://` URI mapped one way (`to_linux`: from the editor), `None` if it
    /// does not map.
    pub fn one(&self, s: &str, to_linux: bool) -> Option<String> {
        if let Some(rest) = s.strip_prefix("file://") {
            let decoded = crate::percent::decode_path(rest);
            if to_linux {
                // `file:///c%3A/x` and `file:///C:/x`: the path after the third slash.
                let path = decoded.strip_prefix('/').unwrap_or(&decoded);
                let mapped = self.to_linux(path)?;
                return Some(format!("file://{}", crate::percent::encode_path(&mapped)));
            }
            let mapped = self.to_windows(&decoded)?.replace('\\', "/");
            let uri_path = match mapped.strip_prefix("//") {
                // A UNC path: `file://server/share/…`.
                Some(unc) => unc.to_string(),
                None => format!("/{mapped}"),
            };
            return Some(format!("file://{}", crate::percent::encode_path(&uri_path)));
        }
        if to_linux {
            self.to_linux(s)
        } else {
            self.to_windows(s)
        }
    }

    /// Rewrites every path and file URI in a JSON-RPC frame's text for the other side;
    /// the text unchanged when nothing in it maps (or it is not JSON).
    pub fn frame(&self, text: &str, to_linux: bool) -> String {
        let Ok(mut v) = serde_json::from_str::<Value>(text) else {
            return text.to_string();
        };
        let f = |s: &str| self.one(s, to_linux);
        let mut n = crate::pathmap::rewrite_json(&mut v, &f);
        if let Some(result) = v.get_mut("result") {
            n += crate::pathmap::rewrite_result_texts(result, &f);
        }
        if n > 0 {
            v.to_string()
        } else {
            text.to_string()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn wsl() -> Wsl {
        Wsl {
            mount_root: "/mnt".into(),
            distro: Some("Ubuntu".into()),
        }
    }

    #[test]
    fn every_windows_form_parses_to_the_same_path() {
        let want = WinPath::Drive('C', vec!["Users".into(), "me".into(), "app".into()]);
        for s in [
            r"C:\Users\me\app",
            r"c:\Users\me\app\",
            "C:/Users/me/app",
            r"\\?\C:\Users\me\app",
            r"C:\Users\me\.\x\..\app",
        ] {
            assert_eq!(parse(s), Some(want.clone()), "{s}");
        }
        assert_eq!(
            parse(r"\\?\UNC\srv\share\a"),
            Some(WinPath::Unc("srv".into(), "share".into(), vec!["a".into()]))
        );
        assert_eq!(parse("/home/me"), None);
        assert_eq!(parse("C:"), None);
        assert_eq!(parse("app"), None);
        // Relative forms: drive-relative `C:x`, and a folder whose second letter is no colon.
        assert_eq!(parse("C:x"), None);
        assert_eq!(parse("ab/c"), None);
        assert_eq!(parse(r"ab\c"), None);
        // A drive path is absolute only where it names a drive.
        assert_eq!(is_absolute(r"C:\x"), cfg!(windows));
        assert!(is_absolute("/x") && !is_absolute("x/y"));
    }

    #[test]
    fn canonical_verbatim_paths_are_written_plainly() {
        assert_eq!(plain(r"\\?\C:\Users\me\b.exe"), r"C:\Users\me\b.exe");
        assert_eq!(plain(r"\\?\UNC\srv\share\b.exe"), r"\\srv\share\b.exe");
        assert_eq!(plain(r"C:\x"), r"C:\x");
        assert_eq!(plain("/usr/bin/x"), "/usr/bin/x");
        let exe = std::path::PathBuf::from("/usr/bin/x");
        assert_eq!(plain_path(exe.clone()), exe);
    }

    #[test]
    fn windows_paths_compare_without_case_or_slash_differences() {
        assert_eq!(
            compare_key(r"c:\Users\Me\App"),
            compare_key("C:/users/me/app/")
        );
        assert_eq!(compare_key(r"\\?\C:\x"), compare_key(r"C:\X"));
        assert_ne!(compare_key(r"C:\x"), compare_key(r"D:\x"));
        assert_eq!(compare_key(r"C:\").as_deref(), Some("C:\\"));
        assert_eq!(
            compare_key(r"\\Server\Share\a").as_deref(),
            Some(r"\\server\share\a")
        );
    }

    #[test]
    fn wsl_maps_drives_and_its_own_share_both_ways() {
        let w = wsl();
        assert_eq!(
            w.to_linux(r"C:\Users\me\app").as_deref(),
            Some("/mnt/c/Users/me/app")
        );
        assert_eq!(w.to_linux("d:/x").as_deref(), Some("/mnt/d/x"));
        assert_eq!(
            w.to_linux(r"\\wsl.localhost\Ubuntu\home\me").as_deref(),
            Some("/home/me")
        );
        assert_eq!(w.to_linux(r"\\wsl$\Other\home\me"), None);
        assert_eq!(w.to_linux(r"\\server\share\x"), None);
        assert_eq!(
            w.to_windows("/mnt/c/Users/me/app").as_deref(),
            Some(r"C:\Users\me\app")
        );
        assert_eq!(w.to_windows("/mnt/c").as_deref(), Some(r"C:\"));
        assert_eq!(
            w.to_windows("/home/me/x").as_deref(),
            Some(r"\\wsl.localhost\Ubuntu\home\me\x")
        );
        // `/mnt` itself and `/mnt/cd` are no drive.
        assert_eq!(
            w.to_windows("/mnt").as_deref(),
            Some(r"\\wsl.localhost\Ubuntu\mnt")
        );
        assert_eq!(
            w.to_windows("/mnt/cd/x").as_deref(),
            Some(r"\\wsl.localhost\Ubuntu\mnt\cd\x")
        );
        let no_distro = Wsl {
            distro: None,
            ..wsl()
        };
        assert_eq!(no_distro.to_windows("/home/me"), None);
        for p in ["/mnt/c/Users/me/a b/ü.rs", "/mnt/z/x"] {
            assert_eq!(w.to_linux(&w.to_windows(p).unwrap()).as_deref(), Some(p));
        }
    }

    /// A daemon in WSL without `WSL_DISTRO_NAME` (started by a service manager that clears
    /// the environment): the drives still map both ways, `\\wsl$\<any>\…` is taken for this
    /// distro's own files, and only a Linux path outside the drives has no Windows name.
    #[test]
    fn without_a_distro_name_the_drives_still_map_both_ways() {
        let w = Wsl {
            mount_root: "/mnt".into(),
            distro: None,
        };
        assert_eq!(
            w.to_linux(r"C:\Users\me\app").as_deref(),
            Some("/mnt/c/Users/me/app")
        );
        assert_eq!(
            w.to_windows("/mnt/c/Users/me/app").as_deref(),
            Some(r"C:\Users\me\app")
        );
        assert_eq!(
            w.to_linux(r"\\wsl.localhost\Debian\home\me").as_deref(),
            Some("/home/me")
        );
        assert_eq!(w.to_linux(r"\\wsl$\Ubuntu\etc").as_deref(), Some("/etc"));
        assert_eq!(w.to_linux(r"\\server\share\x"), None);
        assert_eq!(w.to_windows("/home/me"), None);
        assert_eq!(
            w.one("file:///c%3A/p/a.rs", true).as_deref(),
            Some("file:///mnt/c/p/a.rs")
        );
        assert_eq!(
            w.one("file:///mnt/c/p/a.rs", false).as_deref(),
            Some("file:///C:/p/a.rs")
        );
        let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "openFile", "arguments": {"filePath": "/mnt/c/p/a.rs", "other": "/home/me/b.rs"}}});
        let out: Value = serde_json::from_str(&w.frame(&call.to_string(), false)).unwrap();
        assert_eq!(out["params"]["arguments"]["filePath"], r"C:\p\a.rs");
        assert_eq!(out["params"]["arguments"]["other"], "/home/me/b.rs");
    }

    #[test]
    fn file_uris_map_in_the_forms_editors_write() {
        let w = wsl();
        assert_eq!(
            w.one("file:///c%3A/Users/me/a%20b.rs", true).as_deref(),
            Some("file:///mnt/c/Users/me/a%20b.rs")
        );
        assert_eq!(
            w.one("file:///C:/Users/me/x.rs", true).as_deref(),
            Some("file:///mnt/c/Users/me/x.rs")
        );
        assert_eq!(
            w.one("file:///mnt/c/Users/me/a%20b.rs", false).as_deref(),
            Some("file:///C:/Users/me/a%20b.rs")
        );
        assert_eq!(
            w.one("file:///home/me/x", false).as_deref(),
            Some("file://wsl.localhost/Ubuntu/home/me/x")
        );
    }

    #[test]
    fn a_frame_maps_paths_and_json_texts_but_not_file_contents() {
        let w = wsl();
        let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "openDiff", "arguments": {"old_file_path": "/mnt/c/p/a.txt",
            "new_file_path": "/mnt/c/p/a.txt", "new_file_contents": "/mnt/c/p/a.txt stays"}}});
        let out: Value = serde_json::from_str(&w.frame(&call.to_string(), false)).unwrap();
        let args = &out["params"]["arguments"];
        assert_eq!(args["old_file_path"], r"C:\p\a.txt");
        assert_eq!(args["new_file_contents"], "/mnt/c/p/a.txt stays");
        let answer = json!({"jsonrpc": "2.0", "id": 1, "result": {"content": [{"type": "text",
            "text": json!([{"uri": "file:///c%3A/p/a.txt", "diagnostics": []}]).to_string()}]}});
        let back: Value = serde_json::from_str(&w.frame(&answer.to_string(), true)).unwrap();
        let inner: Value =
            serde_json::from_str(back["result"]["content"][0]["text"].as_str().unwrap()).unwrap();
        assert_eq!(inner[0]["uri"], "file:///mnt/c/p/a.txt");
        // Byte for byte, as the peer wrote it (spacing and key order kept).
        let untouched = r#"{"method": "x", "jsonrpc": "2.0", "params": {"n": 1}}"#;
        assert_eq!(w.frame(untouched, true), untouched);
    }
}
