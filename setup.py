"""The native part of `pip install .` (pyproject.toml): dblp._native, the
trainer's end of the shared-memory hand-off, from the same sources meson
builds (python/dblp/_native.cc, lib/dblp/handoff/shm_channel.cc and the
shm_guard.cc it calls), against Debian's
pybind11-dev headers; and dblp/_paths.py, which tells the package where
the apps are."""

import os
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


def pybind11_include():
    try:
        import pybind11
        return pybind11.get_include()
    except ImportError:  # Debian's pybind11-dev: headers only
        for d in ("/usr/include", "/usr/local/include"):
            if os.path.isdir(os.path.join(d, "pybind11")):
                return d
    raise SystemExit("pybind11 headers not found: apt-get install "
                     "pybind11-dev")


class BuildPyWithPaths(build_py):
    """Writes _paths.py: meson's default install bindir; DBLP_APPS and PATH
    are searched as well (dblp.find_app)."""

    def run(self):
        super().run()
        target = os.path.join(self.build_lib, "dblp", "_paths.py")
        with open(target, "w") as f:
            # No build tree: an installed package must not run whatever a
            # source checkout happens to hold.
            f.write("# Written by setup.py (pip install): where the apps "
                    "are.\n")
            f.write("BUILD_APPS = None\n")
            f.write(f"INSTALL_BINDIR = {'/usr/local/bin'!r}\n")


native = Extension(
    "dblp._native",
    sources=["python/dblp/_native.cc", "lib/dblp/handoff/shm_channel.cc",
             "lib/dblp/handoff/shm_guard.cc"],
    include_dirs=["lib", pybind11_include(),
                  sysconfig.get_paths()["include"]],
    extra_compile_args=["-std=c++20", "-O2", "-fvisibility=hidden"],
    language="c++",
)

# Not build/: that is meson's.
os.makedirs(os.path.join(HERE, "build-pip"), exist_ok=True)
setup(ext_modules=[native], cmdclass={"build_py": BuildPyWithPaths},
      # build_ext force: setuptools skips an extension newer than its
      # sources, so a source added to the list (shm_guard.cc) left an old
      # build-pip's module without it (an undefined symbol at import).
      options={"build": {"build_base": "build-pip"},
               "build_ext": {"force": True},
               "egg_info": {"egg_base": "build-pip"}})
