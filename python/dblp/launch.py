"""Run a training script with the ``dblp`` backend registered:

    python3 -m dblp.launch train.py --backend dblp     # a script
    python3 -m dblp.launch -m package.module ...       # a module

What tools/dblp-run starts in each of torchrun's processes, so a script
written for gloo needs only the backend's name: nothing else in torch
changes (dblp.distributed.register()).
"""

import runpy
import sys


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    from . import distributed

    distributed.register()
    if argv[0] == "-m":
        if len(argv) < 2:
            print("dblp.launch: -m needs a module name", file=sys.stderr)
            return 2
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
