# fy-compose bootstrap: the head of what `python3 -I -` reads on stdin in the
# guest. The host appends one call, `_fy_boot(<zip, base64>, size, sha256,
# <request JSON, base64>)`. Python parses its whole stdin before running any of
# it, so a stream cut short is a SyntaxError and nothing runs; a stream that
# arrives whole but altered fails the size and sha256 check below, before a
# single module of the payload is imported. Nothing is written to disk: the
# modules are compiled from the zip's bytes in memory (a sys.meta_path finder,
# as mitogen's importer does; zipimport would need a file).
import sys


def _fy_boot(b64, size, sha256, request_b64):
    import binascii, hashlib, io, json, zipfile
    from importlib.util import spec_from_loader

    data = binascii.a2b_base64(b64)
    got = hashlib.sha256(data).hexdigest()
    if len(data) != size or got != sha256:
        sys.stderr.write(
            "fy-compose: the payload arrived corrupt in the guest (%d bytes, sha256 %s; "
            "expected %d bytes, sha256 %s): nothing ran. Check the ssh route, then retry.\n"
            % (len(data), got, size, sha256))
        sys.exit(97)
    # Only the standard library from the guest: its own podman-compose, PyYAML
    # or dotenv never shadow the payload's.
    sys.path[:] = [p for p in sys.path if not p.rstrip("/").endswith(("-packages",))]
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        files = {n: z.read(n) for n in z.namelist()}

    class Importer:
        prefix = "fy-compose-payload:"

        def find_spec(self, name, path=None, target=None):
            rel = name.replace(".", "/")
            if rel + "/__init__.py" in files:
                return spec_from_loader(name, self, origin=self.prefix + rel + "/__init__.py",
                                        is_package=True)
            if rel + ".py" in files:
                return spec_from_loader(name, self, origin=self.prefix + rel + ".py")
            return None

        def create_module(self, spec):
            return None

        def exec_module(self, module):
            origin = module.__spec__.origin
            module.__file__ = origin
            code = compile(files[origin[len(self.prefix):]], origin, "exec")
            exec(code, module.__dict__)

    sys.meta_path.insert(0, Importer())
    request = json.loads(binascii.a2b_base64(request_b64))
    import fy_compose_runner
    fy_compose_runner.main(request, json.loads(files["fy-compose-manifest.json"]), sha256)
