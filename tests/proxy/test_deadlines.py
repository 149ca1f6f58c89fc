"""Every phase of a client connection has a deadline (proxy/server/deadline.h):
a thousand clients at once that CONNECT and then send nothing, stop in the
middle of their ClientHello, or stop in the middle of the TLS handshake are
all closed within --head-timeout of the CONNECT's 200 (plus a margin), each
counted in fy_timeouts_total{phase} and written as a Network Log row that says
what did not arrive; the proxy's RSS stays bounded and a normal request is
served while they are held. A blind tunnel whose origin never speaks is closed
the same way, not held for --tunnel-idle-timeout (an hour).

Bounded: --head-timeout 2, a few seconds a round, well under a minute in all
(also under ASan)."""

import resource
import selectors
import socket
import ssl
import subprocess
import threading
import time
import unittest

from fytest import Origin, Proxy, binary, curl, wait_until

HEAD_TIMEOUT = 2.0
N = 1000
# A close may come this much after the deadline: the loop handles up to a
# thousand timers and TLS objects at once (slower under ASan), and the client
# reads the close through a selector.
MARGIN = 3.0


def sanitized():
    """Whether fy-proxy is an ASan build (its loop runs a few times slower)."""
    out = subprocess.run(["ldd", binary("fy-proxy")], capture_output=True, text=True).stdout
    return "libasan" in out or "libubsan" in out


if sanitized():
    MARGIN *= 3
# RSS a thousand held clients may add (TLS objects mid-handshake included).
RSS_BOUND_KIB = 150 * 1024


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return int([l for l in f if l.startswith("VmRSS")][0].split()[1])


def client_hello(sni):
    """The bytes of a real TLS ClientHello for `sni` (Python's ssl, memory BIOs)."""
    ctx = ssl.create_default_context()
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(inc, out, server_hostname=sni)
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return out.read()


def raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, 4 * N + 256)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < 2 * N + 64:
        raise unittest.SkipTest(f"the open-file limit ({hard}) holds fewer than {2 * N + 64} sockets")


class HeldClients:
    """N sockets that each sent `payload` and then nothing. A reader thread
    records, for each, when the proxy's first reply byte (its 200) arrived and
    when the proxy closed it (EOF or reset), so a deadline is measured from
    the 200 the proxy counts from, however busy the machine is."""

    def __init__(self, port, payload, n=N):
        self.socks, self.first, self.closed_at, self.sent = [], {}, {}, {}
        self.sel = selectors.DefaultSelector()
        self.lock = threading.Lock()
        self.stop = False
        self.wake_r, self.wake_w = socket.socketpair()
        self.sel.register(self.wake_r, selectors.EVENT_READ)
        self.pending = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(payload)
            self.sent[s.fileno()] = time.monotonic()
            s.setblocking(False)
            with self.lock:
                self.pending.append(s)
            self.wake_w.send(b"x")
            self.socks.append(s)

    def _read(self):
        while not self.stop:
            for key, _ in self.sel.select(timeout=0.05):
                s = key.fileobj
                now = time.monotonic()
                if s is self.wake_r:
                    s.recv(65536)
                    with self.lock:
                        new, self.pending = self.pending, []
                    for c in new:
                        self.sel.register(c, selectors.EVENT_READ)
                    continue
                try:
                    data = s.recv(65536)
                except (ConnectionResetError, BrokenPipeError):
                    data = b""
                except BlockingIOError:
                    continue
                fd = s.fileno()
                if data:
                    self.first.setdefault(fd, now)
                    continue
                with self.lock:
                    self.closed_at[fd] = now
                self.sel.unregister(s)

    def wait_closed(self, timeout):
        """For the clients that closed, sorted: seconds from the bytes they sent to
        the close (a lower bound of the proxy's interval: its 200 came later) and
        from their 200 as read here to the close (an upper bound: the reader
        may see the 200 late)."""
        if timeout > 0:
            wait_until(lambda: len(self.closed_at) >= len(self.socks), timeout=timeout, interval=0.05,
                       what="every held client to be closed")
        with self.lock:
            since_sent = sorted(t - self.sent[fd] for fd, t in self.closed_at.items())
            since_200 = sorted(t - self.first.get(fd, self.sent[fd]) for fd, t in self.closed_at.items())
        return since_sent, since_200

    def close(self):
        self.stop = True
        self.thread.join(timeout=5)
        for s in self.socks:
            s.close()
        self.wake_r.close()
        self.wake_w.close()
        self.sel.close()


def metric_or_none(proxy, name):
    """The metric, or None while the admin endpoint is too busy to answer in 5 s
    (a thousand handshakes at once on a loaded machine)."""
    try:
        return proxy.metric(name)
    except OSError:
        return None


