"""What both engines' caches share: the span of positions a cache holds
(``TokenSpan``) and the rule a prefill follows when it starts from a cached
prefix (``split_prefill``). Torch-free.

Example::

    cache, new = split_prefill(prompt, prefix_cache, model.new_cache)
"""

from __future__ import annotations

from typing import Callable, Sequence, TypeVar

C = TypeVar("C")


class TokenSpan:
    """The positions [start, end) a cache holds; a subclass sets ``start`` and ``tokens``."""

    start: int
    tokens: list[int]

    @property
    def length(self) -> int:
        return len(self.tokens)

    @property
    def end(self) -> int:
        return self.start + self.length


def split_prefill(tokens: Sequence[int], cache: C | None, new_cache: Callable[[], C]
                  ) -> tuple[C, Sequence[int]]:
    """The cache a prefill extends (``cache``, or a new one) and the tokens it must still
    compute. A cache must hold a prefix of ``tokens`` (ValueError otherwise, and for an
    empty prompt); one that holds every token gives back its last, so the prefill has
    one token to compute the next token's logits from."""
    if len(tokens) == 0:
        raise ValueError("cannot prefill an empty prompt")
    cache = new_cache() if cache is None else cache
    if cache.tokens != list(tokens[: cache.length]):
        raise ValueError("cache does not hold a prefix of these tokens")
    if cache.length == len(tokens):
        cache.truncate(len(tokens) - 1)
    return cache, tokens[cache.length :]
