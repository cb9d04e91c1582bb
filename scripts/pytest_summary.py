"""Prints which Python tests ran under which environment, with counts, from
the JUnit XML files that tests/python/run_pytest.sh leaves (ENV.TEST.xml).

usage: python3 scripts/pytest_summary.py RESULTS_DIR
The last line is the total in the plain 'N passed, N failed, N skipped' form.
Exit status 1 if any test failed or errored.
"""

import collections
import os
import sys
import xml.etree.ElementTree as ET


def counts(path):
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    c = collections.Counter()
    for s in suites:
        for k in ("tests", "failures", "errors", "skipped"):
            c[k] += int(s.get(k, 0))
    return c


def main(results):
    files = sorted(f for f in os.listdir(results) if f.endswith(".xml")) if os.path.isdir(results) else []
    total = collections.Counter()
    print("Python tests by environment:")
    for f in files:
        env, name = f[:-len(".xml")].split(".", 1)
        c = counts(os.path.join(results, f))
        failed = c["failures"] + c["errors"]
        passed = c["tests"] - failed - c["skipped"]
        total.update(passed=passed, failed=failed, skipped=c["skipped"])
        print("  %-7s %-28s %4d passed, %d failed, %d skipped" % (env, name, passed, failed, c["skipped"]))
    print("python: %d passed, %d failed, %d skipped" % (total["passed"], total["failed"], total["skipped"]))
    return 1 if total["failed"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
