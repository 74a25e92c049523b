//! The layer check: the crate's module graph, read by a Rust parser (syn), not by text.
//!
//! The bottom layers are crates of the workspace (`crates/<name>/src`), where the compiler
//! already refuses an upward use; they are read as the modules the daemon's crate re-exports
//! them as (`crates/wire/src/budget.rs` is `wire::budget`, its `crate::` is `wire::`), so the
//! graph, the circles, the file sizes and the codemap span the whole workspace.
//!
//! A node is a module two levels deep at most: `wire::wsframe`, `cli::mcp` (with everything
//! under it), `editor` (its mod.rs). Every path into the crate counts, however it is written:
//! `use` trees (groups, `self`, globs, renames), `crate::`/`self::`/`super::` paths anywhere
//! (types, expressions, patterns, the token trees of macro calls, `$crate`), a name a `use`
//! bound (`use crate::frontdoor;` then `frontdoor::socket::X`), a name for the crate root
//! (`use crate as root;`, `extern crate self as me;`), a child module's name, and a crate-root
//! re-export (`crate::serve` is `broker::serve`). Items under a test-only cfg
//! (`#[cfg(test)]`, `#[cfg(all(test, …))]`) are left out, and so is a module declared under
//! one; a file is judged by how it is declared, never by its name.
//!
//! Rules:
//! - no import cycle between nodes;
//! - no circle inside a folder (sibling modules using each other, at any depth);
//! - a module uses only its own layer or those below: the layers are the code block under
//!   "Layers, bottom up" in ARCHITECTURE.md (bottom line last); a module may sit lower than
//!   its folder (`registry::session`); using what a parent declares is a layer check too;
//! - no non-test source file over 800 lines;
//! - the codemap in ARCHITECTURE.md (between `<!-- codemap -->` and `<!-- /codemap -->`) is
//!   one line per node module, its first `//!` line (`--codemap` prints it).
//!
//! Usage: layer-check [--graph | --codemap | --self-test] [REPO] (default: the current dir).

mod plant;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use proc_macro2::{Spacing, TokenStream, TokenTree};
use syn::visit::Visit;

/// The longest a non-test source file may be (test files are left out: a test module's
/// scenarios read best in one place).
const MAX_LINES: usize = 800;

/// A module's path from the crate root: `["cli", "mcp", "door"]`.
type ModPath = Vec<String>;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |f: &str| args.iter().any(|a| a == f);
    let repo = args
        .iter()
        .find(|a| !a.starts_with("--"))
        .map_or_else(|| PathBuf::from("."), PathBuf::from);
    if flag("--self-test") {
        return plant::self_test(&repo);
    }
    match check(&repo, flag("--codemap"), flag("--graph")) {
        Ok(summary) => {
            println!("{summary}");
            ExitCode::SUCCESS
        }
        Err(problems) => {
            for p in problems {
                println!("{p}");
            }
            ExitCode::FAILURE
        }
    }
}

