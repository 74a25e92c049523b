#!/usr/bin/env python3
"""Checks the crate's module graph: no import cycle, and no folder using a folder on a higher
layer than its own.

A node is a module two levels deep at most: `wire::wsframe`, `cli::mcp` (with everything under
it), `editor` (its mod.rs). Every path into the crate counts, in every form: `use crate::…`
trees with groups, `self`, globs and renames; `super::…` and `self::…`; inline `crate::a::b`
paths; and a name a `use` brought in, used as a path later (`use crate::frontdoor;` then
`frontdoor::socket::X`). A module may use what its parent folder declares (`super::X` from
`editor::lockfile` into `editor` is not an edge), so a cycle is one between siblings or
across folders. `#[cfg(test)]` code is left out (a test may use anything).

The layers are the code block under "Layers, bottom up" in ARCHITECTURE.md, bottom line
last: each line names top-level folders, and modules that sit lower than their folder
(`registry::session`); a module may use only its own layer or those below. Every folder of
src/ must be on one.
The codemap in ARCHITECTURE.md (between `<!-- codemap -->` and `<!-- /codemap -->`) must be
one line per module, its first `//!` line, as `--codemap` prints it.
`--self-test` plants, on a copy of the tree, each form of upward use a text-only reader misses
(a path after a `b'"'` literal, a crate-root re-export, a `super::super::` chain, a child using
its parent on a higher layer) and fails unless every one is caught.
Usage: python3 .ci/module-cycles.py [--graph | --codemap | --self-test]"""
import os, re, shutil, subprocess, sys, tempfile

ROOT = os.environ.get("MODULE_CYCLES_SRC") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")


def self_test():
    """Each planted upward use must fail the check on a copy of the tree."""
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.join(here, "..")
    bottom = "protocol/jsonrpc.rs"  # the bottom layer
    plants = {
        "a path after a b'\"' literal": "pub fn planted() -> u8 { let _q = b'\"'; crate::cli::stop::X }\n",
        "a char '\"' then a path": "pub fn planted() -> char { let _q = '\"'; crate::cli::stop::X }\n",
        "a crate-root re-export": "pub fn planted() { crate::serve(); }\n",
        "a super::super chain": "pub fn planted() { super::super::cli::stop::X; }\n",
        "a raw string then a path": 'pub fn planted() { let _q = r#"a " b"#; crate::daemon::X; }\n',
    }
    failed = []
    for what, code in plants.items():
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copytree(os.path.join(repo, "src"), os.path.join(tmp, "src"))
            shutil.copy(os.path.join(repo, "ARCHITECTURE.md"), tmp)
            with open(os.path.join(tmp, "src", bottom), "a") as f:
                f.write(code)
            r = subprocess.run([sys.executable, os.path.abspath(__file__)], env={**os.environ, "MODULE_CYCLES_SRC": os.path.join(tmp, "src")}, capture_output=True, text=True)
            if r.returncode == 0 or "protocol" not in r.stdout:
                failed.append(f"{what}: not caught ({r.stdout.strip()})")
    # A child using its parent's own declaration, the child on a lower layer than its folder.
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(os.path.join(repo, "src"), os.path.join(tmp, "src"))
        doc = open(os.path.join(repo, "ARCHITECTURE.md")).read()
        doc = re.sub(r"(\n \w+ +editor)\b", r"\1 · registry::limits", doc, count=1)
        with open(os.path.join(tmp, "ARCHITECTURE.md"), "w") as f:
            f.write(doc)
        with open(os.path.join(tmp, "src", "registry", "mod.rs"), "a") as f:
            f.write("pub fn planted_parent() {}\n")
        with open(os.path.join(tmp, "src", "registry", "limits.rs"), "a") as f:
            f.write("pub fn planted() { super::planted_parent(); }\n")
        r = subprocess.run([sys.executable, os.path.abspath(__file__)], env={**os.environ, "MODULE_CYCLES_SRC": os.path.join(tmp, "src")}, capture_output=True, text=True)
        if r.returncode == 0:
            failed.append(f"a child using its higher parent: not caught ({r.stdout.strip()})")
    for f in failed:
        print("self-test:", f)
    if failed:
        sys.exit(1)
    print(f"self-test: all {len(plants) + 1} planted upward uses are caught")
    sys.exit(0)


if "--self-test" in sys.argv:
    self_test()
SKIP = {"main", "lib"}


def module_path(path):
    """The full module path of a file, as a list: src/cli/mcp/door.rs -> [cli, mcp, door]."""
    parts = os.path.relpath(path, ROOT)[:-3].split(os.sep)
    if parts[-1] == "mod":
        parts = parts[:-1]
    return parts


def node(parts):
    return "::".join(parts[:2])


