# Developer check (not a test): applies the reference filter's behaviours (and other
# regressions) one at a time to the sources, rebuilds build-sf, and shows that the
# real-socket test of that bypass class fails against each. Run from the repository root
# after `meson setup build-sf lifecycle/sockfilter`: python3 lifecycle/sockfilter/tests/mutations.py
import subprocess, sys
muts = {
 "M1 exact-case keys (reference)": ("lifecycle/sockfilter/src/rewrite.cc", "std::string folded = fold(key);", "std::string folded = key;", ["t_case_variant_keys"]),
 "M2 no duplicate check": ("lifecycle/sockfilter/src/rewrite.cc", "if (!seen.insert(folded).second) {", "if (false && !seen.insert(folded).second) {", ["t_duplicate_keys_refused"]),
 "M3 trailing data ignored": ("lifecycle/sockfilter/src/rewrite.cc", "if (pos_ != in_.size()) {", "if (false) {", ["t_trailing_data_refused"]),
 "M4 TE on 1.0 accepted": ("lifecycle/sockfilter/src/http.cc", "if (h.minor == 0) {", "if (false) {", ["t_te_on_http10_refused"]),
 "M5 raw on request Upgrade (reference)": ("lifecycle/sockfilter/src/filter.cc", "  if (st == 101) {", "  if (st == 101 || c->head_.get(\"upgrade\")) {", ["t_upgrade_without_101_then_create"]),
 "M6 compat annotations kept (reference)": ("lifecycle/sockfilter/src/rewrite.cc", "return k == \"annotations\" ? Mode::annotations : Mode::none;\n      default:", "return Mode::none;\n      default:", ["t_version_spellings"]),
 "M7 h2c relayed": ("lifecycle/sockfilter/src/http.cc", "if (ieq(x.name, \"upgrade\") && fold(x.value).find(\"h2c\") != std::string::npos) {", "if (false) {", ["t_h2c_and_preface_refused"]),
}
for name, (path, old, new, tests) in muts.items():
    src = open(path).read()
    assert src.count(old) == 1, (name, src.count(old))
    open(path, "w").write(src.replace(old, new))
    try:
        b = subprocess.run(["nice", "ninja", "-C", "build-sf", "fy-sockfilter"], capture_output=True, text=True)
        if b.returncode:
            print(name, "BUILD FAILED", b.stdout[-500:]); continue
        r = subprocess.run(["python3", "lifecycle/sockfilter/tests/test_sockfilter.py"] + tests, capture_output=True, text=True,
                           env={"FY_SOCKFILTER": "build-sf/fy-sockfilter", "PATH": "/usr/bin:/bin"}, timeout=60)
        print("%-42s %s -> %s" % (name, tests[0], "FAILS (good)" if r.returncode else "still passes (BAD)"))
    finally:
        open(path, "w").write(src)
subprocess.run(["nice", "ninja", "-C", "build-sf", "fy-sockfilter"], capture_output=True)
