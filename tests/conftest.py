"""Shared pytest options: --update-golden rewrites golden plan files.

Hypothesis runs without its per-example deadline: speed belongs in benchmarks,
not unit tests, and on a loaded 2-core machine a property test's examples
took over its 200 ms default (test_impairments.py's JSON round trip, under a
virtual-clock run beside the suite) and failed on time, not on a property.
"""

from hypothesis import settings

settings.register_profile("testbed", deadline=None)
settings.load_profile("testbed")


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true",
                     help="rewrite tests/unit/golden/* from the current planner")
