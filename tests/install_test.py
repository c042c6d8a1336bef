#!/usr/bin/env python3
"""`meson install --destdir` puts every file the systemd units name in place.

Runs `meson install --no-rebuild --destdir <tmp>` on the build dir, reads
the installed units (deploy/systemd/*.service.in after configure) and
checks that:

- every absolute path a unit names (ExecStart/ExecStartPre binaries and
  scripts, also commented out, EnvironmentFile, ConditionPathExists,
  --flagfile=, Documentation=file://) exists under the destdir (%i = 0, or 1 for
  dblp-shard@, whose example is shard 1);
- those paths sit where the configured prefix puts them (bindir, sysconfdir,
  datadir of `meson introspect`), and the units are in the unit dir;
- the installed flagfiles hold only flags the installed apps know (the apps
  read them up to the job secret, which a fresh install does not have);
- the deploy scripts are installed executable, and a second install keeps
  an edited config (never overwrites SYSCONFDIR/dblp/*).

Usage: install_test.py MESON BUILD_DIR
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

from dblp_testlib import check, finish  # noqa: E402


def introspect(meson, build):
    out = subprocess.run([meson, "introspect", "--buildoptions", build],
                         check=True, capture_output=True, text=True).stdout
    opts = {o["name"]: o["value"] for o in json.loads(out)}
    prefix = opts["prefix"]

    def under(v):
        return v if os.path.isabs(v) else os.path.join(prefix, v)

    unitdir = opts.get("systemdunitdir") or os.path.join(prefix, "lib",
                                                         "systemd", "system")
    return {"prefix": prefix, "bindir": under(opts["bindir"]),
            "sysconfdir": under(opts["sysconfdir"]),
            "datadir": under(opts["datadir"]), "unitdir": unitdir}


def install(meson, build, dest):
    return subprocess.run([meson, "install", "-C", build, "--no-rebuild",
                           "--quiet", "--destdir", dest],
                          capture_output=True, text=True)


PATH_RE = re.compile(r"(?:file://)?(/[^\s\"']+)")


def unit_paths(text, instance="0"):
    """(kind, path) for every path a unit names, %i expanded to `instance`
    (the instance whose example config is installed)."""
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        commented = line.startswith("#")
        body = line.lstrip("#").strip()
        m = re.match(r"(ExecStart\w*|EnvironmentFile|ConditionPathExists|"
                     r"Documentation)=(.*)", body)
        if not m:
            continue
        key, value = m.group(1), m.group(2).replace("%i", instance)
        if commented and not key.startswith("ExecStart"):
            continue
        if key.startswith("ExecStart"):
            words = value.lstrip("-@+!:").split()
            out.append((key + " binary", words[0]))
            out += [("--flagfile", w.split("=", 1)[1]) for w in words
                    if w.startswith("--flagfile=")]
        else:
            for p in PATH_RE.findall(value.lstrip("-")):
                out.append((key, p))
    return out


def main():
    meson, build = sys.argv[1], sys.argv[2]
    dirs = introspect(meson, build)
    print("prefix %(prefix)s: bindir %(bindir)s, sysconfdir %(sysconfdir)s,"
          " datadir %(datadir)s, units %(unitdir)s" % dirs)
    dest = tempfile.mkdtemp(prefix="dblp-install-")
    try:
        p = install(meson, build, dest)
        check("meson install --destdir succeeds", p.returncode == 0,
              p.stdout[-2000:] + p.stderr[-2000:])
        if p.returncode != 0:
            finish()

        def D(path):
            return os.path.join(dest, path.lstrip("/"))

        units = ["dblp-server.service", "dblp-worker@.service",
                 "dblp-shard@.service"]
        for u in units:
            path = D(os.path.join(dirs["unitdir"], u))
            check("unit %s installed in %s" % (u, dirs["unitdir"]),
                  os.path.isfile(path), path)
            if not os.path.isfile(path):
                continue
            with open(path) as f:
                text = f.read()
            # dblp-shard@1: shard 0 is the directory (dblp-server).
            named = unit_paths(text, "1" if u.startswith("dblp-shard@")
                               else "0")
            kinds = {k for k, _ in named}
            check("%s names a binary, an EnvironmentFile and a flagfile" % u,
                  {"ExecStart binary", "EnvironmentFile",
                   "--flagfile"} <= kinds, named)
            check("%s has no unsubstituted @VAR@" % u, "@" not in
                  text.replace("dblp-worker@", "").replace("dblp-shard@", ""),
                  text)
            for kind, p in named:
                check("%s: %s %s exists under destdir" % (u, kind, p),
                      os.path.exists(D(p)), D(p))
                want = {"ExecStart binary": dirs["bindir"],
                        "ExecStartPre binary": dirs["datadir"],
                        "EnvironmentFile": dirs["sysconfdir"],
                        "ConditionPathExists": dirs["sysconfdir"],
                        "--flagfile": dirs["sysconfdir"],
                        "Documentation": dirs["datadir"]}.get(kind)
                if want:
                    check("%s: %s %s is under %s" % (u, kind, p, want),
                          p.startswith(want.rstrip("/") + "/"), p)
                if kind.endswith("binary"):
                    check("%s: %s is executable" % (u, p),
                          os.access(D(p), os.X_OK), D(p))

        # The flagfiles hold only known flags: every flag a line (or a
        # commented-out line) names is in the app's --help. gflags ignores
        # an unknown flag inside a --flagfile, so running the app with it
        # proves nothing. Then each app reads its own file up to the job
        # secret (absent here) and says so.
        for app, flags in (("dblp-server", "server.flags"),
                           ("dblp-server", "shard-1.flags"),
                           ("dblp-worker", "worker-0.flags")):
            ff = D(os.path.join(dirs["sysconfdir"], "dblp", flags))
            binary = D(os.path.join(dirs["bindir"], app))
            h = subprocess.run([binary, "--", "--help"], capture_output=True,
                               text=True, timeout=30)
            known = set(re.findall(r"^\s+-(\w+) \(", h.stdout + h.stderr,
                                   re.M))
            with open(ff) as f:
                named = set(re.findall(r"^#?--(\w+)", f.read(), re.M))
            check("%s's --help lists flags" % app, len(known) > 20,
                  h.stdout[-500:])
            check("%s names only %s's flags" % (flags, app),
                  named and named <= known, sorted(named - known))
            r = subprocess.run(
                [binary, "--", "--flagfile=" + ff,
                 "--secret_file=" + os.path.join(dest, "no-such.secret")],
                capture_output=True, text=True, timeout=30)
            out = r.stdout + r.stderr
            check("%s reads %s up to the job secret" % (app, flags),
                  r.returncode != 0 and "no-such.secret" in out, out[-1500:])

        # Issue #36: the installed apps have no fault flags (they live in
        # the tests' twins, build/apps/hooked/, which are not installed),
        # even from this build, configured with -Dtest_hooks=true.
        fault = ("hostile_per_round", "lying_gradient", "shard_map_override")
        for app in ("dblp-worker", "dblp-udp-worker", "dblp-sim",
                    "dblp-server", "dblp-udp-server"):
            binary = D(os.path.join(dirs["bindir"], app))
            if not os.path.exists(binary):
                continue
            h = subprocess.run([binary] + (["--"] if app in (
                "dblp-worker", "dblp-server") else []) + ["--helpfull"],
                capture_output=True, text=True, timeout=30)
            text = h.stdout + h.stderr
            check("installed %s --helpfull lists flags and no fault flag "
                  "(%s)" % (app, ", ".join(fault)),
                  "-secret_file" in text and
                  not any(f in text for f in fault),
                  [f for f in fault if f in text] or text[-300:])
        hooked = [os.path.join(r, f) for r, _, fs in os.walk(dest)
                  for f in fs if "hooked" in os.path.join(r, f)]
        check("no test twin is installed", not hooked, hooked)

        for script in ("preflight.sh", "hugepages.sh", "bind-nic.sh"):
            path = D(os.path.join(dirs["datadir"], "dblp", "deploy", script))
            check("deploy script %s installed executable" % script,
                  os.access(path, os.X_OK), path)
        for conf in ("server.env", "server.flags", "worker-0.env",
                     "worker-0.flags", "shard-1.env", "shard-1.flags"):
            path = D(os.path.join(dirs["datadir"], "dblp", "examples", conf))
            check("pristine example %s installed" % conf,
                  os.path.isfile(path), path)

        # A re-install keeps an edited config.
        env = D(os.path.join(dirs["sysconfdir"], "dblp", "server.env"))
        with open(env, "a") as f:
            f.write("# edited by the operator\n")
        p = install(meson, build, dest)
        with open(env) as f:
            kept = f.read().endswith("# edited by the operator\n")
        check("a second meson install keeps an edited server.env",
              p.returncode == 0 and kept, p.stdout[-1000:] + p.stderr[-1000:])
    finally:
        shutil.rmtree(dest, ignore_errors=True)
    finish()


if __name__ == "__main__":
    main()
