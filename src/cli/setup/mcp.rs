//! The MCP entries `setup` prints and, with `--write`, adds: Claude Code (`claude mcp add`),
//! Codex (`~/.codex/config.toml`), OpenCode (`opencode.json`, key `mcp`) and Gemini CLI
//! (`~/.gemini/settings.json`). Each is added next to what is there, never over it.

use super::jsonedit::{self, Added};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// The server name every client gets (Claude Code reserves `ide`).
pub const NAME: &str = "editor";

/// A client configured through a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileClient {
    /// `~/.codex/config.toml` (`$CODEX_HOME`), table `[mcp_servers.editor]`.
    Codex,
    /// `~/.config/opencode/opencode.json`, object `mcp.editor`.
    OpenCode,
    /// `~/.gemini/settings.json`, object `mcpServers.editor`.
    Gemini,
}

/// Every file client, in the order setup handles them.
pub const FILE_CLIENTS: [FileClient; 3] =
    [FileClient::Codex, FileClient::OpenCode, FileClient::Gemini];

/// Where a client's files are, from the environment setup runs in.
pub struct Homes {
    /// `$HOME`.
    pub home: PathBuf,
    /// `$XDG_CONFIG_HOME` or `~/.config`.
    pub config_home: PathBuf,
    /// `$CODEX_HOME` when set.
    pub codex_home: Option<PathBuf>,
}

impl FileClient {
    /// Its name in the record and in setup's lines.
    pub fn id(self) -> &'static str {
        match self {
            FileClient::Codex => "codex",
            FileClient::OpenCode => "opencode",
            FileClient::Gemini => "gemini",
        }
    }

    /// Its name for people.
    pub fn title(self) -> &'static str {
        match self {
            FileClient::Codex => "Codex",
            FileClient::OpenCode => "OpenCode",
            FileClient::Gemini => "Gemini CLI",
        }
    }

    /// The command whose presence on `PATH` says the client is installed.
    pub fn command(self) -> &'static str {
        match self {
            FileClient::Codex => "codex",
            FileClient::OpenCode => "opencode",
            FileClient::Gemini => "gemini",
        }
    }

    /// The config file.
    pub fn file(self, h: &Homes) -> PathBuf {
        match self {
            FileClient::Codex => h
                .codex_home
                .clone()
                .unwrap_or_else(|| h.home.join(".codex"))
                .join("config.toml"),
            FileClient::OpenCode => h.config_home.join("opencode").join("opencode.json"),
            FileClient::Gemini => h.home.join(".gemini").join("settings.json"),
        }
    }

    /// The JSON container key and entry (`None` for Codex, which is TOML).
    fn json_entry(self, bin: &str) -> Option<(&'static str, Value)> {
        match self {
            FileClient::Codex => None,
            FileClient::OpenCode => Some((
                "mcp",
                json!({"type": "local", "command": [bin, "mcp"], "enabled": true}),
            )),
            FileClient::Gemini => Some(("mcpServers", json!({"command": bin, "args": ["mcp"]}))),
        }
    }

    /// The entry as it would be written, for people to read or paste.
    pub fn snippet(self, bin: &str) -> String {
        match self.json_entry(bin) {
            Some((container, entry)) => json!({ container: { NAME: entry } }).to_string(),
            None => codex_block(bin).trim().to_string(),
        }
    }
}

/// The Claude Code command that adds the server for this user.
pub fn claude_add(bin: &str) -> Vec<String> {
    [
        "claude",
        "mcp",
        "add",
        "--scope",
        "user",
        NAME,
        "--",
        bin,
        "mcp",
        "--dialect",
        "claude",
    ]
    .map(String::from)
    .to_vec()
}

/// Claude Code's user config (`$CLAUDE_CONFIG_DIR/.claude.json`, default `~/.claude.json`).
pub fn claude_config(home: &Path) -> PathBuf {
    match std::env::var_os("CLAUDE_CONFIG_DIR").filter(|v| !v.is_empty()) {
        Some(d) => PathBuf::from(d).join(".claude.json"),
        None => home.join(".claude.json"),
    }
}

/// The user-scope `editor` MCP server Claude Code has, if any.
pub fn claude_entry(home: &Path) -> Option<Value> {
    let text = std::fs::read_to_string(claude_config(home)).ok()?;
    let v: Value = serde_json::from_str(&text).ok()?;
    v["mcpServers"].get(NAME).cloned()
}

/// Whether a Claude Code entry runs this broker's `mcp --dialect claude`.
pub fn is_claude_entry(entry: &Value, bin: &str) -> bool {
    entry["command"] == bin && entry["args"] == json!(["mcp", "--dialect", "claude"])
}

/// The Claude Code command that removes it again.
pub fn claude_remove() -> Vec<String> {
    ["claude", "mcp", "remove", "--scope", "user", NAME]
        .map(String::from)
        .to_vec()
}