/// Runs every rule over `repo`; the summary line, or each problem found.
pub fn check(repo: &Path, print_codemap: bool, print_graph: bool) -> Result<String, Vec<String>> {
    let crate_ = Crate::read(repo).map_err(|e| vec![e])?;
    if print_codemap {
        return Ok(crate_.codemap());
    }
    let doc = std::fs::read_to_string(repo.join("ARCHITECTURE.md"))
        .map_err(|e| vec![format!("ARCHITECTURE.md: {e}")])?;
    let Some(written) = between(&doc, "<!-- codemap -->", "<!-- /codemap -->") else {
        return Err(vec!["ARCHITECTURE.md has no <!-- codemap --> block".into()]);
    };
    let long = crate_.long_files();
    if !long.is_empty() {
        return Err(long);
    }
    let cut: Vec<String> = crate_
        .codemap()
        .lines()
        .filter(|l| !l.ends_with(['.', '!', '?']))
        .map(|l| format!("codemap: a first //! line that stops mid-sentence (the codemap shows only it): {l}"))
        .collect();
    if !cut.is_empty() {
        return Err(cut);
    }
    if written.trim() != crate_.codemap() {
        return Err(vec!["ARCHITECTURE.md's codemap is not the modules' first //! lines; paste `layer-check --codemap` between its markers".into()]);
    }
    let layers = read_layers(&doc).map_err(|e| vec![e])?;
    let graph = crate_.graph();
    if print_graph {
        for (m, deps) in &graph.nodes {
            let deps: Vec<&str> = deps.iter().map(String::as_str).collect();
            println!(
                "{m} -> {}",
                if deps.is_empty() {
                    "-".into()
                } else {
                    deps.join(", ")
                }
            );
        }
    }
    let mut problems = layer_problems(&graph, &layers);
    for c in cycles(&graph.nodes) {
        problems.push(format!("cycle among: {}", c.join(", ")));
    }
    for c in cycles(&graph.siblings) {
        problems.push(format!("circle inside a folder, among: {}", c.join(", ")));
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    let distinct: BTreeSet<usize> = layers.values().copied().collect();
    Ok(format!(
        "{} modules, {} edges: no import cycle, no circle inside a folder; every folder uses only its own layer or those below ({} layers)",
        graph.nodes.len(),
        graph.nodes.values().map(BTreeSet::len).sum::<usize>(),
        distinct.len()
    ))
}

/// The text between two markers.
fn between<'d>(doc: &'d str, open: &str, close: &str) -> Option<&'d str> {
    let rest = doc.split_once(open)?.1;
    Some(rest.split_once(close)?.0)
}

/// A file module of the crate.
struct FileModule {
    path: ModPath,
    file: PathBuf,
    ast: syn::File,
}

/// Every module file the crate declares (test-only ones left out), parsed.
struct Crate {
    files: Vec<FileModule>,
    /// Every module path, inline ones included.
    known: BTreeSet<ModPath>,
    /// (module, name) -> what its `pub use` re-exports under that name.
    exports: BTreeMap<(ModPath, String), ModPath>,
    /// The workspace's other crates (`crates/<name>`): each a top-level module here.
    roots: BTreeSet<String>,
}

impl Crate {
    /// Reads the crate from `src/lib.rs` down, following `mod` declarations, and each crate
    /// of `crates/` from its `src/lib.rs`, as the top-level module of its folder's name.
    fn read(repo: &Path) -> Result<Crate, String> {
        let src = repo.join("src");
        let mut files = Vec::new();
        let mut todo = vec![(Vec::new(), src.join("lib.rs"), src.clone())];
        let mut roots = BTreeSet::new();
        if let Ok(dirs) = std::fs::read_dir(repo.join("crates")) {
            for dir in dirs.flatten() {
                let lib = dir.path().join("src").join("lib.rs");
                let name = dir.file_name().to_string_lossy().into_owned();
                if lib.exists() {
                    todo.push((vec![name.clone()], lib, dir.path().join("src")));
                    roots.insert(name);
                }
            }
        }
        while let Some((path, file, dir)) = todo.pop() {
            let text =
                std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
            let ast = syn::parse_file(&text)
                .map_err(|e| format!("{}: does not parse: {e}", file.display()))?;
            for (child, child_file, child_dir) in declared_files(&ast.items, &path, &dir) {
                todo.push((child, child_file, child_dir));
            }
            files.push(FileModule { path, file, ast });
        }
        let mut known = BTreeSet::new();
        let mut exports = BTreeMap::new();
        for f in &files {
            let mut walker = Items {
                known: &mut known,
                exports: &mut exports,
                roots: &roots,
            };
            walker.module(&f.path, &f.ast.items);
        }
        Ok(Crate {
            files,
            known,
            exports,
            roots,
        })
    }