def lex(text):
    """The text with comments, string, byte-string, raw-string, char and byte literals blanked
    out (a literal becomes `""`), scanned as Rust's lexer reads them: a `"` inside `b'"'` or
    `'"'` opens no string, a raw string ends only at its own `"#…`, block comments nest.
    Lifetimes and labels (`'a`) are kept."""
    out, i, n = [], 0, len(text)
    char_lit = re.compile(r"b?'(?:\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]{1,6}\}|.)|[^\\'\n])'")
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
            out.append(" ")
            continue
        raw = re.match(r'(?:br|r)(#*)"', text[i:i + 300]) if c in "rb" and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")) else None
        if raw:
            end = text.find('"' + raw.group(1), i + raw.end())
            i = n if end < 0 else end + 1 + len(raw.group(1))
            out.append('""')
            continue
        if c == '"' or (c == "b" and text.startswith('b"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_"))):
            j = i + (2 if c == "b" else 1)
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            i = j + 1
            out.append('""')
            continue
        if c in "'b":
            m = char_lit.match(text, i)
            if m and (c == "'" or m.group(0).startswith("b'")) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
                i = m.end()
                out.append("' '")
                continue
        out.append(c)
        i += 1
    return "".join(out)


def strip(text):
    """The text without comments, literals (`lex`) and `#[cfg(test)]` items."""
    text = lex(text)
    out, i = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]", text):
        if m.start() < i:
            continue
        out.append(text[i:m.start()])
        # skip the item that follows: up to its `;` or its matching `}`
        j, depth = m.end(), 0
        while j < len(text):
            c = text[j]
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    j += 1
                    break
            elif c == ";" and depth == 0:
                j += 1
                break
            j += 1
        i = j
    out.append(text[i:])
    return "".join(out)


def expand(tree):
    """`a::{b, c::{self, d}, e as f}` -> [([a, b], b), ([a, c], c), ([a, c, d], d), ([a, e], f)]:
    each path a `use` tree names, with the name it binds (None for a glob)."""
    tree = re.sub(r"\s*(::|[{},])\s*", r"\1", " ".join(tree.split()))
    items = []

    def split(s):
        parts, depth, cur = [], 0, ""
        for c in s:
            if c == "," and depth == 0:
                parts.append(cur)
                cur = ""
                continue
            depth += (c == "{") - (c == "}")
            cur += c
        return parts + [cur] if cur else parts

    def walk(prefix, s):
        if s.endswith("}"):
            head, rest = s.split("{", 1)
            for part in split(rest[:-1]):
                walk(prefix + [p for p in head.split("::") if p], part)
            return
        path, _, alias = s.partition(" as ")
        segs = prefix + [p for p in path.split("::") if p]
        if segs and segs[-1] == "*":
            items.append((segs[:-1], None))
            return
        if segs and segs[-1] == "self":
            segs = segs[:-1]
        if segs:
            items.append((segs, alias or segs[-1]))

    walk([], tree)
    return items


def absolute(segs, here):
    """A path as written in module `here` (a list), made absolute from the crate root; None
    when it does not start in the crate."""
    if not segs:
        return None
    if segs[0] == "crate":
        return segs[1:]
    base = list(here)
    i = 0
    if segs[0] == "self":
        i = 1
    while i < len(segs) and segs[i] == "super":
        base = base[:-1]
        i += 1
    if i == 0:
        return None
    return base + segs[i:]


def modules():
    found = {}
    for dirpath, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".rs"):
                path = os.path.join(dirpath, f)
                mp = module_path(path)
                if mp[0] in SKIP or mp[-1] == "tests":
                    continue
                found[path] = mp
    return found


FILES = modules()
KNOWN = {tuple(mp) for mp in FILES.values()}


def exports():
    """Module (a tuple; () for the crate root) -> {name it re-exports: absolute path}, from its
    `pub use` / `pub(crate) use` items: `crate::serve` is `daemon::serve`."""
    found = {}
    lib = os.path.join(ROOT, "lib.rs")
    for path, here in list(FILES.items()) + [(lib, [])]:
        text = strip(open(path).read())
        for tree in re.findall(r"\bpub(?:\([^)]*\))?\s+use\s+([^;]*);", text):
            for segs, name in expand(tree):
                a = absolute(segs, here) if segs[0] in ("crate", "self", "super") else here + segs
                if a is not None and name:
                    found.setdefault(tuple(here), {})[name] = a
    return found


EXPORTS = exports()