fn codex_block(bin: &str) -> String {
    let bin = toml::Value::String(bin.to_string());
    format!("\n[mcp_servers.{NAME}]\ncommand = {bin}\nargs = [\"mcp\"]\n")
}

/// What adding the entry to a file's text came to.
#[derive(Debug, PartialEq)]
pub enum Plan {
    /// Write this text; whether the servers table or object was created.
    Write(String, bool),
    /// The entry is there already.
    Present,
    /// Another `editor` entry is there (its text); left alone.
    Conflict(String),
}

/// Adds the entry to `text` (a file's contents, empty for a new file).
pub fn add(client: FileClient, text: &str, bin: &str) -> Result<Plan, String> {
    let Some((container, entry)) = client.json_entry(bin) else {
        return add_codex(text, bin);
    };
    Ok(match jsonedit::add(text, container, NAME, &entry)? {
        Added::Text(t, created) => Plan::Write(t, created),
        Added::Present => Plan::Present,
        Added::Conflict(c) => Plan::Conflict(c),
    })
}

fn codex_entry(table: &toml::Table) -> Option<&toml::Value> {
    table.get("mcp_servers")?.as_table()?.get(NAME)
}

fn add_codex(text: &str, bin: &str) -> Result<Plan, String> {
    let table: toml::Table = toml::from_str(text).map_err(|e| format!("it is not TOML: {e}"))?;
    let block = codex_block(bin);
    let ours: toml::Table = toml::from_str(&block).unwrap_or_default();
    if let Some(existing) = codex_entry(&table) {
        return Ok(if Some(existing) == codex_entry(&ours) {
            Plan::Present
        } else {
            Plan::Conflict(existing.to_string())
        });
    }
    let created = table.get("mcp_servers").is_none();
    let mut out = text.to_string();
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(&block);
    toml::from_str::<toml::Table>(&out)
        .map_err(|e| format!("its `mcp_servers` cannot take a [mcp_servers.{NAME}] table ({e})"))?;
    Ok(Plan::Write(out, created))
}

/// `text` without the entry setup added (`Ok(None)`: it is not there any more).
pub fn remove(
    client: FileClient,
    text: &str,
    bin: &str,
    created_container: bool,
) -> Result<Option<String>, String> {
    let Some((container, entry)) = client.json_entry(bin) else {
        let block = codex_block(bin);
        let Some(at) = text.find(&block) else {
            let table: toml::Table = toml::from_str(text).unwrap_or_default();
            return match codex_entry(&table) {
                None => Ok(None),
                Some(_) => Err(format!(
                    "its [mcp_servers.{NAME}] was changed since setup wrote it; left as it is"
                )),
            };
        };
        return Ok(Some(format!(
            "{}{}",
            &text[..at],
            &text[at + block.len()..]
        )));
    };
    jsonedit::remove(text, container, NAME, &entry, created_container)
}

/// Whether a file holds nothing any more (what setup leaves of a file it created).
pub fn is_empty(client: FileClient, text: &str) -> bool {
    match client {
        FileClient::Codex => text.trim().is_empty(),
        _ => serde_json::from_str::<Value>(text).is_ok_and(|v| v == json!({})),
    }
}

/// Whether the client seems installed here: its command on `PATH`, or its config dir exists.
pub fn present(client: FileClient, homes: &Homes, on_path: impl Fn(&str) -> bool) -> bool {
    on_path(client.command()) || client.file(homes).parent().is_some_and(Path::exists)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codex_block_is_added_after_what_is_there_and_removed_exactly() {
        let before = "# mine\nmodel = \"o3\"\n\n[mcp_servers.other]\ncommand = \"x\"";
        let Ok(Plan::Write(after, created)) = add(FileClient::Codex, before, "/b/pi-ide-broker")
        else {
            panic!("not added")
        };
        assert!(!created);
        assert!(after.starts_with(before), "{after}");
        let t: toml::Table = toml::from_str(&after).expect("toml");
        assert_eq!(
            t["mcp_servers"]["editor"]["command"].as_str(),
            Some("/b/pi-ide-broker")
        );
        assert_eq!(t["mcp_servers"]["other"]["command"].as_str(), Some("x"));
        assert_eq!(
            add(FileClient::Codex, &after, "/b/pi-ide-broker"),
            Ok(Plan::Present)
        );
        let back = remove(FileClient::Codex, &after, "/b/pi-ide-broker", false)
            .expect("ok")
            .expect("there");
        assert_eq!(back.trim_end(), before);
    }

    #[test]
    fn codex_conflicts_are_left_alone() {
        let mine = "[mcp_servers.editor]\ncommand = \"other\"\n";
        assert!(matches!(
            add(FileClient::Codex, mine, "b"),
            Ok(Plan::Conflict(_))
        ));
        assert!(remove(FileClient::Codex, mine, "b", false).is_err());
        assert!(add(FileClient::Codex, "mcp_servers = 3\n", "b").is_err());
        assert!(add(FileClient::Codex, "not toml [", "b").is_err());
    }
}
