"""The tiny model's tokenizer (testbed/pdd/compute/tokenizer/, testbed.pdd.compute.text).

Any id sequence decodes to text that encodes back to the same ids, one
character per id; the stored files are what the script makes; a
transformers client loads the directory offline (when transformers is
installed).
"""

from __future__ import annotations

import json
import random

import pytest

from testbed.errors import TestbedError
from testbed.pdd.compute.model import ModelConfig
from testbed.pdd.compute.text import (TOKENIZER_DIR, UNK, decode_one_each, encode, load_tokenizer,
                              vocab_chars, write_tokenizer)

VOCAB = ModelConfig().vocab_size


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(vocab_size=VOCAB)


def test_every_id_sequence_round_trips_through_text(tok):
    rng = random.Random(3)
    for n in (1, 7, 300, 5000):
        ids = [rng.randrange(VOCAB) for _ in range(n)]
        text = tok.decode(ids)
        assert len(text) == n
        assert encode(tok, text) == ids
        assert "".join(decode_one_each(tok, ids)) == text
    assert [tok.decode([i]) for i in range(VOCAB)] == decode_one_each(tok, range(VOCAB))


def test_vocabulary_text_round_trips_and_other_characters_are_unknown(tok):
    text = "Hello, world!\n\tdef f(x): return x ** 2  # ÀÉÎõü ĀŁŒƂ"
    ids = encode(tok, text)
    assert len(ids) == len(text) and tok.decode(ids) == text
    assert encode(tok, "a☃b") == [encode(tok, "a")[0], 0, encode(tok, "b")[0]]
    assert tok.decode([0]) == UNK
    assert len(set(vocab_chars(VOCAB))) == VOCAB


def test_stored_files_are_what_the_script_writes(tmp_path):
    write_tokenizer(tmp_path, VOCAB, ModelConfig().max_context)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert json.loads((tmp_path / name).read_text()) == \
            json.loads((TOKENIZER_DIR / name).read_text()), name


def test_a_tokenizer_of_another_size_is_refused():
    with pytest.raises(TestbedError, match="512 token ids, the model has 1024"):
        load_tokenizer(vocab_size=1024)


def test_transformers_loads_the_directory_offline(monkeypatch):
    transformers = pytest.importorskip("transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hf = transformers.AutoTokenizer.from_pretrained(str(TOKENIZER_DIR))
    ids = [random.Random(4).randrange(VOCAB) for _ in range(200)]
    text = hf.decode(ids)
    assert hf.encode(text, add_special_tokens=False) == ids
    assert hf.decode(ids, skip_special_tokens=True) == text
