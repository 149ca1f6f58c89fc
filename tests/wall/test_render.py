#!/usr/bin/python3
"""Golden files of every rendered ruleset, and fy-wall's refusals of bad input.

Each golden case renders a config in tests/wall/golden/ with `fy-wall render`
and compares it byte for byte with the .nft file beside it; the machine and
guard goldens are also handed to the kernel (`nft -c` in a scratch network
namespace), so a golden file cannot pin a ruleset the kernel would refuse.
The host goldens name cgroups nft resolves when it reads them: they are
checked in a scratch cgroup made the root of a cgroup namespace, with the
goldens' slices created below it, and the one whose VM name is made nft-safe
is applied live there once, then checked with `status` and removed.
Set FY_UPDATE_GOLDEN=1 to rewrite the .nft files after a deliberate change,
then read the diff.

The refusals run the real binary and check the exit code, that the message
names where the value came from (file:line:col for the config, the flag's
name otherwise) and what to do.
"""
import os
import re
import tempfile
import unittest

import fywnet as n

GOLDEN = os.path.join(n.HERE, "golden")

CASES = [
    # name, wall, subuid file (in golden/)
    ("machine-subuid", "machine", "subuid"),
    ("machine-nosubuid", "machine", "subuid-none"),
    ("guard-default", "guard", "subuid"),
    ("guard-oneband", "guard", "subuid-none"),
    ("host-oneband", "host", None),
    ("host-bands", "host", None),
]


