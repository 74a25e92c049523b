//! Records the git commit the binary is built from, for `--version`.

fn main() {
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(packaged_commit)
        .unwrap_or_else(|| "unknown commit".into());
    println!("cargo:rustc-env=PI_IDE_BROKER_COMMIT={commit}");
    // Where git keeps them: in a linked worktree `.git` is a file, and a path that does not
    // exist would make cargo rebuild the crate on every build.
    for (name, fallback) in [("HEAD", ".git/HEAD"), ("refs/heads", ".git/refs/heads")] {
        let path = git_path(name).unwrap_or_else(|| fallback.into());
        println!("cargo:rerun-if-changed={path}");
    }
}

/// `git rev-parse --git-path NAME`: the file git keeps NAME in for this checkout.
fn git_path(name: &str) -> Option<String> {
    let out = std::process::Command::new("git")
        .args(["rev-parse", "--git-path", name])
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let path = String::from_utf8(out.stdout).ok()?.trim().to_string();
    std::path::Path::new(&path).exists().then_some(path)
}

/// The commit a crates.io package was made from (`cargo package` writes it into
/// `.cargo_vcs_info.json`; a package has no `.git`).
fn packaged_commit() -> Option<String> {
    let info = std::fs::read_to_string(".cargo_vcs_info.json").ok()?;
    let at = info.find("\"sha1\"")?;
    let rest = &info[at + 7..];
    let start = rest.find('"')? + 1;
    let sha: String = rest[start..]
        .chars()
        .take_while(char::is_ascii_hexdigit)
        .collect();
    (sha.len() >= 12).then(|| sha[..12].to_string())
}
