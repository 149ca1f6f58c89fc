"""Process helpers shared by the test suites (proxy, forwarder, wall): run a
command, tell whether a pid lives (namespaces and cgroups: fynet.py). Before,
the forwarder's fyf_topology.py and the wall's fywnet.py each had their own
`sh` and `_alive`, which had drifted apart (one counted a zombie as alive,
one replaced the environment where the other extended it)."""

import os
import subprocess


def sh(*cmd, check=True, timeout=30, input=None, env=None, **kw):
    """Runs argv (each word str()'d); returns the CompletedProcess, its output
    captured as text. `env` extends the environment, never replaces it. With
    check, a non-zero exit raises RuntimeError with the command and its output."""
    argv = [str(c) for c in cmd]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, input=input,
                       env=None if env is None else {**os.environ, **env}, **kw)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({r.returncode}): "
                           f"{r.stderr.strip()} {r.stdout.strip()}")
    return r


def alive(pid):
    """True for a running process; a zombie (killed, not yet reaped) is dead,
    so what a killed test run left is swept even before its parent reaps it."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False

