"""The Python client's device -> target rule (kcache.arch_for_capability) against
target_arch_table.txt, the table that target_arch_test.cc checks the C++ rule
(client/target_arch.h: the C++ client and the daemon) against."""
import os

from kcache.client import arch_for_capability

TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "target_arch_table.txt")


def read_table():
    rows = []
    with open(TABLE) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            major, minor, arch = line.split()
            rows.append((int(major), int(minor), arch))
    return rows


def test_arch_for_capability_matches_the_table_the_cpp_rule_is_checked_against():
    rows = read_table()
    assert len(rows) >= 5  # the table was read, not skipped
    for major, minor, arch in rows:
        assert arch_for_capability(major, minor) == arch, (major, minor)
