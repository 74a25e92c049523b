//! `--self-test`: each form of upward use, planted in a copy of the tree, must fail the check;
//! a test-only module's use must not; the tree as it is must pass first.

use std::path::Path;
use std::process::ExitCode;

/// One planted change: files appended to (or created), and what the check must then say
/// (a problem line with both parts; `None`: it must pass).
struct Plant {
    what: &'static str,
    edits: &'static [(&'static str, &'static str)],
    expect: Option<(&'static str, &'static str)>,
}

/// The bottom layer's file every upward plant goes into.
/// The bottom layer's file every upward plant goes into: the lowest layer of the daemon's crate
/// (the layers below it are crates, where the compiler refuses such a use: `build_plant`).
const BOTTOM: &str = "src/sys/time.rs";

const PLANTS: &[Plant] = &[
    Plant {
        what: "a path after a b'\"' literal",
        edits: &[(
            BOTTOM,
            "pub fn planted() -> u8 { let _q = b'\"'; crate::cli::stop::X }\n",
        )],
        expect: Some(("sys::time (layer", "uses cli::stop")),
    },
    Plant {
        what: "a char '\"' then a path",
        edits: &[(
            BOTTOM,
            "pub fn planted() -> char { let _q = '\"'; crate::cli::stop::X }\n",
        )],
        expect: Some(("sys::time (layer", "uses cli::stop")),
    },
    Plant {
        what: "a raw string then a path",
        edits: &[(
            BOTTOM,
            "pub fn planted() { let _q = r#\"a \" b\"#; crate::broker::X; }\n",
        )],
        expect: Some(("sys::time (layer", "uses broker")),
    },
    Plant {
        what: "a C raw string then a path",
        edits: &[(
            BOTTOM,
            "pub fn planted() { let _q = cr#\"a \" b\"#; crate::broker::X; }\n",
        )],
        expect: Some(("sys::time (layer", "uses broker")),
    },
    Plant {
        what: "a crate-root re-export",
        edits: &[(BOTTOM, "pub fn planted() { crate::serve(); }\n")],
        expect: Some(("sys::time (layer", "uses broker")),
    },
    Plant {
        what: "a super::super chain",
        edits: &[(BOTTOM, "pub fn planted() { super::super::cli::stop::X; }\n")],
        expect: Some(("sys::time (layer", "uses cli::stop")),
    },
    Plant {
        what: "use crate as root",
        edits: &[(
            BOTTOM,
            "use crate as root;\npub fn planted() { root::cli::stop::X; }\n",
        )],
        expect: Some(("sys::time (layer", "uses cli::stop")),
    },
    Plant {
        what: "extern crate self as me (module level)",
        edits: &[(
            BOTTOM,
            "extern crate self as me;\npub fn planted() { me::cli::stop::X; }\n",
        )],
        expect: Some(("sys::time (layer", "uses cli::stop")),
    },
    Plant {
        what: "extern crate self as me (in a fn)",
        edits: &[(
            BOTTOM,
            "pub fn planted() { extern crate self as me; me::cli::stop::X; }\n",
        )],
        expect: Some(("sys::time (layer", "uses cli::stop")),
    },
    Plant {
        what: "a spaced path inside a brace macro",
        edits: &[(BOTTOM, "planted! { crate :: cli :: stop :: X }\n")],
        expect: Some(("sys::time (layer", "uses cli::stop")),
    },
    Plant {
        what: "a non-test file named tests.rs",
        edits: &[
            ("src/sys/logging.rs", "mod tests;\n"),
            (
                "src/sys/logging/tests.rs",
                "pub fn planted() { crate::cli::stop::X; }\n",
            ),
        ],
        expect: Some(("sys::logging (layer", "uses cli::stop")),
    },
    Plant {
        what: "a child using its parent on a higher layer",
        edits: &[
            ("src/registry/mod.rs", "pub fn planted_parent() {}\n"),
            (
                "src/registry/limits.rs",
                "pub fn planted() { super::planted_parent(); }\n",
            ),
        ],
        expect: Some(("registry::limits (layer", "")),
    },
    Plant {
        what: "a circle inside a folder (below the node level)",
        edits: &[
            (
                "src/frontdoor/gemini/http.rs",
                "pub fn planted() { super::qwen::X; }\n",
            ),
            (
                "src/frontdoor/gemini/qwen.rs",
                "pub fn planted() { super::http::X; }\n",
            ),
        ],
        expect: Some((
            "circle inside a folder",
            "frontdoor::gemini::http, frontdoor::gemini::qwen",
        )),
    },
    Plant {
        what: "a #[cfg(all(test, unix))] module (not an upward use)",
        edits: &[(
            BOTTOM,
            "#[cfg(all(test, unix))]\nmod planted_tests { fn f() { crate::cli::stop::X; } }\n",
        )],
        expect: None,
    },
];

