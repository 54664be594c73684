"""The testbed's one error hierarchy.

Every error a user can cause or meet derives from TestbedError; the CLI turns
them into a message and an exit code (2 for bad input or a failed
emulation). Code raises; it never logs and carries on.
"""

from __future__ import annotations

MAX_SHOWN_CHARS = 200  # an error quotes at most this much of the bad value


def shown(value: object) -> str:
    """``repr(value)`` cut to MAX_SHOWN_CHARS, so that an error stays one short line."""
    text = repr(value)
    return text if len(text) <= MAX_SHOWN_CHARS else text[:MAX_SHOWN_CHARS] + "...(cut)"


def one_line(text: str) -> str:
    """``text`` with newlines and other unprintable characters escaped (``\\n``)."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


class TestbedError(Exception):
    """Base of every error the testbed raises on purpose."""

    __test__ = False  # not a pytest test class


class SpecError(TestbedError):
    """A YAML file does not describe a valid topology/scenario.

    Names the file, the YAML path of the bad field (e.g. ``wan.delay_ms``),
    what was expected and what was found.
    """

    def __init__(self, file: str, path: str, expected: str, got: object):
        self.file, self.path, self.expected, self.got = file, path, expected, got
        super().__init__(f"{one_line(file)}: {one_line(path) or '<top>'}: expected "
                         f"{one_line(expected)}, got {shown(got)}")


class PlanError(TestbedError):
    """A valid spec cannot be turned into a plan on this host (e.g. no backend)."""


class ApplyError(TestbedError):
    """Applying a plan step failed; wraps the failing step and the OS/netlink error."""

    def __init__(self, step: object, cause: BaseException | str):
        self.step, self.cause = step, cause
        errno = getattr(cause, "code", None) or getattr(cause, "errno", None)
        suffix = f" (errno {errno})" if errno else ""
        super().__init__(f"could not apply {step}: {cause}{suffix}")


class EmulationError(TestbedError):
    """The host could not deliver what the topology configured (rate, delay...)."""


class ProtocolError(TestbedError):
    """A malformed, oversized or unexpected frame on a PDD connection."""


class ApiError(TestbedError):
    """A bad HTTP request to the OpenAI-compatible gateway: answered, never raised further.

    ``status`` is the HTTP status; ``body()`` the OpenAI-style error object
    ``{"error": {"message", "type", "param", "code"}}``.
    """

    def __init__(self, status: int, message: str, param: str | None = None,
                 type: str = "invalid_request_error", code: str | None = None,
                 headers: dict[str, str] | None = None):
        self.status, self.message, self.param, self.type, self.code = \
            status, message, param, type, code
        self.headers = headers or {}  # e.g. a 429's Retry-After
        super().__init__(message)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}
