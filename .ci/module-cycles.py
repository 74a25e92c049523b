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
(`session::handle`); a module may use only its own layer or those below. Every folder of
src/ must be on one.
The codemap in ARCHITECTURE.md (between `<!-- codemap -->` and `<!-- /codemap -->`) must be
one line per module, its first `//!` line, as `--codemap` prints it.
Usage: python3 .ci/module-cycles.py [--graph | --codemap]"""
import os, re, sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
SKIP = {"main", "lib"}


def module_path(path):
    """The full module path of a file, as a list: src/cli/mcp/door.rs -> [cli, mcp, door]."""
    parts = os.path.relpath(path, ROOT)[:-3].split(os.sep)
    if parts[-1] == "mod":
        parts = parts[:-1]
    return parts


def node(parts):
    return "::".join(parts[:2])


def strip(text):
    """The text without comments, string literals and `#[cfg(test)]` items."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r'r#*"(?:.|\n)*?"#*|"(?:\\.|[^"\\])*"', '""', text)
    text = "\n".join(l.split("//")[0] for l in text.splitlines())
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


def resolve(abs_path):
    """The longest known module prefix of an absolute path."""
    for n in range(len(abs_path), 0, -1):
        if tuple(abs_path[:n]) in KNOWN:
            return list(abs_path[:n])
    return None


graph = {}
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
        # a module may use its own folder's declarations (its parent, or an ancestor)
        if target == me or here[: len(t)] == t:
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
    for dep in sorted(graph[m]):
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
