//! Qwen Code's variant of the companion discovery (Qwen Code is a fork of Gemini CLI and
//! speaks the same MCP over Streamable HTTP): `~/.qwen/ide/<PORT>.lock`, pointing at the gemini
//! door's endpoint for the same editor. Without `QWEN_CODE_IDE_SERVER_PORT` Qwen Code takes the
//! newest lock file whose workspace holds its cwd, and deletes one whose `ppid` is dead (so
//! `ppid` is the editor's pid); `ideInfo` spares it its "am I in VS Code's terminal" check.

use serde_json::Value;
use std::path::{Path, PathBuf};

/// `<port>.lock` for the endpoint on `port`, with the same fields the gemini file has.
pub(super) fn write(dir: &Path, port: u16, gemini_body: &Value) -> std::io::Result<PathBuf> {
    let path = dir.join(format!("{port}.lock"));
    let mut body = gemini_body.clone();
    let info = &gemini_body["ideInfo"];
    body["ideName"] = info["displayName"].clone();
    body["ppid"] = gemini_body[super::MARKER]["editorPid"].clone();
    crate::registry::state::write_atomic_unsynced(&path, body.to_string().as_bytes())?;
    Ok(path)
}

/// True for a name Qwen Code reads as a lock file (`<digits>.lock`).
pub(super) fn is_lock_name(name: &str) -> bool {
    name.strip_suffix(".lock")
        .is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_lock_file_carries_what_qwen_code_reads() {
        let dir = tempfile::tempdir().unwrap();
        let gemini = json!({"port": 7, "workspacePath": "/a:/b", "authToken": "t",
            "ideInfo": {"name": "neovim", "displayName": "Neovim"},
            super::super::MARKER: {"pid": 1, "editorPid": 42}});
        let path = write(dir.path(), 7, &gemini).unwrap();
        assert!(path.ends_with("7.lock"));
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(v["ppid"], 42);
        assert_eq!(v["ideName"], "Neovim");
        assert_eq!(v["workspacePath"], "/a:/b");
        assert!(
            is_lock_name("123.lock") && !is_lock_name(".123.lock.tmp") && !is_lock_name("x.lock")
        );
    }
}
