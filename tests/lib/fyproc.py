"""Process helpers shared by the test suites (proxy, forwarder, wall): run a
command, tell whether a pid lives (namespaces and cgroups: fynet.py). Before,
the forwarder's fyf_topology.py and the wall's fywnet.py each had their own
`sh` and `_alive`, which had drifted apart (one counted a zombie as alive,
one replaced the environment where the other extended it)."""

import os
import subprocess
import threading
import time


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



class Lateness:
    """Measures how late this machine wakes a sleeper while it is open: a
    thread sleeps `tick` seconds at a time and keeps the largest overshoot.
    A timing assertion's upper bound adds it (or a multiple, one per timer the
    measured path waits on): on a quiet machine it is a few milliseconds and
    the bound is as tight as written; under load it grows by what the load
    did to every process, the measured one included, so the test fails on a
    slow implementation, not on a busy machine. Lower bounds never add it (a
    timer does not fire early under load).

        with Lateness() as late:
            ...timed part...
        self.assertLess(elapsed, 2.3 + late.max)"""

    def __init__(self, tick=0.01):
        self.tick = tick
        self.max = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            t0 = time.monotonic()
            time.sleep(self.tick)
            self.max = max(self.max, time.monotonic() - t0 - self.tick)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        return False