    /// A problem line for each non-test file longer than [`MAX_LINES`].
    fn long_files(&self) -> Vec<String> {
        self.files
            .iter()
            .filter_map(|f| {
                let n = std::fs::read_to_string(&f.file).ok()?.lines().count();
                (n > MAX_LINES).then(|| {
                    format!(
                        "{}: {n} lines, over the house rule's {MAX_LINES}: split it by job",
                        f.file.display()
                    )
                })
            })
            .collect()
    }

    /// `- `name`: first //! line` for each node module (a workspace crate: its root only),
    /// sorted.
    fn codemap(&self) -> String {
        let mut rows: Vec<(String, String)> = self
            .files
            .iter()
            // A crate of the workspace is one line: its lib.rs lists its own modules.
            .filter(|f| match f.path.first() {
                None => false,
                Some(top) if self.roots.contains(top) => f.path.len() == 1,
                Some(_) => f.path.len() <= 2,
            })
            .map(|f| {
                let first = std::fs::read_to_string(&f.file).unwrap_or_default();
                let line = first.lines().next().unwrap_or_default();
                let doc = line
                    .strip_prefix("//! ")
                    .unwrap_or_default()
                    .trim()
                    .to_string();
                (f.path.join("::"), doc)
            })
            .collect();
        rows.sort();
        rows.iter()
            .map(|(n, d)| format!("- `{n}`: {d}"))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The module an absolute path lands in: its longest known prefix, after following
    /// re-exports (`crate::serve` -> `broker`).
    fn resolve(&self, path: &[String], depth: usize) -> Option<ModPath> {
        for n in (0..=path.len()).rev() {
            let prefix = path[..n].to_vec();
            if n < path.len() && depth < 8 {
                if let Some(target) = self.exports.get(&(prefix.clone(), path[n].clone())) {
                    let mut again = target.clone();
                    again.extend_from_slice(&path[n + 1..]);
                    return self.resolve(&again, depth + 1);
                }
            }
            if n > 0 && self.known.contains(&prefix) {
                return Some(prefix);
            }
        }
        None
    }

    /// The longest known module a path starts with, re-exports not followed.
    fn longest_known(&self, path: &[String]) -> Option<ModPath> {
        (1..=path.len())
            .rev()
            .map(|n| path[..n].to_vec())
            .find(|p| self.known.contains(p))
    }

    /// The node graph, each node's uses of its ancestors, and the sibling graph.
    fn graph(&self) -> Graph {
        let mut g = Graph::default();
        for f in self.files.iter().filter(|f| !f.path.is_empty()) {
            let me = node(&f.path);
            g.nodes.entry(me.clone()).or_default();
            let mut uses = Uses::new(f.path.clone(), self);
            uses.visit_file(&f.ast);
            for (from, target) in uses.targets() {
                // The module the path lands in, and the one that re-exports it if another:
                // a use of a re-export depends on both.
                let landed = self.resolve(&target, 0);
                let named = self.longest_known(&target);
                for t in landed.into_iter().chain(named).collect::<BTreeSet<_>>() {
                    sibling_edge(&mut g.siblings, &from, &t);
                    let to = node(&t);
                    if to == me {
                        continue;
                    }
                    if f.path.starts_with(&t) {
                        g.up.entry(me.clone()).or_default().insert(to);
                    } else if let Some(deps) = g.nodes.get_mut(&me) {
                        deps.insert(to);
                    }
                }
            }
        }
        g
    }
}

/// `a::b::c` -> `a::b`: the node a module belongs to.
fn node(path: &[String]) -> String {
    path.iter().take(2).cloned().collect::<Vec<_>>().join("::")
}

/// Records `from -> to` between the two siblings they descend from, if they differ.
fn sibling_edge(siblings: &mut BTreeMap<String, BTreeSet<String>>, from: &[String], to: &[String]) {
    let common = from.iter().zip(to).take_while(|(a, b)| a == b).count();
    if from.len() > common && to.len() > common {
        let a = from[..=common].join("::");
        let b = to[..=common].join("::");
        siblings.entry(a).or_default().insert(b);
    }
}

/// What the crate's modules use.
#[derive(Default)]
struct Graph {
    /// Node -> the nodes it uses (not its ancestors).
    nodes: BTreeMap<String, BTreeSet<String>>,
    /// Node -> the ancestors whose own declarations it uses.
    up: BTreeMap<String, BTreeSet<String>>,
    /// Module -> the sibling modules it (or anything under it) uses, at every depth.
    siblings: BTreeMap<String, BTreeSet<String>>,
}

/// Whether attributes hold a cfg that only a test build meets: `test`, or `all(…)` with
/// `test` among its terms (`not(test)` and `any(test, …)` are not).
fn test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Meta>()
                .is_ok_and(|m| cfg_requires_test(&m))
    })
}

