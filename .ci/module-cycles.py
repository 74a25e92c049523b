#!/usr/bin/env python3
"""Prints the crate's module dependency graph (from `crate::` paths in src/) and fails when
it has a cycle, or when a module uses one on a higher layer than its own (the layers are the
code block under "Layers, bottom up" in ARCHITECTURE.md, bottom line first; every module must
be on one). Modules are top-level (`frontdoor::x` counts as `frontdoor::x`).
Usage: python3 .ci/module-cycles.py [--graph]"""
import os, re, sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
SKIP = {"main", "lib"}

def module_of(path):
    rel = os.path.relpath(path, ROOT)[:-3]
    parts = rel.split(os.sep)
    if parts[-1] in ("mod", "tests"):
        parts = parts[:-1]
    if parts and parts[0] in ("frontdoor", "session") and len(parts) > 1:
        return parts[0] + "::" + parts[1]
    return parts[0]

def strip_comments(text):
    return "\n".join(l.split("//")[0] for l in text.splitlines())

def strip_tests(text):
    # drop #[cfg(test)] mod tests { ... } blocks (they may use anything)
    i = text.find("#[cfg(test)]")
    return text if i < 0 else text[:i]

graph = {}
for dirpath, _, files in os.walk(ROOT):
    for f in files:
        if not f.endswith(".rs"):
            continue
        path = os.path.join(dirpath, f)
        if os.path.basename(path) == "tests.rs":
            continue
        m = module_of(path)
        if m in SKIP:
            continue
        text = strip_comments(strip_tests(open(path).read()))
        deps = graph.setdefault(m, set())
        for dep in re.findall(r"crate::((?:frontdoor::|session::(?=handle))?[a-z_]+)", text):
            if dep in ("frontdoor",):
                continue
            if dep != m:
                deps.add(dep)
        # `super::x` inside frontdoor/ or session/ names a sibling
        if "::" in m:
            parent = m.split("::")[0]
            for dep in re.findall(r"super::([a-z_]+)", text):
                if dep in ("handle", "compat", "native", "socket", "stdio", "limits"):
                    deps.add(parent + "::" + dep)
                else:
                    deps.add(parent)
        # `use crate::frontdoor;` (alone or in a group), then `frontdoor::x::...` in the code
        for parent in ("frontdoor", "session"):
            imported = re.search(rf"use crate::{parent};", text) or any(
                re.search(rf"(^|,)\s*{parent}\s*(,|$)", g)
                for g in re.findall(r"use crate::\{([^}]*)\}", text)
            )
            if imported:
                for dep in re.findall(rf"(?<![:\w]){parent}::([a-z_]+)", text):
                    if dep != "handle" or parent == "session":
                        name = parent + "::" + dep
                        if name != m:
                            deps.add(name)
        # `use crate::{a, b::c}` groups
        for group in re.findall(r"use crate::\{([^}]*)\}", text):
            for item in group.split(","):
                parts = [x.strip() for x in item.strip().split("::")]
                name = "::".join(parts[:2]) if parts[0] in ("frontdoor", "session") and len(parts) > 1 and parts[1] not in ("self", "{") and parts[1][:1].islower() else parts[0]
                if name and name != m and name != "frontdoor":
                    deps.add(name)

def read_layers():
    """Module -> layer number (0 = bottom) from ARCHITECTURE.md's layer block."""
    doc = open(os.path.join(ROOT, "..", "ARCHITECTURE.md")).read()
    block = doc.split("Layers, bottom up", 1)[1].split("```", 2)[1]
    lines = [l for l in block.splitlines() if l.strip()]
    layers = {}
    for n, line in enumerate(reversed(lines)):
        names = re.sub(r"\([^)]*\)", "", line.split(None, 1)[1])
        names = re.sub(r"(\w+)::\{([^}]*)\}", lambda g: " · ".join(g.group(1) + "::" + x.strip() for x in g.group(2).split(",")), names)
        for name in names.split("·"):
            name = name.strip()
            if name:
                layers[name] = n
    return layers

layers = read_layers()
problems = []
for m in sorted(graph):
    if m not in layers:
        problems.append(f"{m} is on no layer in ARCHITECTURE.md")
        continue
    for dep in sorted(graph[m]):
        if dep in layers and layers[dep] > layers[m]:
            problems.append(f"{m} (layer {layers[m]}) uses {dep}, a higher layer ({layers[dep]})")

if "--graph" in sys.argv:
    for m in sorted(graph):
        print(f"{m} -> {', '.join(sorted(graph[m])) or '-'}")

# cycle detection (Tarjan)
index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]
def strong(v):
    index[v] = low[v] = counter[0]; counter[0] += 1
    stack.append(v); on.add(v)
    for w in graph.get(v, ()):
        if w not in graph:
            continue
        if w not in index:
            strong(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop(); on.discard(w); comp.append(w)
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
if sccs:
    for c in sccs:
        print("cycle among:", ", ".join(c))
if sccs or problems:
    sys.exit(1)
print(f"no import cycle between modules; every module uses only its own layer or those below ({len(set(layers.values()))} layers)")
