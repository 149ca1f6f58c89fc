"""What most forwarder tests share: a topology with the recording proxy stand-in
and origin running in the host namespace, fy-forwarder in the VM namespace, and
ways to send raw requests from a container and read what the proxy and the
origin recorded."""

import base64
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from fyf_topology import (GATEWAY, ORIGIN, PROXY_PORT, TOKEN_PORT, Topology,  # noqa: E402,F401
                          build_dir)

CLIENT = os.path.join(HERE, "fyf_client.py")
STAMP_TOOL = os.path.join(build_dir(), "tests", "forwarder", "fyf-stamp-tool")
HOOK = os.path.join(build_dir(), "forwarder", "fy-forwarder-hook")
FORWARDER = os.path.join(build_dir(), "forwarder", "fy-forwarder")


def get(target, extra_headers=(), method="GET"):
    """A canonical absolute-form request head."""
    host = target.split("://", 1)[1].split("/", 1)[0]
    lines = ["%s %s HTTP/1.1" % (method, target), "Host: " + host] + list(extra_headers)
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


class Rig:
    """A running topology: proxy + origin (+ token service) in the host namespace,
    fy-forwarder in the VM namespace. Use as a context manager."""

    def __init__(self, tag, containers=(("podman1", 2),), forwarder=True, fwd_kw=None,
                 preinstall_redirect=False, ports=(PROXY_PORT, TOKEN_PORT)):
        self.topo = Topology(tag, containers=containers, preinstall_redirect=preinstall_redirect,
                             ports=ports)
        self.want_forwarder = forwarder
        self.fwd_kw = dict(fwd_kw or {})
        self.fwd = None

    def __enter__(self):
        t = self.topo.__enter__()
        try:
            self.key_file, self.key_hex = t.write_key()
            self.proxy_log = t.path("proxy.jsonl")
            self.origin_log = t.path("origin.jsonl")
            self.token_log = t.path("token.jsonl")
            self.proxy = t.start_in_host(
                ["python3", os.path.join(HERE, "recording_proxy.py"), "--listen",
                 "%s:%d" % (GATEWAY, PROXY_PORT), "--key", self.key_file, "--log",
                 self.proxy_log, "--cpp-verifier", STAMP_TOOL])
            self.origin = t.start_in_host(
                ["python3", os.path.join(HERE, "recording_origin.py"), "--listen",
                 "%s:80" % ORIGIN, "--log", self.origin_log], name="origin")
            # The token service: an origin that records raw heads on the gateway.
            self.token = t.start_in_host(
                ["python3", os.path.join(HERE, "recording_origin.py"), "--listen",
                 "%s:%d" % (GATEWAY, TOKEN_PORT), "--log", self.token_log], name="token")
            t.wait_listening(t.host, GATEWAY, PROXY_PORT, proc=self.proxy)
            t.wait_listening(t.host, ORIGIN, 80, proc=self.origin)
            t.wait_listening(t.host, GATEWAY, TOKEN_PORT, proc=self.token)
            if self.want_forwarder:
                self.start_forwarder(**self.fwd_kw)
        except BaseException:
            t.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        return self.topo.__exit__(*exc)

    def start_forwarder(self, name="forwarder", **kw):
        cfg = self.topo.forwarder_config(self.key_file, **kw)
        self.fwd = self.topo.start_forwarder(cfg, name=name)
        return self.fwd

    # -- clients ----------------------------------------------------------------------------

    def client(self, i, data, count=1, connect=None, timeout=10, until="length", hold_ms=0,
               ns=None, pre=()):
        """Runs fyf_client.py in container i (or in namespace `ns` with nsenter) and
        returns its JSON results."""
        connect = connect or "%s:%d" % (GATEWAY, PROXY_PORT)
        argv = ["python3", CLIENT, "--connect", connect, "--count", str(count), "--timeout",
                str(timeout), "--until", until, "--hold-ms", str(hold_ms)] + list(pre)
        if data:
            argv += ["--send-b64", base64.b64encode(data).decode()]
        bound = timeout * count + 20
        if ns is not None:
            r = subprocess.run(["nsenter", "--net=/run/netns/" + ns, "--"] + argv,
                               capture_output=True, text=True, timeout=bound)
        else:
            r = self.topo.run_in_container(i, argv, timeout=bound)
        if r.returncode != 0:
            raise RuntimeError("client failed: %s\n%s" % (r.stdout, r.stderr))
        return [json.loads(l) for l in r.stdout.splitlines() if l.strip()]

    # -- records ----------------------------------------------------------------------------

    @staticmethod
    def rows(path):
        try:
            with open(path) as f:
                return [json.loads(l) for l in f if l.strip()]
        except FileNotFoundError:
            return []

    def proxy_rows(self):
        return self.rows(self.proxy_log)

    def origin_rows(self):
        return self.rows(self.origin_log)

    def wait_rows(self, path, n, timeout=5.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rows = self.rows(path)
            if len(rows) >= n:
                return rows
            time.sleep(0.02)
        return self.rows(path)

    def proxy_row_for(self, target, timeout=5.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for r in self.proxy_rows():
                if r.get("target") == target:
                    return r
            time.sleep(0.02)
        raise AssertionError("the proxy never saw %s; rows: %s" % (target, self.proxy_rows()))


def answer_budget_ms(sock, floor_ms=500):
    """A hook budget the forwarder's answer fits in on this machine now: the
    floor, or five times a probe's round trip on the same socket (a process
    start and one query, as the hook's first query is) when the load makes
    that longer. The assertions read the answer, so a budget it missed under
    load failed them for the load's sake (the hook waits the whole budget only
    when the answer refuses, so the floor is what an idle machine spends)."""
    t0 = time.monotonic()
    subprocess.run([FORWARDER, "--probe", "--control", sock], capture_output=True, timeout=30)
    return max(floor_ms, int(5000 * (time.monotonic() - t0)))