fn cfg_requires_test(meta: &syn::Meta) -> bool {
    match meta {
        syn::Meta::Path(p) => p.is_ident("test"),
        syn::Meta::List(l) if l.path.is_ident("all") => l
            .parse_args_with(
                syn::punctuated::Punctuated::<syn::Meta, syn::Token![,]>::parse_terminated,
            )
            .is_ok_and(|terms| terms.iter().any(cfg_requires_test)),
        _ => false,
    }
}

/// The `#[path = "…"]` of a module declaration.
fn path_attr(attrs: &[syn::Attribute]) -> Option<String> {
    attrs.iter().find_map(|a| match &a.meta {
        syn::Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => Some(s.value()),
            _ => None,
        },
        _ => None,
    })
}

/// The files the non-test `mod x;` items (inline modules' too) declare: (path, file, the dir
/// its own children live in).
fn declared_files(
    items: &[syn::Item],
    here: &[String],
    dir: &Path,
) -> Vec<(ModPath, PathBuf, PathBuf)> {
    let mut out = Vec::new();
    for item in items {
        let syn::Item::Mod(m) = item else { continue };
        if test_only(&m.attrs) {
            continue;
        }
        let name = m.ident.to_string();
        let mut path = here.to_vec();
        path.push(name.clone());
        match &m.content {
            Some((_, inner)) => out.extend(declared_files(inner, &path, &dir.join(&name))),
            None => {
                let (file, child_dir) = match path_attr(&m.attrs) {
                    Some(p) => (dir.join(&p), dir.join(&p).with_extension("")),
                    None if dir.join(format!("{name}.rs")).exists() => {
                        (dir.join(format!("{name}.rs")), dir.join(&name))
                    }
                    None => (dir.join(&name).join("mod.rs"), dir.join(&name)),
                };
                out.push((path, file, child_dir));
            }
        }
    }
    out
}

/// Collects every module path (inline ones too) and the `pub use` re-exports.
struct Items<'a> {
    known: &'a mut BTreeSet<ModPath>,
    exports: &'a mut BTreeMap<(ModPath, String), ModPath>,
    roots: &'a BTreeSet<String>,
}

impl Items<'_> {
    fn module(&mut self, here: &[String], items: &[syn::Item]) {
        self.known.insert(here.to_vec());
        for item in items {
            match item {
                syn::Item::Mod(m) if !test_only(&m.attrs) => {
                    let mut child = here.to_vec();
                    child.push(m.ident.to_string());
                    match &m.content {
                        Some((_, inner)) => self.module(&child, inner),
                        None => {
                            self.known.insert(child);
                        }
                    }
                }
                syn::Item::Use(u)
                    if !test_only(&u.attrs) && !matches!(u.vis, syn::Visibility::Inherited) =>
                {
                    for (segs, name) in expand(&u.tree) {
                        let Some(name) = name else { continue };
                        let target = match segs.first().map(String::as_str) {
                            Some("crate" | "self" | "super") => absolute(&segs, here, self.roots),
                            _ => Some([here, &segs[..]].concat()),
                        };
                        if let Some(t) = target {
                            self.exports.insert((here.to_vec(), name), t);
                        }
                    }
                }
                _ => {}
            }
        }
    }
}

