//! The README is the user's guide: its user path stays short, and its install block is what a
//! test runs (`install_block_as_written` in `setup`'s tests).

use std::path::Path;

/// The README's text.
pub fn readme() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .expect("read README.md")
}

/// The commands of the block between the `install-block` markers, one per line.
pub fn install_commands(readme: &str) -> Vec<String> {
    let start = readme
        .find("<!-- install-block:begin")
        .expect("README has an install-block:begin marker");
    let end = readme[start..]
        .find("<!-- install-block:end -->")
        .expect("README has an install-block:end marker")
        + start;
    let block = &readme[start..end];
    let body = block
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("a ```sh block between the install-block markers");
    body.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect()
}

/// The git URL the README's install block names (what a test substitutes).
pub const README_GIT_URL: &str = "https://github.com/OWNER/pi-ide-broker";

#[test]
fn user_path_is_at_most_300_lines() {
    let text = readme();
    let end = text
        .find("<!-- user-path:end")
        .expect("README marks the end of its user path with <!-- user-path:end");
    let lines = text[..end].lines().count();
    assert!(
        lines <= 300,
        "the README's user path is {lines} lines (at most 300)"
    );
}

#[test]
fn install_block_is_two_commands_naming_the_git_url() {
    let cmds = install_commands(&readme());
    assert_eq!(cmds.len(), 2, "{cmds:?}");
    assert!(
        cmds[0].starts_with("cargo install --locked --git ") && cmds[0].contains(README_GIT_URL),
        "{cmds:?}"
    );
    assert_eq!(cmds[1], "pi-ide-broker setup");
}

#[test]
fn every_docs_link_in_the_readme_exists() {
    let text = readme();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for part in text.split("](").skip(1) {
        let target = part.split([')', '#']).next().unwrap_or_default();
        if target.starts_with("http") || target.is_empty() {
            continue;
        }
        assert!(
            root.join(target).exists(),
            "README links to missing {target}"
        );
    }
}
