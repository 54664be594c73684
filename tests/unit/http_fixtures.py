"""A tiny HTTP probe the export tests share (the pods' gates on loopback)."""

from __future__ import annotations

import urllib.error
import urllib.request


def http_status(url: str, method: str = "GET") -> int:
    """The status of ``method url``; 0 when nothing answers (timeout 2 s)."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0