/// Each path a `use` tree names, with the name it binds (`None` for a glob).
fn expand(tree: &syn::UseTree) -> Vec<(Vec<String>, Option<String>)> {
    fn walk(
        prefix: &mut Vec<String>,
        t: &syn::UseTree,
        out: &mut Vec<(Vec<String>, Option<String>)>,
    ) {
        match t {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                walk(prefix, &p.tree, out);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let name = n.ident.to_string();
                if name == "self" {
                    out.push((prefix.clone(), prefix.last().cloned()));
                } else {
                    out.push((
                        [&prefix[..], std::slice::from_ref(&name)].concat(),
                        Some(name),
                    ));
                }
            }
            syn::UseTree::Rename(r) => {
                let name = r.ident.to_string();
                let segs = if name == "self" {
                    prefix.clone()
                } else {
                    [&prefix[..], &[name]].concat()
                };
                out.push((segs, Some(r.rename.to_string())));
            }
            syn::UseTree::Glob(_) => out.push((prefix.clone(), None)),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    walk(prefix, t, out);
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(&mut Vec::new(), tree, &mut out);
    out
}

/// A path written in module `here`, made absolute from the crate root; `None` when it does
/// not start in the crate (`crate`, `$crate`, `self`, `super`). In a workspace crate (`roots`)
/// the crate root is the module of its name.
fn absolute(segs: &[String], here: &[String], roots: &BTreeSet<String>) -> Option<ModPath> {
    let first = segs.first()?;
    if first == "crate" || first == "$crate" {
        let root = here.first().filter(|h| roots.contains(*h));
        return Some(
            root.into_iter()
                .cloned()
                .chain(segs[1..].iter().cloned())
                .collect(),
        );
    }
    let mut base = here.to_vec();
    let mut i = usize::from(first == "self");
    while segs.get(i).is_some_and(|s| s == "super") {
        base.pop();
        i += 1;
    }
    (i > 0).then(|| [&base[..], &segs[i..]].concat())
}

/// Walks one file: every path into the crate, from the module (inline ones included) that
/// writes it.
struct Uses<'c> {
    crate_: &'c Crate,
    /// The module being walked (inline modules push onto it).
    here: ModPath,
    /// (module, path as written): resolved once the file's bindings are all known.
    written: Vec<(ModPath, Vec<String>)>,
    /// Names a `use` or `extern crate self as` bound to a crate path, per module.
    bound: BTreeMap<(ModPath, String), ModPath>,
}

impl<'c> Uses<'c> {
    fn new(here: ModPath, crate_: &'c Crate) -> Self {
        Uses {
            crate_,
            here,
            written: Vec::new(),
            bound: BTreeMap::new(),
        }
    }

    /// Each (module, absolute path) the file uses.
    fn targets(&self) -> Vec<(ModPath, ModPath)> {
        let mut out = Vec::new();
        for (here, segs) in &self.written {
            let first = &segs[0];
            let abs = absolute(segs, here, &self.crate_.roots).or_else(|| {
                // A name bound here or in an enclosing module of this file, or a child module.
                let mut scope = here.clone();
                loop {
                    if let Some(b) = self.bound.get(&(scope.clone(), first.clone())) {
                        return Some([&b[..], &segs[1..]].concat());
                    }
                    if scope.len() <= self.here.len() || scope.pop().is_none() {
                        break;
                    }
                }
                let child = [&here[..], &segs[..]].concat();
                if self.crate_.known.contains(&child[..=here.len()]) {
                    return Some(child);
                }
                // Another crate of the workspace by its name (`platform::sync::lock`).
                self.crate_.roots.contains(first).then(|| segs.clone())
            });
            if let Some(a) = abs {
                out.push((here.clone(), a));
            }
        }
        out
    }

    fn write(&mut self, segs: Vec<String>) {
        if !segs.is_empty() {
            self.written.push((self.here.clone(), segs));
        }
    }