class SetupDeadlines(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        raise_nofile()
        cls.origin = Origin().__enter__()
        cls.silent = socket.socket()  # accepts (in the kernel) and never speaks
        cls.silent.bind(("127.0.0.1", 0))
        cls.silent.listen(4096)
        cls.silent_port = cls.silent.getsockname()[1]
        cls.proxy = Proxy('mode = "observe"\n', resolve=[("held.test", "127.0.0.1")],
                          args=["--head-timeout", str(int(HEAD_TIMEOUT)), "--log-level", "info"],
                          ).__enter__()
        cls.hello = client_hello("held.test")

    @classmethod
    def tearDownClass(cls):
        cls.proxy.__exit__(None, None, None)
        cls.origin.__exit__(None, None, None)
        cls.silent.close()

    def held_round(self, payload, phase, row_error, n=N, deadline_after=0.0, margin=MARGIN):
        p = self.proxy
        before = p.metric(f'fy_timeouts_total{{phase="{phase}"}}')
        rows_before = len([r for r in p.rows() if row_error in (r.get("error") or "")])
        base = rss_kib(p.proc.pid)
        accepted = p.metric("fy_connections_accepted_total")
        t0 = time.monotonic()
        held = HeldClients(p.port, payload, n)
        try:
            opened = time.monotonic() - t0
            # While they are held: a normal request is served, and the RSS stays bounded.
            wait_until(lambda: (metric_or_none(p, "fy_connections_accepted_total") or 0) - accepted >= n, timeout=30,
                       what="the proxy to accept every held client")
            at_once = p.metric("fy_connections_open")
            peak = rss_kib(p.proc.pid)
            t = time.monotonic()
            r = curl(f"http://127.0.0.1:{self.origin.port}/meanwhile", proxy=p.url, timeout=10)
            served = time.monotonic() - t
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn(b"/meanwhile", r.stdout)
            self.assertLess(served, HEAD_TIMEOUT, f"the normal request took {served:.2f} s")
            self.assertLess(peak - base, RSS_BOUND_KIB, f"RSS grew {peak - base} KiB for {n} held clients")
            limit = deadline_after + HEAD_TIMEOUT + margin
            try:
                held.wait_closed(timeout=limit + opened + 10)
            except AssertionError:
                pass
            since_sent, times = held.wait_closed(timeout=0)
        finally:
            held.close()
        self.assertEqual(len(times), n, f"{n - len(times)} of {n} clients were still open")
        # Closed by this deadline (counted from the proxy's 200), not earlier by something else, and not later.
        self.assertGreaterEqual(since_sent[0], deadline_after + HEAD_TIMEOUT - 0.2,
                                f"the first closed {since_sent[0]:.2f} s after its bytes went out")
        self.assertLess(times[-1], limit, f"the last closed {times[-1]:.2f} s after its 200")
        wait_until(lambda: p.metric(f'fy_timeouts_total{{phase="{phase}"}}') - before >= n, timeout=10,
                   what=f"fy_timeouts_total{{phase={phase}}} to count {n}")
        self.assertEqual(p.metric(f'fy_timeouts_total{{phase="{phase}"}}') - before, n)
        rows = p.wait_rows(lambda r: row_error in (r.get("error") or ""), n=rows_before + n, timeout=10)
        self.assertEqual(len(rows) - rows_before, n)
        wait_until(lambda: p.metric("fy_connections_open") == 0, timeout=10, what="no connection open")
        print(f"{phase}: {n} clients opened in {opened:.2f} s ({at_once:.0f} open at once), closed "
              f"{times[0]:.2f}-{times[-1]:.2f} s after their 200, RSS +{peak - base} KiB held, "
              f"a request served in {served:.3f} s")
        return rows[-1]

    def test_a_thousand_connects_that_send_nothing(self):
        row = self.held_round(b"CONNECT held.test:443 HTTP/1.1\r\nHost: held.test:443\r\n\r\n", "hello",
                              "the client sent nothing within 2 s of the CONNECT's 200")
        self.assertEqual(row["method"], "CONNECT")
        self.assertEqual(row["host"], "held.test")
        self.assertTrue(row["error"].startswith("timeout: "), row)

    def test_a_thousand_clients_that_stop_mid_clienthello(self):
        half = self.hello[: len(self.hello) // 2]
        row = self.held_round(b"CONNECT held.test:443 HTTP/1.1\r\nHost: held.test:443\r\n\r\n" + half, "hello",
                              "the client's TLS ClientHello was incomplete")
        self.assertIn(f"({len(half)} bytes)", row["error"])

    def test_a_thousand_clients_that_stop_mid_handshake(self):
        # A whole ClientHello: the proxy answers with its ServerHello and waits
        # for the client's Finished, which never comes.
        row = self.held_round(b"CONNECT held.test:443 HTTP/1.1\r\nHost: held.test:443\r\n\r\n" + self.hello,
                              "handshake", "the client's TLS handshake did not complete within 2 s",
                              # The proxy's own work (a thousand ServerHellos on one loop thread)
                              # delays its timers: twice the margin, still well under main's fixed
                              # 10 s handshake timeout.
                              margin=2 * MARGIN)
        self.assertEqual(row["tls"], "decrypted")
        self.assertEqual(row["sni"], "held.test")

    def test_blind_tunnels_whose_origin_never_speaks(self):
        # Another port: a second of silence makes an opaque tunnel, which then
        # waits for the origin's first byte (not --tunnel-idle-timeout).
        row = self.held_round(f"CONNECT held.test:{self.silent_port} HTTP/1.1\r\n\r\n".encode(), "first_bytes",
                              "the tunnel carried no byte either way within 2 s", n=200, deadline_after=1.0)
        self.assertTrue(row["passthrough"], row)
        self.assertEqual(row["tls"], "opaque")


if __name__ == "__main__":
    unittest.main(verbosity=2)
