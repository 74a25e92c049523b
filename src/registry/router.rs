//! Path matching and editor choice for a session's cwd (README "Editors").
//! Pure functions: the registry feeds them a snapshot and acts on the answer.

use std::path::{Component, Path, PathBuf};

/// Normalises a path for comparison: absolute (relative paths are taken from `/`), `.` and
/// `..` resolved, symlinks resolved where the path exists, trailing slash ignored. On Windows
/// a drive, verbatim or UNC path compares by `winpath::compare_key` instead: drive letter and
/// case folded, either slash (no symlinks resolved: the editors write what the user opened).
pub(crate) fn normalize(path: &Path) -> PathBuf {
    if cfg!(windows) {
        if let Some(key) = crate::protocol::winpath::compare_key(&path.to_string_lossy()) {
            return PathBuf::from(key);
        }
    }
    let lexical = lexical(path);
    // Resolve symlinks on the longest prefix that exists, keep the rest lexically.
    let mut existing = lexical.as_path();
    let mut rest = Vec::new();
    loop {
        if let Ok(real) = std::fs::canonicalize(existing) {
            let mut out = real;
            for part in rest.iter().rev() {
                out.push(part);
            }
            return out;
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                existing = parent;
            }
            _ => return lexical,
        }
    }
}

/// `.`/`..` resolution without touching the file system.
pub(crate) fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in path.components() {
        match c {
            Component::Normal(p) => out.push(p),
            Component::ParentDir => {
                out.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

/// How well one folder of an editor matches a cwd.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FolderMatch {
    /// The (normalised) folder that contains the cwd.
    pub folder: PathBuf,
    /// Its number of path components: more is more specific.
    pub depth: usize,
    /// `/` or `$HOME`: used only when nothing else matches.
    pub weak: bool,
}

/// The best folder of `folders` (already normalised) containing `cwd` (already normalised).
pub(crate) fn best_folder(cwd: &Path, folders: &[PathBuf], home: &Path) -> Option<FolderMatch> {
    folders
        .iter()
        .filter(|f| cwd.starts_with(f))
        .map(|f| FolderMatch {
            folder: f.clone(),
            depth: f.components().count(),
            weak: f.as_path() == Path::new("/") || f.as_path() == home,
        })
        .max_by_key(|m| (!m.weak, m.depth))
}

/// One editor as routing sees it.
#[derive(Clone, Debug)]
pub(crate) struct EditorView {
    /// The editor id.
    pub id: String,
    /// Normalised workspace folders.
    pub folders: Vec<PathBuf>,
    /// Activity stamp of the user's last touch (`selection_changed`); higher is more recent.
    pub focus: Option<u64>,
    /// Only editors whose link is usable are candidates.
    pub usable: bool,
}

/// A candidate editor for a cwd.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Candidate {
    /// The editor id.
    pub id: String,
    /// The folder that matched.
    pub matched: FolderMatch,
    /// See [`EditorView::focus`].
    pub focus: Option<u64>,
}

/// Candidates for `cwd`, best first: strong before weak (weak only when no strong one
/// exists), deeper folder first, then the most recently focused.
pub(crate) fn candidates(cwd: &Path, editors: &[EditorView], home: &Path) -> Vec<Candidate> {
    let mut all: Vec<Candidate> = editors
        .iter()
        .filter(|e| e.usable)
        .filter_map(|e| {
            best_folder(cwd, &e.folders, home).map(|m| Candidate {
                id: e.id.clone(),
                matched: m,
                focus: e.focus,
            })
        })
        .collect();
    if all.iter().any(|c| !c.matched.weak) {
        all.retain(|c| !c.matched.weak);
    }
    all.sort_by(|a, b| {
        b.matched
            .depth
            .cmp(&a.matched.depth)
            .then(b.focus.cmp(&a.focus))
            .then(a.id.cmp(&b.id))
    });
    all
}

/// What routing decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Attach to this editor.
    Editor(String),
    /// Nothing matches the cwd.
    NoMatch,
    /// Several equally good editors; the client must choose (`broker/attach`).
    Ambiguous(Vec<String>),
}

