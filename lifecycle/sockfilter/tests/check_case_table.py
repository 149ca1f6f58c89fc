"""go_case_table: src/go_case_table.h is what Debian's Go says today.

  check_case_table.py <sockfilter-oracle> <go_case_table.h>

Runs `sockfilter-oracle table` (which measures, for every code point, the
ASCII letter encoding/json and json-iterator bind it as, and checks that
against Go's unicode tables) and compares its output with the checked-in
header byte for byte. Exits 77 (skip) when the oracle was not built because Go
is not installed."""
import difflib
import subprocess
import sys


def main():
    oracle, header = sys.argv[1], sys.argv[2]
    if not oracle:
        print("skipped: go is not installed (golang-go and golang-github-json-iterator-go-dev, "
              "scripts/install-deps), so the case table cannot be checked against Go's")
        return 77
    r = subprocess.run([oracle, "table"], capture_output=True, text=True, timeout=100)
    if r.returncode != 0:
        print("sockfilter-oracle table failed:\n" + r.stderr)
        return 1
    have = open(header, encoding="utf-8").read()
    if have != r.stdout:
        print("src/go_case_table.h differs from what Go's decoders bind; regenerate it with\n"
              "  <build>/.../sockfilter-oracle table > lifecycle/sockfilter/src/go_case_table.h\n"
              "and review what the filter now strips:")
        sys.stdout.writelines(difflib.unified_diff(have.splitlines(True), r.stdout.splitlines(True),
                                                   "checked in", "Go says"))
        return 1
    print("go_case_table.h matches Go: %d lines" % have.count("\n"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
