"""Token IDs for workloads: the vocabulary, cheap prompt tuples, hashed blocks.

Owns VOCAB_SIZE (the tiny model's vocabulary, testbed.pdd.compute.model's default
``vocab_size``), ``as_prompt`` (numpy array -> tuple whose ints are shared,
so a million-token workload costs ~8 bytes per token) and ``hashed_tokens``
(a deterministic block of token IDs per Mooncake hash id: equal ids give
equal tokens, so shared hash prefixes become shared token prefixes). Token
generation is vectorised numpy; nothing here loops per token in Python.

Example::

    as_prompt(np.array([1, 2, 3]))                           # (1, 2, 3)
    hashed_tokens([7, 9], block_tokens=4, n_tokens=6)        # 4 tokens of id 7, 2 of id 9
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

VOCAB_SIZE = 512
MAX_HASH_ID = (1 << 40) - 1  # ids are packed with a 20-bit position into 64 bits
MAX_BLOCK_TOKENS = 1 << 20
# one int object per token ID, shared by all prompts (an object array indexes in C)
_TOKEN_INTS = np.array(tuple(range(VOCAB_SIZE)), dtype=object)
_SALT = np.uint64(0x5DEECE66D)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def as_prompt(tokens: np.ndarray) -> tuple[int, ...]:
    """A prompt tuple from an integer array of token IDs in 0..VOCAB_SIZE-1."""
    return tuple(_TOKEN_INTS[tokens].tolist())


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser on a uint64 array (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def hashed_tokens(hash_ids: Sequence[int], block_tokens: int, n_tokens: int) -> np.ndarray:
    """Token IDs of a prompt whose i-th block of ``block_tokens`` is fixed by hash_ids[i].

    Token j of a block depends only on (hash id, j), so a partial last block
    is the head of the same id's full block. ``n_tokens`` may end inside the
    last block: (len(hash_ids) - 1) * block_tokens < n_tokens <= len * block_tokens.
    """
    ids = np.asarray(hash_ids, dtype=np.uint64)
    pos = np.arange(block_tokens, dtype=np.uint64)
    keys = (ids[:, None] << np.uint64(20)) | pos[None, :]
    tokens = _mix64(keys.ravel()[:n_tokens] ^ _SALT) % np.uint64(VOCAB_SIZE)
    return tokens.astype(np.int64)