class Golden(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.mark = len(n._undo)
        cls.ident = n.Identity()

    @classmethod
    def tearDownClass(cls):
        n.cleanup(cls.mark)

    def render(self, name, wall, subuid):
        args = ["render", wall, "--config", os.path.join(GOLDEN, name + ".toml")]
        if subuid:
            args += ["--subuid-file", os.path.join(GOLDEN, subuid)]
        return self.ident.fy_wall(None, *args)

    def test_golden_files(self):
        for name, wall, subuid in CASES:
            with self.subTest(case=name):
                r = self.render(name, wall, subuid)
                self.assertEqual(r.returncode, 0, r.stderr)
                path = os.path.join(GOLDEN, name + ".nft")
                if os.environ.get("FY_UPDATE_GOLDEN") == "1":
                    with open(path, "w") as f:
                        f.write(r.stdout)
                with open(path) as f:
                    self.assertEqual(r.stdout, f.read(), f"{name}: rendered text differs from "
                                     f"{path} (FY_UPDATE_GOLDEN=1 rewrites it)")

    def test_goldens_are_valid_nft(self):
        ns = n.netns("gold")
        for name, wall, _ in CASES:
            if wall == "host":
                continue  # names cgroups: test_host_goldens_are_valid_nft_and_apply_live
            with self.subTest(case=name):
                r = n.in_ns(ns, "nft", "-c", "-f", os.path.join(GOLDEN, name + ".nft"),
                            check=False)
                self.assertEqual(r.returncode, 0, r.stderr)

    def test_host_goldens_are_valid_nft_and_apply_live(self):
        """nft resolves `socket cgroupv2 ... "PATH"` against /sys/fs/cgroup when
        it reads the rule, so a host golden can only be checked where its
        slice exists. A scratch cgroup (fyw-<pid>-gold) becomes the root of a
        cgroup namespace; a cgroup2 mount made in it shows that root, and the
        goldens' slices are made below it: real cgroups, gone with the scratch
        one. (The live rule keys on the slice's real id at a level counted
        from the namespace's root, so it would match no process: what it
        proves is that the kernel takes the table, the name made nft-safe
        included, and that status and remove agree with it. test_host.py
        proves the host wall on real processes.)"""
        ns = n.netns("goldhost")
        scratch = os.path.join(n.cgroup2_root(), f"fyw-{n.PID}-gold")
        os.mkdir(scratch)
        n.on_cleanup(lambda: n.remove_cgroup_tree(scratch), f"cgroup tree {scratch}")

        def scoped(*cmd):
            # Join the scratch cgroup, then unshare a cgroup and a mount namespace
            # (where the test's passwd file, with the VM user, is /etc/passwd).
            return n.sh("sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec unshare -C -m '
                        '--propagation private sh -c "mount --bind \\"\\$0\\" /etc/passwd && '
                        'mount -t cgroup2 none /sys/fs/cgroup && exec \\"\\$@\\"" "$@"',
                        scratch, self.ident.passwd, *n.nsexec(ns, *cmd), check=False)

        hosts = [name for name, wall, _ in CASES if wall == "host"]
        for name in hosts:
            with open(os.path.join(GOLDEN, name + ".nft")) as f:
                paths = set(re.findall(r'socket cgroupv2 level \d+ "([^"]+)"', f.read()))
            self.assertTrue(paths, name)
            for p in paths:
                os.makedirs(os.path.join(scratch, p), exist_ok=True)
        for name in hosts:
            with self.subTest(case=name):
                r = scoped("nft", "-c", "-f", os.path.join(GOLDEN, name + ".nft"))
                self.assertEqual(r.returncode, 0, r.stderr)
        # Without the slice, nft refuses the same file: the check above is real.
        os.rmdir(os.path.join(scratch, "fy.slice", "fy-machine-my.slice"))
        r = scoped("nft", "-c", "-f", os.path.join(GOLDEN, "host-bands.nft"))
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("fy.slice/fy-machine-my.slice", r.stderr)
        os.mkdir(os.path.join(scratch, "fy.slice", "fy-machine-my.slice"))
        # The sanitised name, live: VM 'my-vm+2' is table fy_host_wall_my_vm_2.
        toml = os.path.join(GOLDEN, "host-bands.toml")
        r = scoped("nft", "-f", os.path.join(GOLDEN, "host-bands.nft"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("table inet fy_host_wall_my_vm_2",
                      n.in_ns(ns, "nft", "list", "tables").stdout.splitlines())
        st = scoped(n.FY_WALL, "status", "host", "--config", toml)
        self.assertEqual(st.returncode, 0, st.stdout + st.stderr)
        self.assertIn("table inet fy_host_wall_my_vm_2: PRESENT, as rendered", st.stdout)
        r = scoped(n.FY_WALL, "apply", "host", "--config", toml)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("applied (inet fy_host_wall_my_vm_2)", r.stdout)
        r = scoped(n.FY_WALL, "remove", "host", "--vm", "my-vm+2")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("removed inet fy_host_wall_my_vm_2", r.stdout)
        self.assertNotIn("fy_host_wall", n.in_ns(ns, "nft", "list", "tables").stdout)

    def test_every_subuid_line_is_walled_and_absent_means_uid_only(self):
        """golden/subuid gives fywalice two lines: both ranges are walled, in
        the inet and the ip6 table (main walled the first line only)."""
        both = ("meta skuid 4242 jump walled\n\t\tmeta skuid 100000-165535 jump walled\n"
                "\t\tmeta skuid 300000-365535 jump walled\n")
        r = self.render("machine-subuid", "machine", "subuid")
        self.assertEqual(r.stdout.count(both), 2)  # inet and ip6
        self.assertNotIn("200000", r.stdout)  # someoneelse's
        for subuid in ("subuid-none", "/nonexistent/subuid"):
            with self.subTest(subuid=subuid):
                r = self.ident.fy_wall(None, "render", "machine", "--config",
                                       os.path.join(GOLDEN, "machine-subuid.toml"),
                                       "--subuid-file", os.path.join(GOLDEN, subuid))
                self.assertEqual(r.returncode, 0, r.stderr)
                # inet (then the other users' accept) and ip6 (the chain's end)
                self.assertEqual(r.stdout.count("meta skuid 4242 jump walled\n\t\t# every other"),
                                 1)
                self.assertEqual(r.stdout.count("meta skuid 4242 jump walled\n\t}"), 1)
                self.assertNotIn("100000", r.stdout)

    def principals(self, text, binds=()):
        path = os.path.join(self.ident.dir, "subuid-case")
        with open(path, "w") as f:
            f.write(text)
        return self.ident.fy_wall(None, "render", "principals", "--user", "fywalice",
                                  "--subuid-file", path, binds=binds)

    def test_every_line_by_name_uid_or_shared_uid_counts(self):
        """What newuidmap maps (tests/wall/test_subid.py holds the two to each
        other): every line keyed by the name, the decimal uid, or another login
        name of the same uid; a zero COUNT grants nothing and hides nothing."""
        for text, want in (
                ("fywalice:100000:65536\nfywalice:300000:65536\n",
                 "4242,100000-165535,300000-365535"),
                ("fywalice:100000:65536\n4242:300000:65536\n", "4242,100000-165535,300000-365535"),
                ("fywalice:100000:0\nfywalice:300000:65536\n", "4242,300000-365535"),
                ("fywalice:100000:0\n", "4242"),
                ("fywalias:500000:10\n", "4242,500000-500009"),
                ("fywalice:100000\nfywalice:200000:5\r\n# x\n\n", "4242"),
                ("fywalice:0x186a0:0x10000\n", "4242,100000-165535")):
            with self.subTest(text=text):
                r = self.principals(text)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertEqual(r.stdout, want + "\n")
        r = self.ident.fy_wall(None, "render", "machine", "--config",
                               os.path.join(GOLDEN, "machine-subuid.toml"), "--subuid-file",
                               os.path.join(self.ident.dir, "subuid-case"))
        self.assertIn("+subuid 100000-165535", r.stdout)

    def test_nss_subid_is_refused(self):
        """With `subid:` naming a module in nsswitch.conf newuidmap does not
        read the files: fy-wall refuses to wall them as if it did."""
        ns = os.path.join(self.ident.dir, "nsswitch.conf")
        with open("/etc/nsswitch.conf") as f:
            base = f.read()
        with open(ns, "w") as f:
            f.write(base + "subid: sss\n")
        r = self.principals("fywalice:100000:65536\n", binds=((ns, "/etc/nsswitch.conf"),))
        self.assertEqual(r.returncode, 3, r.stdout + r.stderr)
        self.assertIn("/etc/nsswitch.conf:", r.stderr)
        self.assertIn("'subid: sss'", r.stderr)
        self.assertIn("libsubid_sss.so", r.stderr)
        self.assertIn("set 'subid: files'", r.stderr)
        with open(ns, "w") as f:
            f.write(base + "subid: files\n")
        r = self.principals("fywalice:100000:65536\n", binds=((ns, "/etc/nsswitch.conf"),))
        self.assertEqual((r.returncode, r.stdout), (0, "4242,100000-165535\n"), r.stderr)

    def test_resolver_defaults_come_from_resolv_conf(self):
        """The machine wall's DNS goes to the VM's own resolver: resolv.conf's
        IPv4 nameservers that are not loopback, else Lima's 192.168.5.3; the
        host wall's to the host's (every nameserver, else 127.0.0.1)."""
        rc = os.path.join(self.ident.dir, "resolv.conf")
        cfg = os.path.join(GOLDEN, "machine-subuid.toml")
        for text, want in (("nameserver 10.255.255.53\nnameserver 127.0.0.53\n",
                            ["10.255.255.53"]),
                           ("nameserver 127.0.0.53\nnameserver fd00::3\n", ["192.168.5.3"]),
                           ("", ["192.168.5.3"]),
                           ("nameserver 192.168.5.3\nnameserver 10.0.2.3\n",
                            ["192.168.5.3", "10.0.2.3"])):
            with self.subTest(resolv_conf=text):
                with open(rc, "w") as f:
                    f.write(text)
                r = self.ident.fy_wall(None, "render", "machine", "--config", cfg,
                                       env={"FY_WALL_RESOLV_CONF": rc})
                self.assertEqual(r.returncode, 0, r.stderr)
                got = re.findall(r"ip daddr (\S+) udp dport 53 accept", r.stdout)
                self.assertEqual(got, want)
                self.assertNotIn("10.0.0.0/8 udp dport 53", r.stdout)
        with open(rc, "w") as f:
            f.write("nameserver 127.0.0.53\nnameserver 2001:db8::53\n")
        r = self.ident.fy_wall(None, "render", "host", "--config",
                               os.path.join(GOLDEN, "host-oneband.toml"),
                               env={"FY_WALL_RESOLV_CONF": rc})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("ip daddr 127.0.0.53 udp dport 53 accept", r.stdout)
        self.assertIn("ip6 daddr 2001:db8::53 tcp dport 53 accept", r.stdout)
        self.assertNotIn("\t\tudp dport 53 accept", r.stdout)

    def test_families_file_is_what_render_families_prints(self):
        """wall/dist/fy-wall-families.conf, the guest's modprobe.d file, is the
        renderer's output (FY_UPDATE_GOLDEN=1 rewrites it); it blocks the
        kernel-socket families by alias and by module, and never vsock."""
        r = self.ident.fy_wall(None, "render", "families")
        self.assertEqual(r.returncode, 0, r.stderr)
        path = os.path.join(n.SOURCE, "wall", "dist", "fy-wall-families.conf")
        if os.environ.get("FY_UPDATE_GOLDEN") == "1":
            with open(path, "w") as f:
                f.write(r.stdout)
        with open(path) as f:
            self.assertEqual(r.stdout, f.read())
        for line in ("install net-pf-33 /bin/false", "install rxrpc /bin/false",
                     "install net-pf-21 /bin/false", "install net-pf-30 /bin/false",
                     "install net-pf-43 /bin/false", "install net-pf-2-proto-132 /bin/false"):
            self.assertIn(line + "\n", r.stdout)
        self.assertNotIn("vsock", re.sub(r"#.*", "", r.stdout))
        self.assertNotIn("net-pf-40 ", r.stdout)

    def test_no_rule_uses_an_anonymous_set(self):
        """A set looked up while a transaction commits can miss (render.cc)."""
        for name, wall, subuid in CASES:
            with self.subTest(case=name):
                rules = [l for l in self.render(name, wall, subuid).stdout.splitlines()
                         if not l.lstrip().startswith("#")]
                self.assertFalse([l for l in rules if "{" in l and not l.rstrip().endswith("{")])

    def test_flags_render_what_the_config_does(self):
        by_config = self.render("machine-subuid", "machine", "subuid").stdout
        r = self.ident.fy_wall(None, "render", "machine", "--user", "fywalice",
                               "--gateway", "192.168.5.2", "--ports", "41100-41189, 41000-41089",
                               "--subuid-file", os.path.join(GOLDEN, "subuid"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout, by_config)

    def test_environment_names_the_walled_uid(self):
        r = n.sh("unshare", "-m", "--propagation", "private", "sh", "-c",
                 'mount --bind "$0" /etc/passwd && FY_WALL_UID=4242 SUDO_UID= exec "$@"',
                 self.ident.passwd, n.FY_WALL, "render", "machine", "--gateway", "192.168.5.2",
                 "--ports", "41000", "--subuid-file", "/nonexistent", check=False)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("uid 4242 (fywalice)", r.stdout)
        r = n.sh("unshare", "-m", "--propagation", "private", "sh", "-c",
                 'mount --bind "$0" /etc/passwd && FY_WALL_UID= SUDO_UID=4242 exec "$@"',
                 self.ident.passwd, n.FY_WALL, "render", "machine", "--gateway", "192.168.5.2",
                 "--ports", "41000", "--subuid-file", "/nonexistent", check=False)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("uid 4242 (fywalice)", r.stdout)


class Refusals(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.mark = len(n._undo)
        cls.ident = n.Identity()
        cls.dir = tempfile.mkdtemp(prefix=f"fyw-{n.PID}-cfg-")
        n.on_cleanup(lambda: n.sh("rm", "-rf", cls.dir), "config dir")

    @classmethod
    def tearDownClass(cls):
        n.cleanup(cls.mark)

    def config(self, text):
        fd, path = tempfile.mkstemp(dir=self.dir, suffix=".toml")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        return path

    def refuse(self, code, args, *needles):
        r = self.ident.fy_wall(None, *args)
        self.assertEqual(r.returncode, code, f"{args}: {r.stdout} {r.stderr}")
        self.assertEqual(r.stdout, "", "a refusal prints nothing on stdout")
        self.assertTrue(r.stderr.startswith("✗ "), r.stderr)
        for needle in needles:
            self.assertIn(needle, r.stderr)
        return r.stderr

    def machine(self, *extra):
        base = {"--user": "fywalice", "--gateway": "192.168.5.2", "--ports": "41000-41089",
                "--subuid-file": "/nonexistent"}
        args = ["render", "machine"]
        for k, v in base.items():
            if k not in extra:
                args += [k, v]
        return args + list(extra)

    def test_unknown_user_name(self):
        self.refuse(3, self.machine("--user", "fywnobody"),
                    "--user: user 'fywnobody' has no passwd entry",
                    "getent passwd fywnobody finds nothing", "create the user")

    def test_unknown_uid(self):
        self.refuse(3, self.machine("--user", "4999"),
                    "uid 4999 has no passwd entry")

    def test_unknown_uid_in_config_names_file_and_line(self):
        path = self.config('[machine]\ngateway = "192.168.5.2"\nports = "41000"\n'
                           'user = 4999\n')
        self.refuse(3, ["render", "machine", "--config", path, "--subuid-file", "/x"],
                    f"{path}:4:8: uid 4999 has no passwd entry")

    def test_root_is_refused(self):
        self.refuse(3, self.machine("--user", "root"), "the walled user is root (uid 0)")
        self.refuse(3, self.machine("--user", "0"), "the walled user is root (uid 0)")

    def test_no_user_anywhere(self):
        r = n.sh("unshare", "-m", "--propagation", "private", "sh", "-c",
                 'mount --bind "$0" /etc/passwd && FY_WALL_UID= SUDO_UID= exec "$@"',
                 self.ident.passwd, n.FY_WALL, "render", "machine", "--gateway", "192.168.5.2",
                 "--ports", "41000", check=False)
        self.assertEqual(r.returncode, 3)
        self.assertIn("can't resolve the walled uid", r.stderr)

    def test_overlapping_ports(self):
        path = self.config('[machine]\nuser = "fywalice"\ngateway = "192.168.5.2"\n'
                           'ports = ["41000-41089", "41050-41100"]\n')
        self.refuse(3, ["render", "machine", "--config", path],
                    f"{path}:4:9: [machine].ports: ports 41000-41089 and 41050-41100 overlap",
                    "list each port once")
        self.refuse(3, self.machine("--ports", "41000,41000"), "--ports: ports 41000 and 41000")

    def test_out_of_range_and_malformed_ports(self):
        self.refuse(3, self.machine("--ports", "70000"), "port 70000", "out of range (1..65535)")
        self.refuse(3, self.machine("--ports", "0-10"), "port 0", "out of range")
        self.refuse(3, self.machine("--ports", "41089-41000"), "runs backwards",
                    "write the lower port first (41000-41089)")
        self.refuse(3, self.machine("--ports", "41000-"), "is not a port or a range")
        self.refuse(3, self.machine("--ports", "http"), "is not a port or a range")
        self.refuse(3, self.machine("--ports", ","), "no ports given")
        path = self.config('[host]\nvm = "dev"\ncgroup = "a.slice"\nports = [41000]\n')
        self.refuse(3, ["render", "host", "--config", path],
                    f"{path}:4:10: [host].ports[0]: expected a string, found integer")

    def test_malformed_addresses(self):
        for bad in ("192.168.5", "192.168.005.2", "::1", "gateway.lima", "1.2.3.4.5",
                    "256.1.1.1", " 192.168.5.2"):
            with self.subTest(gateway=bad):
                self.refuse(3, self.machine("--gateway", bad), "--gateway:",
                            "is not an IPv4 address", "four decimal octets")
        self.refuse(3, self.machine("--gateway", "127.0.0.1"), "cannot be the host gateway")
        self.refuse(3, self.machine("--resolvers", "10.0.0.1/8"), "--resolvers:",
                    "has host bits set — write 10.0.0.0/8")
        self.refuse(3, self.machine("--resolvers", "10.0.0.0/33"), "bad prefix length")
        self.refuse(3, self.machine("--resolvers", "10.0.0.0/8,10.1.0.0/16"),
                    "prefixes 10.0.0.0/8 and 10.1.0.0/16 overlap")
        path = self.config('[guard]\nuser = "fywalice"\ngateway = "192.168.5.2"\n'
                           'ports = "41000"\nlistener = "10.0.0.1"\n')
        self.refuse(3, ["render", "guard", "--config", path, "--subuid-file", "/x"],
                    f"{path}:5:12: [guard].listener: 10.0.0.1 is not a loopback host address")

    def test_config_file_errors_are_all_reported_with_lines(self):
        path = self.config('[machine]\nuser = "fywalice"\ngateway = "192.168.5"\n'
                           'prots = "41000"\n[guard]\nroute_table = 254\n'
                           'rule_priority = 40000\n[extra]\n')
        err = self.refuse(3, ["render", "machine", "--config", path],
                          f"{path}:3:11: [machine].gateway:",
                          f"{path}:4:9: unknown key 'prots' in [machine]",
                          f"{path}:6:15: [guard].route_table: routing table 254 is reserved",
                          f"{path}:7:17: [guard].rule_priority: rule priority 40000",
                          f"{path}:8:1: unknown key 'extra' in the top level")
        self.assertGreaterEqual(err.count("\n"), 5)

    def test_not_toml(self):
        path = self.config('[machine\nuser = "x"\n')
        self.refuse(3, ["render", "machine", "--config", path], f"{path}:1:", "not valid TOML")

    def test_missing_keys(self):
        path = self.config('[machine]\nuser = "fywalice"\nports = "41000"\n')
        self.refuse(3, ["render", "machine", "--config", path],
                    f"{path}: [machine].gateway is not set", "or pass --gateway")
        self.refuse(3, ["render", "machine", "--user", "fywalice", "--ports", "41000"],
                    "--gateway is required")
        self.refuse(3, ["render", "host", "--config", path], "has no [host] section")
        self.refuse(3, ["render", "machine", "--config", "/nonexistent/fy.toml"],
                    "/nonexistent/fy.toml does not exist")

    def test_subuid_problems_name_the_file_line(self):
        own = self.config("fywalice:4000:1000\n")
        self.refuse(3, self.machine("--subuid-file", own), "contains its own uid 4242")
        zero = self.config("x\n4242:0:10\n")
        self.refuse(3, self.machine("--subuid-file", zero), f"{zero}:2:", "id 0 (root)")
        every = self.config("fywalice:0:0\n")
        self.refuse(3, self.machine("--subuid-file", every), f"{every}:1:", "every id")
        nul = self.config("fywalice:1\0:2\n")
        self.refuse(3, self.machine("--subuid-file", nul), f"{nul}:1:", "NUL byte")

    def test_host_values(self):
        base = ["render", "host", "--vm", "dev", "--ports", "41000-41199"]
        self.refuse(3, base + ["--cgroup", "fy.slice/../x"], "'.' or '..' component")
        self.refuse(3, base + ["--cgroup", 'fy.slice/"x'], "nft cannot match it safely")
        self.refuse(3, base + ["--cgroup", "/"], "the cgroup is empty or the root")
        self.refuse(3, ["render", "host", "--vm", 'a"b', "--cgroup", "x", "--ports", "1"],
                    "--vm: the VM name")
        self.refuse(3, base + ["--cgroup", "x", "--proxy-port-base", "70000"],
                    "proxy_port_base 70000 is out of range")

    def test_host_vm_user_must_be_the_vms_own(self):
        """The host wall keys on its VM user's uid and gid (docs/fy-wall.md, "The
        VM user"): there is no default, and an account that is not the VM's
        own is refused — root, group 0, a group another account has, any
        subordinate uid or gid line (any count), or a subid database in
        nsswitch.conf that fy-wall cannot list."""
        base = ["render", "host", "--vm", "dev", "--cgroup", "fy.slice/fy-machine-dev.slice",
                "--ports", "41000-41199"]

        def render(*extra, subuid="", subgid="", nsswitch="passwd: files\n"):
            # fy-wall reads the system's files through core/subid, as newuidmap
            # does; the test's stand in for them in its private mount namespace.
            binds = ((self.config(subuid), "/etc/subuid"), (self.config(subgid), "/etc/subgid"),
                     (self.config(nsswitch), "/etc/nsswitch.conf"))
            return self.ident.fy_wall(None, *base, *extra, binds=binds)

        def refused(r, *needles):
            self.assertEqual(r.returncode, 3, r.stdout + r.stderr)
            self.assertEqual(r.stdout, "")
            for needle in needles:
                self.assertIn(needle, r.stderr)

        refused(render(), "--user is required (e.g. --user fyvm-dev)", "which they cannot change",
                "not by their cgroup alone, which they can leave", '"The VM user"')
        path = self.config('[host]\nvm = "dev"\ncgroup = "a.slice"\nports = "41000"\n')
        self.refuse(3, ["render", "host", "--config", path],
                    f'{path}: [host].user is not set — write user = "fyvm-dev" in [host]')
        refused(render("--user", "fywnobody"), "--user: the VM user 'fywnobody' has no passwd "
                "entry", "useradd --system --user-group")
        refused(render("--user", "root"), "the VM user is root (uid 0)")
        ok = render("--user", n.VM_NAME)
        self.assertEqual(ok.returncode, 0, ok.stderr)
        self.assertIn(f"\t\tmeta skuid {n.VM_UID} jump vm\n\t\tmeta skgid {n.VM_UID} jump vm\n"
                      f'\t\tsocket cgroupv2 level 2 "fy.slice/fy-machine-dev.slice" jump vm\n',
                      ok.stdout)
        with open(self.ident.passwd) as f:
            passwd = f.read()
        try:
            with open(self.ident.passwd, "a") as f:
                f.write("fywgid0:x:4747:0::/nonexistent:/usr/sbin/nologin\n"
                        f"fywshare:x:4748:{n.VM_UID}::/nonexistent:/usr/sbin/nologin\n")
            refused(render("--user", "fywgid0"), "has primary group 0 (root)",
                    "useradd --user-group")
            refused(render("--user", n.VM_NAME), f"gid {n.VM_UID}, the primary group of the VM "
                    f"user '{n.VM_NAME}', is also the primary group of 'fywshare' (uid 4748)")
        finally:
            with open(self.ident.passwd, "w") as f:
                f.write(passwd)
        # Every line keyed to the user counts, by name, uid or another name of
        # its uid, whatever its count (core/subid reads them as newuidmap does).
        sub = f"other:100000:65536\n{n.VM_NAME}:200000:0\n"
        refused(render("--user", n.VM_NAME, subuid=sub),
                f"/etc/subuid:2: the VM user '{n.VM_NAME}' has subordinate uids", "newuidmap",
                "a VM user needs none")
        refused(render("--user", n.VM_NAME, subuid=f"{n.VM_UID}:300000:65536\n"),
                "/etc/subuid:1: ", f"usermod --del-subuids 300000-365535 {n.VM_NAME}")
        refused(render("--user", n.VM_NAME, subgid=f"{n.VM_UID}:300000:65536\n"),
                f"/etc/subgid:1: the VM user '{n.VM_NAME}' has subordinate gids", "newgidmap",
                f"usermod --del-subgids 300000-365535 {n.VM_NAME}")
        refused(render("--user", n.VM_NAME, subuid=f"{n.VM_NAME}:0:0\n"),
                "/etc/subuid:1: ", "id 0 (root)",
                f"the host wall's VM user '{n.VM_NAME}' must have no subordinate uids")
        refused(render("--user", n.VM_NAME, nsswitch="passwd: files\nsubid:   sss  # FreeIPA\n"),
                "/etc/nsswitch.conf:2: 'subid: sss'", "libsubid_sss.so",
                "fy-wall cannot tell that it has none")
        # Another login name of the VM user's uid: newuidmap grants its lines too.
        with open(self.ident.passwd) as f:
            passwd = f.read()
        try:
            with open(self.ident.passwd, "a") as f:
                f.write(f"fywvmalias:x:{n.VM_UID}:{n.VM_UID}::/nonexistent:/usr/sbin/nologin\n")
            refused(render("--user", n.VM_NAME, subuid="fywvmalias:500000:10\n"),
                    "/etc/subuid:1: ", "or another login name of uid")
        finally:
            with open(self.ident.passwd, "w") as f:
                f.write(passwd)
        r = render("--user", n.VM_NAME, subuid=f"other:100000:65536\n#{n.VM_NAME}:1:1\n",
                   subgid=f"other:100000:65536\n{n.VM_NAME}\n",
                   nsswitch="passwd: files\nsubid: files\n")
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_flags_for_another_wall(self):
        self.refuse(3, self.machine("--vm", "dev"), "--vm belongs to the host wall")
        self.refuse(3, self.machine("--listener", "127.42.0.1"), "--listener belongs to the guard")
        self.refuse(3, ["render", "host", "--gateway", "192.168.5.2"],
                    "--gateway belongs to the machine wall and the guard")

    def test_usage(self):
        self.refuse(2, [], "no command")
        self.refuse(2, ["frobnicate", "machine"], "unknown command 'frobnicate'",
                    "apply|remove|status|render")
        self.refuse(2, ["apply"], "name the wall to apply: machine, guard or host")
        self.refuse(2, ["apply", "wall"], "unknown wall 'wall' — machine|guard|host")
        self.refuse(2, ["apply", "machine", "--prots", "1"], "unknown option '--prots'")
        self.refuse(2, ["apply", "machine", "--ports"], "--ports needs a value")
        self.refuse(2, ["apply", "machine", "--check=yes"], "unknown option '--check'")
        self.refuse(2, ["render", "machine", "--check"], "--check goes with apply")
        self.refuse(2, ["render", "machine", "extra"], "unexpected argument 'extra'")

    def test_help_and_version(self):
        r = self.ident.fy_wall(None, "--help")
        self.assertEqual(r.returncode, 0)
        for needle in ("usage: fy-wall <command> <wall>", "exit codes:", "--check",
                       "machine  inet fy_wall + ip6 fy_wall6"):
            self.assertIn(needle, r.stdout)
        r = self.ident.fy_wall(None, "--version")
        self.assertEqual(r.returncode, 0)
        self.assertRegex(r.stdout, r"^fy-wall \d+\.\d+\.\d+\n$")


if __name__ == "__main__":
    n.sweep_stale()
    unittest.main(verbosity=2)
