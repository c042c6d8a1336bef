#!/usr/bin/env python3
"""Holds the library's layers to their one-way dependencies.

Usage: check-layers.py --root SRC [--stamp FILE] LAYER=DEP,DEP ...

Each LAYER is a folder lib/dblp/LAYER/ whose files may include, of the
project's headers, only "dblp/L/..." for L the layer itself or one it is
built on (DEPs, transitively). Nothing in lib/ includes DPDK (rte_*), src/,
sim/, apps/ or training/. sim/ may include any layer but nothing of src/ or
apps/. Exit 1 with one line per violation, naming file, line and the fix.
"""
import argparse
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]')


def closure(direct):
    allowed = {}

    def walk(layer, seen):
        for d in direct.get(layer, []):
            if d not in seen:
                seen.add(d)
                walk(d, seen)
        return seen

    for layer in direct:
        allowed[layer] = walk(layer, {layer})
    return allowed


def check_file(path, rel, layer, allowed, errors):
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            kind, target = m.groups()
            where = f"{rel}:{n}"
            if kind == "<" and target.startswith("rte_"):
                errors.append(f"{where}: {target}: no DPDK below src/ "
                              "(move the code to src/ or pass it in)")
                continue
            if kind != '"':
                continue
            top = target.split("/")[0]
            if top in ("src", "apps", "training") or (
                    layer is not None and top == "sim"):
                errors.append(f"{where}: includes {target}: "
                              f"{'lib/dblp/' + layer if layer else rel} "
                              f"may not depend on {top}/")
                continue
            if layer is None or not target.startswith("dblp/"):
                continue
            parts = target.split("/")
            if len(parts) < 3:
                errors.append(f"{where}: {target}: headers live in "
                              "dblp/<layer>/ (lib/meson.build lists them)")
                continue
            if parts[1] not in allowed[layer]:
                errors.append(
                    f"{where}: layer '{layer}' includes {target} of layer "
                    f"'{parts[1]}', which is not below it (allowed: "
                    f"{', '.join(sorted(allowed[layer]))}); move the code "
                    "down, or change layer_deps in lib/meson.build")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--stamp")
    ap.add_argument("layers", nargs="+")
    a = ap.parse_args()
    direct = {}
    for spec in a.layers:
        name, _, deps = spec.partition("=")
        direct[name] = [d for d in deps.split(",") if d]
    for layer, deps in direct.items():
        for d in deps:
            if d not in direct:
                sys.exit(f"check-layers: layer {layer} names unknown {d}")
    allowed = closure(direct)
    for layer in direct:
        if any(layer in allowed[d] for d in direct[layer]):
            sys.exit(f"check-layers: layer {layer} depends on itself")
    errors = []
    lib = os.path.join(a.root, "lib", "dblp")
    for entry in sorted(os.listdir(lib)):
        full = os.path.join(lib, entry)
        if not os.path.isdir(full):
            if entry.endswith((".h", ".cc")):
                errors.append(f"lib/dblp/{entry}: not in a layer folder")
            continue
        if entry not in direct:
            errors.append(f"lib/dblp/{entry}/: a folder that is no layer "
                          "(add it to lib/meson.build)")
            continue
        for dirpath, _, names in os.walk(full):
            for name in sorted(names):
                if name.endswith((".h", ".cc", ".in")):
                    path = os.path.join(dirpath, name)
                    check_file(path, os.path.relpath(path, a.root), entry,
                               allowed, errors)
    sim = os.path.join(a.root, "sim")
    if os.path.isdir(sim):
        for name in sorted(os.listdir(sim)):
            if name.endswith((".h", ".cc")):
                path = os.path.join(sim, name)
                check_file(path, os.path.relpath(path, a.root), None,
                           allowed, errors)
    if errors:
        print("\n".join(errors), file=sys.stderr)
        print(f"check-layers: {len(errors)} violation(s)", file=sys.stderr)
        return 1
    if a.stamp:
        with open(a.stamp, "w") as f:
            f.write("ok\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