/// Sticky target if still a candidate, else the single best candidate, else ambiguity.
pub(crate) fn decide(cands: &[Candidate], sticky: Option<&str>) -> Decision {
    if let Some(s) = sticky {
        if cands.iter().any(|c| c.id == s) {
            return Decision::Editor(s.to_string());
        }
    }
    let Some(first) = cands.first() else {
        return Decision::NoMatch;
    };
    let tied: Vec<String> = cands
        .iter()
        .filter(|c| c.matched.depth == first.matched.depth && c.focus == first.focus)
        .map(|c| c.id.clone())
        .collect();
    if tied.len() > 1 {
        Decision::Ambiguous(tied)
    } else {
        Decision::Editor(first.id.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ed(id: &str, folders: &[&str], sel: Option<u64>) -> EditorView {
        EditorView {
            id: id.into(),
            folders: folders.iter().map(PathBuf::from).collect(),
            focus: sel,
            usable: true,
        }
    }

    #[test]
    fn an_editors_strong_folder_wins_over_its_weak_one() {
        // One editor with $HOME and a project under it: the project is its folder for the cwd.
        let folders = [PathBuf::from("/home/u"), PathBuf::from("/home/u/proj")];
        let m = best_folder(
            Path::new("/home/u/proj/src"),
            &folders,
            Path::new("/home/u"),
        )
        .unwrap();
        assert_eq!(m.folder, PathBuf::from("/home/u/proj"));
        assert!(!m.weak);
        // `/` deeper than nothing still loses to any real folder.
        let folders = [PathBuf::from("/"), PathBuf::from("/srv")];
        let m = best_folder(Path::new("/srv/x"), &folders, Path::new("/home/u")).unwrap();
        assert_eq!(m.folder, PathBuf::from("/srv"));
    }

    fn route(cwd: &str, eds: &[EditorView], sticky: Option<&str>) -> Decision {
        decide(
            &candidates(Path::new(cwd), eds, Path::new("/home/u")),
            sticky,
        )
    }

    #[test]
    fn nested_workspaces_pick_the_deepest() {
        let eds = [
            ed("outer", &["/p"], Some(9)),
            ed("inner", &["/p/sub"], None),
        ];
        assert_eq!(
            route("/p/sub/x", &eds, None),
            Decision::Editor("inner".into())
        );
        assert_eq!(
            route("/p/other", &eds, None),
            Decision::Editor("outer".into())
        );
        assert_eq!(route("/q", &eds, None), Decision::NoMatch);
    }

    #[test]
    fn components_not_string_prefixes() {
        let eds = [ed("a", &["/p/app"], None)];
        assert_eq!(route("/p/apple", &eds, None), Decision::NoMatch);
        assert_eq!(route("/p/app", &eds, None), Decision::Editor("a".into()));
    }

    #[test]
    fn root_and_home_are_weak() {
        let eds = [
            ed("root", &["/"], Some(5)),
            ed("home", &["/home/u"], Some(7)),
        ];
        assert_eq!(route("/srv/x", &eds, None), Decision::Editor("root".into()));
        assert_eq!(
            route("/home/u/p", &eds, None),
            Decision::Editor("home".into())
        );
        let eds2 = [
            ed("home", &["/home/u"], Some(7)),
            ed("proj", &["/home/u/p"], None),
        ];
        assert_eq!(
            route("/home/u/p/src", &eds2, None),
            Decision::Editor("proj".into())
        );
        // A weak match is never preferred over a strong one, whatever its depth.
        let eds3 = [
            ed("home", &["/home/u"], Some(7)),
            ed("shallow", &["/home"], None),
        ];
        assert_eq!(
            route("/home/u/x", &eds3, None),
            Decision::Editor("shallow".into())
        );
    }

    #[test]
    fn ties_go_to_the_most_recently_focused_then_ambiguity() {
        let eds = [ed("a", &["/p"], Some(1)), ed("b", &["/p"], Some(2))];
        assert_eq!(route("/p", &eds, None), Decision::Editor("b".into()));
        let eds = [ed("a", &["/p"], None), ed("b", &["/p"], None)];
        assert_eq!(
            route("/p", &eds, None),
            Decision::Ambiguous(vec!["a".into(), "b".into()])
        );
        assert_eq!(route("/p", &eds, Some("a")), Decision::Editor("a".into()));
    }

    #[test]
    fn sticky_only_while_a_candidate() {
        let eds = [ed("a", &["/p"], None), ed("b", &["/q"], None)];
        assert_eq!(route("/p", &eds, Some("b")), Decision::Editor("a".into()));
        let mut down = ed("a", &["/p"], None);
        down.usable = false;
        assert_eq!(route("/p", &[down], Some("a")), Decision::NoMatch);
    }

    #[cfg(unix)] // Unix file modes, symlinks or sockets
    #[test]
    fn normalisation() {
        assert_eq!(lexical(Path::new("/a/./b/../c/")), PathBuf::from("/a/c"));
        assert_eq!(lexical(Path::new("/../..")), PathBuf::from("/"));
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let real_n = normalize(&real);
        assert_eq!(normalize(&link), real_n);
        assert_eq!(
            normalize(&link.join("not/yet/there")),
            real_n.join("not/yet/there")
        );
        assert_eq!(
            normalize(&PathBuf::from(format!("{}/", link.display()))),
            real_n
        );
    }

    proptest! {
        #[test]
        fn a_folder_matches_exactly_its_descendants(
            folder in proptest::collection::vec("[a-c]{1,2}", 1..4),
            cwd in proptest::collection::vec("[a-c]{1,2}", 0..6),
        ) {
            let f = PathBuf::from(format!("/{}", folder.join("/")));
            let c = PathBuf::from(format!("/{}", cwd.join("/")));
            let expected = cwd.len() >= folder.len() && cwd[..folder.len()] == folder[..];
            let got = best_folder(&c, std::slice::from_ref(&f), Path::new("/nohome")).is_some();
            prop_assert_eq!(got, expected);
            // A trailing slash on either side changes nothing.
            let c2 = lexical(Path::new(&format!("{}/", c.display())));
            prop_assert_eq!(best_folder(&c2, &[f], Path::new("/nohome")).is_some(), expected);
        }
    }
}
