"""A `python -m tests.worker.warm_child MODE ...` module for tests/worker/test_warm.py.

    report CODE     print what it sees (argv, cwd, environment, session) as JSON, a line on
                    stderr, exit CODE
    sleep PIDFILE   start a grandchild in its process group, write both pids, sleep
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time


def main() -> int:
    mode = sys.argv[1]
    if mode == "report":
        seen = {"argv": sys.argv[1:], "cwd": os.getcwd(), "name": __name__,
                "probe": os.environ.get("WARM_PROBE"), "outer": os.environ.get("WARM_OUTER"),
                "pid": os.getpid(), "sid": os.getsid(0), "pgrp": os.getpgrp(),
                "stdin": os.read(0, 1).decode()}  # fmt: skip
        print(json.dumps(seen))
        print("a line on stderr", file=sys.stderr)
        return int(sys.argv[2])
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    with open(sys.argv[2], "w") as fh:
        fh.write(f"{os.getpid()} {grandchild.pid}")
    time.sleep(120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
