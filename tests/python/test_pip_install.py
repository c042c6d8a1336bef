"""`pip install .` (pyproject.toml + setup.py) into a venv over Debian's
python3 (--system-site-packages: its torch), offline (--no-build-isolation):
the installed package imports, registers the `dblp` backend when asked, and runs a
job with the apps of this build tree."""

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torch")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def test_pip_install_into_a_venv(tmp_path):
    venv = tmp_path / "venv"
    r = subprocess.run([sys.executable, "-m", "venv",
                        "--system-site-packages", str(venv)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip("python3 -m venv unavailable (apt-get install "
                    "python3-venv): " + r.stderr[-300:])
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    r = subprocess.run(pip + ["install", "--no-build-isolation", "--no-deps",
                              "--no-index", REPO],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    script = textwrap.dedent("""
        import os, sys, torch, torch.distributed as dist
        import dblp, dblp.distributed
        assert dblp.__file__.startswith(sys.prefix), dblp.__file__
        assert "DBLP" not in dist.Backend._plugins  # nothing on import
        dblp.distributed.register()
        assert "DBLP" in dist.Backend._plugins
        with dblp.LocalServer(1, "dpdk", ["--policy=reliable"]) as srv:
            w = dblp.Worker(floats=1000, **srv.worker_kwargs(0))
            g = torch.arange(1000, dtype=torch.float32)
            w.allreduce_(g)
            assert torch.equal(g, torch.arange(1000, dtype=torch.float32))
            w.close()
            assert srv.wait(30) == 0
        print("ok")
    """)
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the installed copy, not the build tree's
    r = subprocess.run([str(venv / "bin" / "python"), "-c", script],
                       capture_output=True, text=True, timeout=120, env=env,
                       cwd=str(tmp_path))
    assert r.returncode == 0 and "ok" in r.stdout, r.stdout + r.stderr
    # tools/dblp-run came along as a script, and runs the venv's python.
    run = venv / "bin" / "dblp-run"
    assert os.access(run, os.X_OK)
    probe = tmp_path / "probe.py"
    probe.write_text("import sys, dblp\n"
                     "print('prefix', sys.prefix, dblp.__file__)\n")
    r = subprocess.run([str(run), "--standalone", "--nproc-per-node", "1",
                        str(probe)], capture_output=True, text=True,
                       timeout=120, env=env, cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"prefix {venv}" in r.stdout, r.stdout