/// Runs every plant on a fresh copy of `repo`'s src and ARCHITECTURE.md.
pub fn self_test(repo: &Path) -> ExitCode {
    if let Err(problems) = crate::check(repo, false, false) {
        println!(
            "self-test: the tree itself fails the check:\n{}",
            problems.join("\n")
        );
        return ExitCode::FAILURE;
    }
    // The layer a module sits on may be lower than its folder's: the parent plant needs it.
    let mut failed = Vec::new();
    for plant in PLANTS {
        match run(repo, plant) {
            Ok(()) => {}
            Err(why) => failed.push(format!("{}: {why}", plant.what)),
        }
    }
    if let Err(why) = build_plant(repo) {
        failed.push(format!(
            "an upward use from a crate of the workspace: {why}"
        ));
    }
    for f in &failed {
        println!("self-test: {f}");
    }
    if !failed.is_empty() {
        return ExitCode::FAILURE;
    }
    println!(
        "self-test: all {} plants judged as they should be, and the compiler refuses an upward use from a crate",
        PLANTS.len()
    );
    ExitCode::SUCCESS
}

fn run(repo: &Path, plant: &Plant) -> Result<(), String> {
    let tmp = std::env::temp_dir().join(format!("layer-check-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    for dir in ["src", "crates"] {
        copy_dir(&repo.join(dir), &tmp.join(dir)).map_err(|e| format!("copy: {e}"))?;
    }
    let mut doc =
        std::fs::read_to_string(repo.join("ARCHITECTURE.md")).map_err(|e| e.to_string())?;
    if plant.what.starts_with("a child using") {
        // registry::limits on the editor's layer, below its folder.
        doc = doc
            .lines()
            .map(|l| match l.split_whitespace().nth(1) {
                Some("editor") => format!("{l} · registry::limits\n"),
                _ => format!("{l}\n"),
            })
            .collect();
    }
    std::fs::write(tmp.join("ARCHITECTURE.md"), doc).map_err(|e| e.to_string())?;
    for (file, code) in plant.edits {
        let path = tmp.join(file);
        let mut text = std::fs::read_to_string(&path).unwrap_or_default();
        text.push_str(code);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        }
        std::fs::write(&path, text).map_err(|e| e.to_string())?;
    }
    let verdict = crate::check(&tmp, false, false);
    let _ = std::fs::remove_dir_all(&tmp);
    match (verdict, plant.expect) {
        (Ok(_), None) => Ok(()),
        (Err(p), None) => Err(format!("wrongly flagged: {}", p.join("; "))),
        (Ok(_), Some(_)) => Err("not caught".into()),
        (Err(p), Some((a, b))) if p.iter().any(|l| l.contains(a) && l.contains(b)) => Ok(()),
        (Err(p), Some(want)) => Err(format!("caught, but not as {want:?}: {}", p.join("; "))),
    }
}

/// The layers that are crates (`crates/`) need no check: the compiler refuses a use of what
/// they do not depend on. Shown once, on a copy of the workspace: `protocol` naming the
/// daemon's `cli` (through the crate root's alias and by the daemon crate's name) must not
/// type-check.
fn build_plant(repo: &Path) -> Result<(), String> {
    let tmp = std::env::temp_dir().join(format!("layer-check-build-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let copy = || -> std::io::Result<()> {
        for dir in ["src", "crates", "benches", "examples", ".cargo"] {
            if repo.join(dir).exists() {
                copy_dir(&repo.join(dir), &tmp.join(dir))?;
            }
        }
        for file in ["Cargo.toml", "Cargo.lock", "build.rs", "README.md"] {
            std::fs::copy(repo.join(file), tmp.join(file))?;
        }
        let planted = tmp.join("crates/protocol/src/jsonrpc.rs");
        let mut text = std::fs::read_to_string(&planted)?;
        text.push_str("use crate as root;\npub fn planted() { root::cli::stop::X; }\n");
        std::fs::write(planted, text)
    };
    copy().map_err(|e| format!("copy: {e}"))?;
    let out = std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args([
            "check",
            "--offline",
            "--quiet",
            "-p",
            "pi-ide-broker-protocol",
        ])
        .current_dir(&tmp)
        .env("CARGO_TARGET_DIR", repo.join("target").join("layer-plant"))
        .output();
    let _ = std::fs::remove_dir_all(&tmp);
    let out = out.map_err(|e| format!("cargo check: {e}"))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    match (out.status.success(), stderr.contains("`cli`")) {
        (false, true) => Ok(()),
        (true, _) => Err("cargo check passed: the crate reached a layer above it".into()),
        (false, false) => Err(format!(
            "cargo check failed, but not on the planted use:\n{stderr}"
        )),
    }
}

fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}
