//! Where a session would go and why (`GET /v1/route`), and the editors it may choose among.
//!
//! `GET /v1/route`'s document says why a session in a cwd would go where it goes;
//! `broker/editors`' answer lists the editors a session may choose among.
//!
//! Typed at both ends: the registry builds a [`RouteExplanation`], the daemon serialises it and
//! `doctor` reads it back. The field names are a contract (`doctor --json` prints them): add,
//! never rename.

use super::router::{self, Decision};
use super::Registry;
use crate::editor::LinkState;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Why a session in `cwd` (with a sticky key) would go where it goes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RouteExplanation {
    /// The cwd as asked.
    pub cwd: String,
    /// The cwd as routing compares it.
    pub normalized: PathBuf,
    /// The sticky key asked about.
    pub key: Option<String>,
    /// That key's sticky target.
    pub sticky: Option<String>,
    /// Every editor whose folders contain the cwd, best first, usable or not.
    pub candidates: Vec<RouteCandidate>,
    /// Where routing sends the session now.
    pub decision: RouteDecision,
    /// What the user can do when the decision is not an editor.
    pub settle: Option<String>,
}

/// One editor whose folders contain the cwd, and why it ranks where it does.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RouteCandidate {
    /// The editor's id.
    pub id: String,
    /// `ideName` from its lockfile.
    pub ide_name: String,
    /// The workspace folder that holds the cwd.
    pub folder: PathBuf,
    /// How many path components deep the cwd is in it.
    pub depth: usize,
    /// The folder is `/` or `$HOME`: used only when nothing else matches.
    pub weak: bool,
    /// The editor's link state.
    pub state: LinkState,
    /// The reasons, in words.
    pub why: Vec<String>,
}

/// Where routing sends a session: `{"editor": id}`, `{"none": why}` or `{"ambiguous": ids}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RouteDecision {
    /// To this editor.
    Editor(String),
    /// Nowhere: no editor's folders hold the cwd.
    None(String),
    /// Nowhere yet: these editors tie.
    Ambiguous(Vec<String>),
}

/// `broker/editors`' answer: the session's editor, and the candidates for its cwd, best first.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Editors {
    /// The editor the session is attached to.
    pub attached: Option<String>,
    /// Every editor whose folders hold the cwd, usable or not.
    pub editors: Vec<EditorChoice>,
}

/// One editor a session may choose (`broker/attach`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EditorChoice {
    /// Its id.
    pub id: String,
    /// `ideName` from its lockfile.
    pub ide_name: String,
    /// Its family.
    pub family: crate::protocol::family::Family,
    /// Its workspace folders as written.
    pub workspace_folders: Vec<String>,
    /// The folder that holds the cwd.
    pub matched_folder: PathBuf,
    /// Its link state.
    pub state: LinkState,
    /// Who holds it, while it is taken (`null` otherwise).
    pub reason: Option<String>,
}

impl Registry {
    /// `broker/editors`: the candidates for a session's cwd, best first.
    pub fn editors_for(&self, s: &super::session::Session) -> Editors {
        let mut all = self.views();
        for v in &mut all {
            v.usable = true;
        }
        let editors = router::candidates(&s.cwd, &all, &self.home)
            .iter()
            .filter_map(|c| {
                let e = self.editors.get(&c.id)?;
                let l = e.lockfile();
                let state = e.state();
                Some(EditorChoice {
                    id: e.id.clone(),
                    ide_name: l.ide_name.clone(),
                    family: e.family,
                    workspace_folders: l.workspace_folders.clone(),
                    matched_folder: c.matched.folder.clone(),
                    state,
                    reason: (state == LinkState::Taken)
                        .then(|| e.link_info().reason)
                        .flatten(),
                })
            })
            .collect();
        Editors {
            attached: s.editor_id().as_deref().map(String::from),
            editors,
        }
    }

    /// Why a session in `cwd` (with sticky `key`) would go where it goes: every editor whose
    /// folders contain the cwd, ranked, with the reason for its rank, and the decision (for
    /// `doctor` and `GET /v1/route`). Changes nothing.
    pub fn explain_route(&self, cwd_raw: &str, key: Option<&str>) -> RouteExplanation {
        let cwd = router::normalize(std::path::Path::new(cwd_raw));
        let views = self.views();
        let sticky = key.and_then(|k| self.state.sticky(k));
        let usable = router::candidates(&cwd, &views, &self.home);
        let mut all = views.clone();
        for v in &mut all {
            v.usable = true;
        }
        let newest_focus = usable.iter().filter_map(|c| c.focus).max();
        let candidates = router::candidates(&cwd, &all, &self.home)
            .iter()
            .filter_map(|c| {
                let e = self.editor(&c.id)?;
                let up = usable.iter().any(|u| u.id == c.id);
                let mut why = vec![if c.matched.weak {
                    format!(
                        "weak match: {} is / or $HOME, used only when no other folder matches",
                        c.matched.folder.display()
                    )
                } else {
                    format!(
                        "folder {} contains the cwd ({} path components deep)",
                        c.matched.folder.display(),
                        c.matched.depth
                    )
                }];
                if c.focus.is_some() && c.focus == newest_focus {
                    why.push("the editor you touched last".into());
                }
                if sticky.as_deref() == Some(c.id.as_str()) {
                    why.push(format!(
                        "sticky target of session key {}",
                        key.unwrap_or_default()
                    ));
                }
                if !up {
                    why.push(format!("not a candidate now: its link is {:?}", e.state()));
                }
                Some(RouteCandidate {
                    id: c.id.clone(),
                    ide_name: e.lockfile().ide_name.clone(),
                    folder: c.matched.folder.clone(),
                    depth: c.matched.depth,
                    weak: c.matched.weak,
                    state: e.state(),
                    why,
                })
            })
            .collect();
        let (decision, settle) = match router::decide(&usable, sticky.as_deref()) {
            Decision::Editor(id) => (RouteDecision::Editor(id), None),
            Decision::NoMatch => (
                RouteDecision::None(format!(
                    "no open editor has a workspace folder containing {}",
                    cwd.display()
                )),
                Some("open the project in an editor with pi-ide or Claude Code integration".into()),
            ),
            Decision::Ambiguous(ids) => {
                let settle = format!(
                    "move the cursor in the editor you want (the last focused wins), or choose one: /ide in pi, or broker/attach {{\"editor\": \"{}\"}}",
                    ids.first().cloned().unwrap_or_default()
                );
                (RouteDecision::Ambiguous(ids), Some(settle))
            }
        };
        RouteExplanation {
            cwd: cwd_raw.to_string(),
            normalized: cwd,
            key: key.map(String::from),
            sticky,
            candidates,
            decision,
            settle,
        }
    }
}
