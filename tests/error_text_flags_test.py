#!/usr/bin/env python3
"""Every flag the products' texts suggest exists (issue #21, item 7).

Collects each `--name` inside a string literal of the product sources
(apps/, src/, lib/, sim/, training/: errors, hints, help and usage texts)
and checks it against the flags the apps list in `--help` (an app's own
file: that app's flags; shared code: any app's), or the EAL's options
(`dblp-server --help` before the `--`) for the DPDK texts. A renamed or
misspelt flag in a message (`--nb_rxd` for `--rxd`) fails the test.
Options of other programs a message names (meson, apt-get, ...) are listed
below with the program.

Usage: error_text_flags_test.py SOURCE_DIR BUILD_DIR
"""

import os
import re
import subprocess
import sys
from dblp_testlib import check, finish

APPS = ["dblp-server", "dblp-worker", "dblp-udp-server", "dblp-udp-worker",
        "dblp-sim", "dblp-floor", "dblp-sendframes", "dblp-udp-bench",
        "dblp-inmem-demo"]
DPDK_APPS = {"dblp-server", "dblp-worker", "dblp-sendframes"}
# Options of other programs that texts tell the operator to run.
OTHER_PROGRAMS = {
    "reconfigure": "meson setup --reconfigure",
    "status": "dpdk-devbind.py --status",
    "status-dev": "dpdk-devbind.py --status-dev",
    "help": "every app's --help",
    "version": "every app's --version",
}
# Another app's flag an app's text names on purpose.
CROSS_REFERENCES = {
    ("dblp-worker", "bcast_tolerance"): "the server's, in --bcast_fill's help",
}
# "options are --name=value": the form, not a flag.
PLACEHOLDER = "--name=value"
SOURCE_DIRS = ["apps", "src", "lib", "sim", "training"]
LITERAL = re.compile(r'"((?:[^"\\\n]|\\.)*)"')
SCRIPT = re.compile(r"\b(?:deploy|tools)/[\w.-]+")
FLAG = re.compile(r"(?<![\w-])--([a-zA-Z][a-zA-Z0-9_-]*)")


def help_flags(build, app):
    """The flags `app` lists in its --help (gflags: "    -name (...")."""
    path = os.path.join(build, "apps", app)
    name = os.path.basename(app)
    cmd = [path, "--", "--help"] if name in DPDK_APPS - {"dblp-sendframes"} \
        else [path, "--help"]
    if app == "dblp-sendframes":  # EAL first, then its flags after --
        cmd = [path, "--no-huge", "--no-pci", "-m", "64",
               "--file-prefix=dblp-flagtext-%d" % os.getpid(), "--", "--help"]
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, timeout=60).stdout
    return set(re.findall(r"^    -([a-zA-Z0-9_]+) \(", out, re.M))


def eal_options(build):
    """The EAL's long options, from its usage text (dblp-sendframes starts
    the EAL first, so its --help is the EAL's)."""
    out = subprocess.run(
        [os.path.join(build, "apps", "dblp-sendframes"), "--help"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        timeout=60).stdout
    return set(m.group(1) for m in FLAG.finditer(out))


def script_options(src, literal):
    """Options of the repository's scripts the literal names (deploy/x.sh,
    tools/x): each script's own text, where its options are parsed."""
    opts = set()
    for m in SCRIPT.finditer(literal):
        path = os.path.join(src, m.group(0))
        if os.path.isfile(path):
            with open(path, errors="replace") as f:
                opts |= set(x.group(1) for x in FLAG.finditer(f.read()))
    return opts


def owner(path):
    base = os.path.basename(path)
    if path.startswith("apps" + os.sep) and base.startswith("dblp_") and \
            base.endswith(".cc"):
        return base[:-3].replace("_", "-")
    return None


def main():
    src, build = sys.argv[1], sys.argv[2]
    apps = [a for a in APPS if os.path.exists(os.path.join(build, "apps", a))]
    flags = {a: help_flags(build, a) for a in apps}
    for a in apps:
        check("%s --help lists its flags" % a, len(flags[a]) > 3,
              sorted(flags[a]))
    any_app = set().union(*flags.values())
    # src/test_hooks/ speaks for the tests' twins (apps/hooked/,
    # -Dtest_hooks=true): their fault flags count there only.
    hooked = set()
    for a in ("dblp-worker", "dblp-udp-worker", "dblp-sim"):
        if os.path.exists(os.path.join(build, "apps", "hooked", a)):
            hooked |= help_flags(build, os.path.join("hooked", a))
    eal = eal_options(build) if "dblp-sendframes" in flags else set()
    check("the EAL's options are listed", "vdev" in eal, sorted(eal))
    unknown = []
    seen = 0
    for d in SOURCE_DIRS:
        for root, _, files in os.walk(os.path.join(src, d)):
            for f in files:
                if not f.endswith((".cc", ".h")):
                    continue
                path = os.path.join(root, f)
                rel = os.path.relpath(path, src)
                app = owner(rel)
                if app is not None and app not in flags:
                    continue  # not built here
                known = flags[app] if app else any_app
                if rel.startswith(os.path.join("src", "test_hooks")):
                    known = any_app | hooked
                with open(path, errors="replace") as fh:
                    text = fh.read()
                for lit in LITERAL.finditer(text):
                    body = lit.group(1).replace(PLACEHOLDER, "")
                    scripts = script_options(src, body)
                    for m in FLAG.finditer(body):
                        name = m.group(1)
                        seen += 1
                        gname = name.replace("-", "_")
                        if gname in known or name in eal or \
                                name in OTHER_PROGRAMS or name in scripts or \
                                (app, gname) in CROSS_REFERENCES:
                            continue
                        line = text.count("\n", 0, lit.start()) + 1
                        unknown.append("%s:%d: --%s" % (rel, line, name))
    check("the sources suggest flags (%d found)" % seen, seen > 100)
    check("every flag a text suggests exists", not unknown,
          "\n".join(unknown))
    finish()


if __name__ == "__main__":
    main()
