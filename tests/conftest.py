"""Shared pytest options: --update-golden rewrites golden plan files."""


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true",
                     help="rewrite tests/unit/golden/* from the current planner")
