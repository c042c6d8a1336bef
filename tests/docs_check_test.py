#!/usr/bin/env python3
"""The docs against the code they describe (issue #36): a claim that can be
read off the tree is checked, so that it fails here when the code moves
and the text does not.

- The protocol version of docs/PROTOCOL.md ("Version N (this one)") is
  the control codec's kControlVersion (lib/dblp/control/control.h).
- docs/ARCHITECTURE.md's lib/dblp layer table lists every header of each
  layer, and only headers that exist; its src/ table lists every header
  of src/dpdk/ and src/test_hooks/, and only ones that exist.
- README's sample of the main job's output is the report the code makes
  of the run kept in docs/results/readme-main-job/
  (tools/gen-readme-sample --check): regenerated, never pasted.
- Every repository path that README.md and docs/*.md name in backticks
  (lib/, src/, apps/, sim/, training/, python/, tools/, tests/, deploy/,
  docs/, examples/) exists.

docs/FLAGS.md is checked against the apps by the flags_doc test.

Usage: docs_check_test.py SOURCE_DIR
"""

import glob
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dblp_testlib import check, finish  # noqa: E402

ROOTS = ("lib", "src", "apps", "sim", "training", "python", "tools", "tests",
         "deploy", "docs", "examples")
PATH = re.compile(r"`((?:%s)/[^`\s]*)`" % "|".join(ROOTS))


def read(src, rel):
    with open(os.path.join(src, rel), encoding="utf-8") as f:
        return f.read()


def table_rows(text, header):
    """The rows of the first Markdown table after the line `header`, but
    its column names."""
    lines = text[text.index(header):].splitlines()
    if header.startswith("|"):
        lines = lines[1:]
        rows = [None]  # the header was the column names
    else:
        rows = []
    started = False
    for line in lines:
        if line.startswith("|"):
            started = True
            if not set(line) <= set("|-: "):
                rows.append([c.strip() for c in line.strip("|").split("|")])
        elif started:
            break
    return rows[1:]  # without the column names


def ticked(cell):
    return re.findall(r"`([^`]+)`", cell)


def check_version(src, protocol):
    code = re.search(r"kControlVersion = (\d+);",
                     read(src, "lib/dblp/control/control.h"))
    doc = re.findall(r"Version (\d+) \(this one\)", protocol)
    check("docs/PROTOCOL.md's protocol version is the code's (%s, doc %s)" %
          (code and code.group(1), doc),
          code is not None and doc == [code.group(1)])


def check_lib_table(src, readme):
    rows = table_rows(readme, "| layer | files | what |")
    seen = set()
    for row in rows:
        layer = ticked(row[0])[0].rstrip("/")
        seen.add(layer)
        listed = set(ticked(row[1]))
        have = set(os.path.basename(p) for p in
                   glob.glob(os.path.join(src, "lib", "dblp", layer, "*.h")))
        check("ARCHITECTURE's %s/ row lists its headers" % layer, listed == have,
              "missing: %s; not in the tree: %s" %
              (sorted(have - listed), sorted(listed - have)))
    layers = set(d for d in os.listdir(os.path.join(src, "lib", "dblp"))
                 if os.path.isdir(os.path.join(src, "lib", "dblp", d)))
    check("ARCHITECTURE's layer table has every layer of lib/dblp",
          layers == seen, "missing: %s; extra: %s" %
          (sorted(layers - seen), sorted(seen - layers)))


def check_src_table(src, readme):
    rows = table_rows(readme, "| file | what |")
    listed = set()
    for row in rows:
        listed |= set(ticked(row[0]))
    have = set(os.path.relpath(p, os.path.join(src, "src")) for p in
               glob.glob(os.path.join(src, "src", "*.h")) +
               glob.glob(os.path.join(src, "src", "dpdk", "*", "*.h")) +
               glob.glob(os.path.join(src, "src", "test_hooks", "*.h")))
    check("ARCHITECTURE's src/ table lists every header of src/dpdk/ and "
          "src/test_hooks/", have <= listed, sorted(have - listed))
    check("ARCHITECTURE's src/ table names only headers that exist",
          listed <= have, sorted(listed - have))


def check_sample(src):
    r = subprocess.run([sys.executable,
                        os.path.join(src, "tools", "gen-readme-sample"),
                        "--check", "--source", src],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=120)
    check("README's main-job sample is the code's report of the kept run",
          r.returncode == 0, r.stdout.strip())


def check_paths(src):
    docs = ["README.md"] + sorted(
        os.path.relpath(p, src)
        for p in glob.glob(os.path.join(src, "docs", "*.md")))
    missing = []
    for rel in docs:
        for m in PATH.finditer(read(src, rel)):
            path = m.group(1).rstrip(".,:;)")
            # Patterns, placeholders and line numbers name no one file.
            if re.search(r"[*<>{}$]|\.\.\.", path):
                continue
            path = re.sub(r":\d+(-\d+)?$", "", path)
            if not os.path.exists(os.path.join(src, path)):
                missing.append("%s: %s" % (rel, path))
    check("every path the docs name exists (%d docs)" % len(docs),
          not missing, "\n".join(missing))


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    src = os.path.abspath(sys.argv[1])
    architecture = read(src, "docs/ARCHITECTURE.md")
    check_version(src, read(src, "docs/PROTOCOL.md"))
    check_lib_table(src, architecture)
    check_src_table(src, architecture)
    check_sample(src)
    check_paths(src)
    finish()


if __name__ == "__main__":
    sys.exit(main())