def resolve(abs_path, depth=0):
    """The module an absolute path lands in: its longest known module prefix, after
    following re-exports (`crate::serve` -> `daemon`)."""
    for n in range(len(abs_path), -1, -1):
        prefix = tuple(abs_path[:n])
        if n < len(abs_path) and depth < 8:
            target = EXPORTS.get(prefix, {}).get(abs_path[n])
            if target is not None:
                return resolve(target + abs_path[n + 1:], depth + 1)
        if n and prefix in KNOWN:
            return list(prefix)
    return None


graph = {}
# Uses of an ancestor's own declarations (`super::X` from `registry::session` into `registry`):
# no cycle edge (a parent declares its children), but a layer check all the same.
up_uses = {}
for path, here in FILES.items():
    text = strip(open(path).read())
    me = node(here)
    deps = graph.setdefault(me, set())
    targets = []
    bound = {}
    for tree in re.findall(r"\buse\s+((?:crate|super|self)\b[^;]*);", text):
        for segs, name in expand(tree):
            a = absolute(segs, here)
            if a is None:
                continue
            targets.append(a)
            if name and resolve(a) == a:
                bound[name] = a
    for m in re.finditer(r"(?<![\w:])((?:crate|super|self)(?:::\w+)+)", text):
        a = absolute(m.group(1).split("::"), here)
        if a is not None:
            targets.append(a)
    for name, a in bound.items():
        for m in re.finditer(rf"(?<![\w:]){re.escape(name)}((?:::\w+)+)", text):
            targets.append(a + m.group(1).split("::")[1:])
    for a in targets:
        t = resolve(a)
        if t is None:
            continue
        target = node(t)
        if target == me:
            continue
        if here[: len(t)] == t:
            up_uses.setdefault(me, set()).add(target)
            continue
        deps.add(target)


def read_layers():
    """Top-level folder -> layer number (0 = bottom) from ARCHITECTURE.md's layer block."""
    doc = open(os.path.join(ROOT, "..", "ARCHITECTURE.md")).read()
    block = doc.split("Layers, bottom up", 1)[1].split("```", 2)[1]
    lines = [l for l in block.splitlines() if l.strip()]
    layers = {}
    for n, line in enumerate(reversed(lines)):
        names = re.sub(r"\([^)]*\)", "", line.split(None, 1)[1])
        for name in names.split("·"):
            if name.strip():
                layers[name.strip()] = n
    return layers


def codemap():
    """One line per node module: `- `name`: its first `//!` line`."""
    rows = {}
    for path, mp in FILES.items():
        if len(mp) > 2:
            continue
        first = open(path).readline()
        rows["::".join(mp)] = first[4:].strip() if first.startswith("//! ") else ""
    return "\n".join(f"- `{n}`: {rows[n]}" for n in sorted(rows))


if "--codemap" in sys.argv:
    print(codemap())
    sys.exit(0)
doc = open(os.path.join(ROOT, "..", "ARCHITECTURE.md")).read()
if "<!-- codemap -->" not in doc:
    print("ARCHITECTURE.md has no <!-- codemap --> block")
    sys.exit(1)
written = doc.split("<!-- codemap -->", 1)[1].split("<!-- /codemap -->", 1)[0].strip()
if written != codemap():
    print("ARCHITECTURE.md's codemap is not the modules' first //! lines; paste `python3 .ci/module-cycles.py --codemap` between its markers")
    sys.exit(1)

layers = read_layers()
problems = []
top = lambda m: m.split("::")[0]
layer_of = lambda m: layers.get(m, layers.get(top(m)))
for m in sorted(graph):
    if layer_of(m) is None:
        problems.append(f"{m}: neither it nor its folder {top(m)} is on a layer in ARCHITECTURE.md")
        continue
    for dep in sorted(graph[m] | up_uses.get(m, set())):
        if layer_of(dep) is not None and layer_of(dep) > layer_of(m):
            problems.append(f"{m} (layer {layer_of(m)}) uses {dep}, a higher layer ({layer_of(dep)})")

if "--graph" in sys.argv:
    for m in sorted(graph):
        print(f"{m} -> {', '.join(sorted(graph[m])) or '-'}")

# cycle detection (Tarjan)
index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]


def strong(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(v)
    for w in sorted(graph.get(v, ())):
        if w not in graph:
            continue
        if w not in index:
            strong(w)
            low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop()
            on.discard(w)
            comp.append(w)
            if w == v:
                break
        if len(comp) > 1:
            sccs.append(sorted(comp))


sys.setrecursionlimit(10000)
for v in sorted(graph):
    if v not in index:
        strong(v)
for p in problems:
    print("layer:", p)
for c in sccs:
    print("cycle among:", ", ".join(c))
if sccs or problems:
    sys.exit(1)
print(f"{len(graph)} modules, {sum(len(d) for d in graph.values())} edges: no import cycle; every folder uses only its own layer or those below ({len(set(layers.values()))} layers)")
