//! The pi extension, carried inside the binary: `setup` writes it to a folder of the broker's
//! own (`<data dir>/pi-extension`) and installs that folder into pi as a local package, which pi
//! loads where it is. The extension has no dependencies, so nothing runs npm; binary and
//! extension are always the same version; no path of the build machine is kept (issue 41).
//! The daemon rewrites the folder on start when it holds another version's files, so a new
//! binary brings its extension with it at pi's next start or `/reload`.

use std::path::{Path, PathBuf};

/// Every file of the extension, by its path inside the package.
pub(crate) const FILES: &[(&str, &str)] = &[
    (
        "package.json",
        include_str!("../../../extensions/pi/package.json"),
    ),
    ("index.ts", include_str!("../../../extensions/pi/index.ts")),
    (
        "src/broker.ts",
        include_str!("../../../extensions/pi/src/broker.ts"),
    ),
    (
        "src/context.ts",
        include_str!("../../../extensions/pi/src/context.ts"),
    ),
    (
        "src/diff.ts",
        include_str!("../../../extensions/pi/src/diff.ts"),
    ),
    (
        "src/first_attach.ts",
        include_str!("../../../extensions/pi/src/first_attach.ts"),
    ),
    (
        "src/follow.ts",
        include_str!("../../../extensions/pi/src/follow.ts"),
    ),
    (
        "src/followers.ts",
        include_str!("../../../extensions/pi/src/followers.ts"),
    ),
    (
        "src/methods.ts",
        include_str!("../../../extensions/pi/src/methods.ts"),
    ),
    (
        "src/options.ts",
        include_str!("../../../extensions/pi/src/options.ts"),
    ),
    (
        "src/review.ts",
        include_str!("../../../extensions/pi/src/review.ts"),
    ),
    (
        "src/socket_trust.ts",
        include_str!("../../../extensions/pi/src/socket_trust.ts"),
    ),
    (
        "src/suggest.ts",
        include_str!("../../../extensions/pi/src/suggest.ts"),
    ),
    (
        "src/version.ts",
        include_str!("../../../extensions/pi/src/version.ts"),
    ),
    (
        "src/wsclient.ts",
        include_str!("../../../extensions/pi/src/wsclient.ts"),
    ),
    (
        "src/binary.js",
        include_str!("../../../extensions/pi/src/binary.js"),
    ),
    (
        "src/install.js",
        include_str!("../../../extensions/pi/src/install.js"),
    ),
];

/// The folder `setup` installs into pi.
pub(crate) fn dir(data_dir: &Path) -> PathBuf {
    data_dir.join("pi-extension")
}

/// Writes the extension into `dir` where a file differs (each replaced atomically); returns
/// whether anything changed.
pub(crate) fn write(dir: &Path) -> std::io::Result<bool> {
    let mut changed = false;
    for (rel, text) in FILES {
        let path = dir.join(rel);
        if std::fs::read_to_string(&path).is_ok_and(|t| t == *text) {
            continue;
        }
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let tmp = path.with_extension("tmp-write");
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, &path)?;
        changed = true;
    }
    Ok(changed)
}

/// On the daemon's start: brings a folder `setup` wrote up to this binary's extension (a
/// folder that is not there stays absent: pi loads the extension from elsewhere).
pub(crate) fn refresh(data_dir: &Path) {
    let dir = dir(data_dir);
    if !dir.join("package.json").exists() {
        return;
    }
    match write(&dir) {
        Ok(true) => {
            tracing::info!(dir = %dir.display(), "the pi extension was updated to this binary's version")
        }
        Ok(false) => {}
        Err(e) => tracing::warn!(dir = %dir.display(), "cannot update the pi extension: {e}"),
    }
}

/// Removes the folder (`setup --undo`).
pub(crate) fn remove(data_dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(dir(data_dir)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `.ts` and `.js` file of the extension is carried (a new module must be added to [`FILES`]).
    #[test]
    fn every_file_of_the_extension_is_carried() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("extensions/pi");
        let mut on_disk = vec!["package.json".to_string(), "index.ts".to_string()];
        for e in std::fs::read_dir(root.join("src")).expect("extensions/pi/src") {
            let name = e.expect("entry").file_name().to_string_lossy().into_owned();
            if name.ends_with(".ts") || name.ends_with(".js") {
                on_disk.push(format!("src/{name}"));
            }
        }
        on_disk.sort();
        let mut carried: Vec<String> = FILES.iter().map(|(p, _)| p.to_string()).collect();
        carried.sort();
        assert_eq!(carried, on_disk);
    }

    /// One minimum pi: setup's, the extension's peer range and the README's.
    #[test]
    fn one_minimum_pi_is_stated() {
        let pkg = FILES
            .iter()
            .find(|(p, _)| *p == "package.json")
            .expect("carried")
            .1;
        let v: serde_json::Value = serde_json::from_str(pkg).expect("package.json");
        assert_eq!(
            v["peerDependencies"]["@earendil-works/pi-coding-agent"],
            format!(">={}", super::super::MIN_PI)
        );
        let readme = include_str!("../../../README.md");
        assert!(readme.contains(&format!("pi {} or newer", super::super::MIN_PI)));
    }

    #[test]
    fn write_changes_only_what_differs_and_refresh_leaves_an_absent_folder_absent() {
        let data = tempfile::tempdir().expect("tempdir");
        let d = dir(data.path());
        refresh(data.path());
        assert!(!d.exists(), "refresh created a folder setup never wrote");
        assert!(write(&d).expect("first write"));
        assert!(
            !write(&d).expect("second write"),
            "an unchanged folder was rewritten"
        );
        std::fs::write(d.join("src/broker.ts"), "// an older version").expect("age a file");
        refresh(data.path());
        assert_eq!(
            std::fs::read_to_string(d.join("src/broker.ts")).expect("read"),
            FILES
                .iter()
                .find(|(p, _)| *p == "src/broker.ts")
                .expect("carried")
                .1
        );
        remove(data.path()).expect("remove");
        assert!(!d.exists());
        remove(data.path()).expect("removing twice is fine");
    }
}