    /// Paths in a macro call's tokens: `crate :: a :: b` with any spacing, `$crate::…`.
    fn tokens(&mut self, ts: TokenStream) {
        let tokens: Vec<TokenTree> = ts.into_iter().collect();
        let mut i = 0;
        while i < tokens.len() {
            if let TokenTree::Group(g) = &tokens[i] {
                self.tokens(g.stream());
                i += 1;
                continue;
            }
            let dollar = matches!(&tokens[i], TokenTree::Punct(p) if p.as_char() == '$');
            let start = i + usize::from(dollar);
            let mut segs = Vec::new();
            let mut j = start;
            while let Some(TokenTree::Ident(id)) = tokens.get(j) {
                segs.push(id.to_string());
                let colons = matches!((tokens.get(j + 1), tokens.get(j + 2)),
                    (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b)))
                        if a.as_char() == ':' && a.spacing() == Spacing::Joint && b.as_char() == ':');
                if !colons {
                    break;
                }
                j += 3;
            }
            if segs.len() > 1 {
                if dollar && segs[0] == "crate" {
                    segs[0] = "$crate".into();
                }
                self.write(segs);
                i = j + 1;
            } else {
                i += 1;
            }
        }
    }

    fn bind(&mut self, name: String, target: ModPath) {
        self.bound.insert((self.here.clone(), name), target);
    }
}

impl<'ast> Visit<'ast> for Uses<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs: &[syn::Attribute] = match item {
            syn::Item::Const(i) => &i.attrs,
            syn::Item::Enum(i) => &i.attrs,
            syn::Item::ExternCrate(i) => &i.attrs,
            syn::Item::Fn(i) => &i.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Macro(i) => &i.attrs,
            syn::Item::Mod(i) => &i.attrs,
            syn::Item::Static(i) => &i.attrs,
            syn::Item::Struct(i) => &i.attrs,
            syn::Item::Trait(i) => &i.attrs,
            syn::Item::Type(i) => &i.attrs,
            syn::Item::Union(i) => &i.attrs,
            syn::Item::Use(i) => &i.attrs,
            _ => &[],
        };
        if !test_only(attrs) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if let Some((_, items)) = &m.content {
            self.here.push(m.ident.to_string());
            for item in items {
                self.visit_item(item);
            }
            self.here.pop();
        }
    }

    fn visit_item_extern_crate(&mut self, e: &'ast syn::ItemExternCrate) {
        if e.ident == "self" {
            if let Some((_, alias)) = &e.rename {
                let root = self.here.first().filter(|h| self.crate_.roots.contains(*h));
                self.bind(alias.to_string(), root.into_iter().cloned().collect());
            }
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        for (segs, name) in expand(&u.tree) {
            let first = segs.first().map(String::as_str);
            let Some(a) = absolute(&segs, &self.here, &self.crate_.roots) else {
                // `use bound::x` / `use child::x`: resolved with the rest.
                self.write(segs);
                continue;
            };
            if let Some(name) = name {
                if first.is_some()
                    && (a.is_empty() || self.crate_.resolve(&a, 0).as_ref() == Some(&a))
                {
                    self.bind(name, a.clone());
                }
            }
            if !a.is_empty() {
                self.write(segs);
            }
        }
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        if p.leading_colon.is_none() && p.segments.len() > 1 {
            self.write(p.segments.iter().map(|s| s.ident.to_string()).collect());
        }
        syn::visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.visit_path(&m.path);
        self.tokens(m.tokens.clone());
    }

    fn visit_attribute(&mut self, _: &'ast syn::Attribute) {}

    fn visit_impl_item(&mut self, i: &'ast syn::ImplItem) {
        let attrs: &[syn::Attribute] = match i {
            syn::ImplItem::Const(c) => &c.attrs,
            syn::ImplItem::Fn(f) => &f.attrs,
            syn::ImplItem::Type(t) => &t.attrs,
            syn::ImplItem::Macro(m) => &m.attrs,
            _ => &[],
        };
        if !test_only(attrs) {
            syn::visit::visit_impl_item(self, i);
        }
    }

    fn visit_trait_item(&mut self, i: &'ast syn::TraitItem) {
        let attrs: &[syn::Attribute] = match i {
            syn::TraitItem::Const(c) => &c.attrs,
            syn::TraitItem::Fn(f) => &f.attrs,
            syn::TraitItem::Type(t) => &t.attrs,
            syn::TraitItem::Macro(m) => &m.attrs,
            _ => &[],
        };
        if !test_only(attrs) {
            syn::visit::visit_trait_item(self, i);
        }
    }

    fn visit_stmt(&mut self, s: &'ast syn::Stmt) {
        let attrs: &[syn::Attribute] = match s {
            syn::Stmt::Local(l) => &l.attrs,
            syn::Stmt::Macro(m) => &m.attrs,
            _ => &[],
        };
        if !test_only(attrs) {
            syn::visit::visit_stmt(self, s);
        }
    }
}

/// Top-level folder (or module) -> layer number (0 = bottom), from ARCHITECTURE.md.
fn read_layers(doc: &str) -> Result<BTreeMap<String, usize>, String> {
    let block = doc
        .split_once("Layers, bottom up")
        .and_then(|(_, rest)| rest.split("```").nth(1))
        .ok_or("ARCHITECTURE.md has no \"Layers, bottom up\" code block")?;
    let lines: Vec<&str> = block.lines().filter(|l| !l.trim().is_empty()).collect();
    let mut layers = BTreeMap::new();
    for (n, line) in lines.iter().rev().enumerate() {
        let names = line
            .trim()
            .split_once(char::is_whitespace)
            .map_or("", |(_, r)| r);
        let mut plain = String::new();
        let mut depth = 0;
        for c in names.chars() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                _ if depth == 0 => plain.push(c),
                _ => {}
            }
        }
        for name in plain.split('·').map(str::trim).filter(|s| !s.is_empty()) {
            layers.insert(name.to_string(), n);
        }
    }
    Ok(layers)
}

