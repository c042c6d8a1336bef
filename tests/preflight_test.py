#!/usr/bin/env python3
"""deploy/preflight.sh on a host without a NIC for DPDK (this VM): it runs
to its summary in every mode, never with a shell error, and says what is
missing with a fix.

- `--mode local`: no FAIL about NICs or hugepages (memif needs neither);
- `--mode nic`: exit 1, and the NIC line says there is no NIC for DPDK (or
  passes, on a host that has one bound);
- a port that does not exist and an lcore that does not exist: each named,
  each FAIL followed by a `fix:` line;
- `--eal <EAL options>`: -l/-a/--no-huge are read from an app's command
  line (devargs dropped), app options after `--` ignored;
- the per-node report of 2 MiB and 1 GiB pages and the 1 GiB support line;
- a usage error exits 2.

Usage: preflight_test.py SOURCE_DIR BUILD_DIR
"""

import os
import re
import subprocess
import sys

from dblp_testlib import check, finish  # noqa: E402

SHELL_ERRORS = re.compile(r"line \d+:|unbound variable|command not found|"
                          r"syntax error|integer expression expected|"
                          r"No such file or directory")


def run(script, build, *args):
    p = subprocess.run(["bash", script, "--build", build] + list(args),
                       capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def fails(out):
    return [l for l in out.splitlines() if l.startswith("FAIL")]


def every_fail_has_fix(out):
    lines = out.splitlines()
    for i, l in enumerate(lines):
        if l.startswith("FAIL") and "NIC mode needs" not in l:
            if i + 1 >= len(lines) or "fix:" not in lines[i + 1]:
                return False
    return True


def main():
    src, build = sys.argv[1], sys.argv[2]
    script = os.path.join(src, "deploy", "preflight.sh")

    def common(name, rc, out, err, want_rc):
        check(name + ": exit in %s" % (want_rc,), rc in want_rc, (rc, out, err))
        check(name + ": no shell error", not SHELL_ERRORS.search(err) and
              not SHELL_ERRORS.search(out), err[-1500:])
        check(name + ": summary line", re.search(
            r"^preflight \((local|nic)\): \d+ failure\(s\), \d+ warning\(s\)$",
            out, re.M) is not None, out[-1500:])
        check(name + ": every FAIL names a fix", every_fail_has_fix(out), out)

    rc, out, err = run(script, build)
    common("local", rc, out, err, (0, 1))
    bad = [l for l in fails(out) if re.search(r"NIC|hugepage|port", l)]
    check("local: NICs and hugepages are not required", not bad, bad)
    check("local: 2 MiB / 1 GiB pages reported per node",
          re.search(r"node\d+: 2 MiB pages \d+ \(\d+ free\), 1 GiB pages \d+"
                    r" \(\d+ free\)", out) is not None, out)
    check("local: 1 GiB support stated", "1 GiB pages: " in out, out)

    rc, out, err = run(script, build, "--mode", "nic")
    common("nic", rc, out, err, (0, 1))
    check("nic: says whether there is a NIC for DPDK",
          "no NIC for DPDK on this host" in out or
          "no NIC port bound to a DPDK driver" in out or
          re.search(r"PASS  \d+ NIC port\(s\) bound", out) is not None, out)
    if "PASS  " not in "".join(l for l in out.splitlines() if "NIC port" in l):
        check("nic: exit 1 without a DPDK-bound NIC", rc == 1, out)

    rc, out, err = run(script, build, "--mode", "nic", "--port",
                       "0000:ff:1f.7", "--lcores", "0,999")
    common("missing port and lcore", rc, out, err, (1,))
    check("missing port named",
          "no PCI device 0000:ff:1f.7 on this host" in out, out)
    check("missing lcore named", "lcore(s) 999: no such CPU" in out, out)

    rc, out, err = run(script, build, "--mode", "nic", "--eal", "-l", "0",
                       "-a", "0000:ff:1f.7,rxq_cqe_comp_en=1", "--no-huge",
                       "--", "--workers=3", "-l", "99")
    common("--eal", rc, out, err, (1,))
    check("--eal: -a read without devargs",
          "no PCI device 0000:ff:1f.7 on this host" in out, out)
    check("--eal: --no-huge skips the hugepage checks",
          "hugepages: not needed (--no-huge)" in out and
          "no free hugepages" not in out, out)
    check("--eal: app options after -- ignored", "lcore(s) 99" not in out,
          out)

    # An interface of this host, if one sits on PCI: driver and node named.
    for ifname in sorted(os.listdir("/sys/class/net")):
        dev = os.path.realpath("/sys/class/net/%s/device" % ifname)
        if "/pci" not in dev:
            continue
        rc, out, err = run(script, build, "--mode", "nic", "--port", ifname)
        common("port %s" % ifname, rc, out, err, (0, 1))
        check("port %s: its PCI device and driver reported" % ifname,
              re.search(r"port [0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.\d "
                        r"(is on the kernel driver|bound to|on |has no)",
                        out) is not None, out)
        break

    rc, out, err = run(script, build, "--mode", "bogus")
    check("usage error exits 2", rc == 2 and "--mode" in err, (rc, err))
    finish()


if __name__ == "__main__":
    main()