/// Every use of a higher layer, and every node on no layer.
fn layer_problems(g: &Graph, layers: &BTreeMap<String, usize>) -> Vec<String> {
    let top = |m: &str| m.split("::").next().unwrap_or_default().to_string();
    let layer_of = |m: &str| layers.get(m).or_else(|| layers.get(&top(m))).copied();
    let mut problems = Vec::new();
    for (m, deps) in &g.nodes {
        let Some(mine) = layer_of(m) else {
            problems.push(format!(
                "layer: {m}: neither it nor its folder {} is on a layer in ARCHITECTURE.md",
                top(m)
            ));
            continue;
        };
        let up = g.up.get(m).into_iter().flatten();
        for dep in deps.iter().chain(up).collect::<BTreeSet<_>>() {
            if let Some(theirs) = layer_of(dep).filter(|&l| l > mine) {
                problems.push(format!(
                    "layer: {m} (layer {mine}) uses {dep}, a higher layer ({theirs})"
                ));
            }
        }
    }
    problems
}

/// The strongly connected components of more than one node (Tarjan), each sorted.
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'g> {
        graph: &'g BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on: BTreeSet<&'g str>,
        out: Vec<Vec<String>>,
    }
    impl<'g> T<'g> {
        fn strong(&mut self, v: &'g str) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            self.on.insert(v);
            for w in self.graph.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.strong(w);
                    let l = self.low[v].min(self.low[w]);
                    self.low.insert(v, l);
                } else if self.on.contains(w) {
                    let l = self.low[v].min(self.index[w]);
                    self.low.insert(v, l);
                }
            }
            if self.low[v] == self.index[v] {
                let mut comp = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on.remove(w);
                    comp.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if comp.len() > 1 {
                    comp.sort();
                    self.out.push(comp);
                }
            }
        }
    }
    let mut t = T {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v.as_str()) {
            t.strong(v);
        }
    }
    t.out
}
