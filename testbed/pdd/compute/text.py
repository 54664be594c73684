"""Text <-> token ids for the tiny model: a character-level Hugging Face tokenizer.

Owns the tokenizer of ``testbed.pdd.compute.model``'s vocabulary (``ModelConfig.vocab_size``
ids), stored in ``testbed/pdd/compute/tokenizer/`` as ``tokenizer.json`` (the `tokenizers`
library's format) and ``tokenizer_config.json`` (what ``transformers.AutoTokenizer``
reads: class ``PreTrainedTokenizerFast``, the context length, no clean-up of
spaces), and the code that makes them:
``python -m testbed.pdd.compute.text [--out DIR] [--vocab-size N] [--max-context N]``.

Every id is exactly one character: id 0 is U+FFFD (also the unknown token: a
character outside the vocabulary encodes to 0), then newline, tab, printable
ASCII, then printable Latin-1 and Latin Extended letters until the
vocabulary is full. A BPE model with no merges, no normalizer, no
pre-tokenizer and a ``Fuse`` decoder, so:

- ``decode(ids)`` is the concatenation of one character per id, for ANY id
  sequence (the model's greedy output included), and ``encode(decode(ids))
  == ids``: a benchmark client that counts tokens by re-tokenizing the text
  it received counts exactly the tokens the roles produced;
- text made only of vocabulary characters round-trips: ``decode(encode(t)) == t``;
- a streamed response's chunks (one id each) concatenate to the whole text.

Merges would make the text shorter but break the first property (the ids of
"t" then "h" decode to "th", which encodes to the merged id), so there are none.

Example::

    tok = load_tokenizer()
    ids = encode(tok, "Hello, world")      # 12 ids
    assert decode_one_each(tok, ids) == list("Hello, world")
"""

from __future__ import annotations

import argparse
import json
import sys
import unicodedata
from pathlib import Path

from testbed.errors import TestbedError
from testbed.pdd.compute.engine import ModelConfig

TOKENIZER_DIR = Path(__file__).resolve().parent / "tokenizer"
UNK = "\ufffd"
_FIRST = [UNK, "\n", "\t"] + [chr(c) for c in range(0x20, 0x7F)]


def vocab_chars(vocab_size: int) -> list[str]:
    """The character of each id 0..vocab_size-1 (see the module docstring)."""
    chars, code = list(_FIRST[:vocab_size]), 0xA1
    while len(chars) < vocab_size:
        c = chr(code)
        if c.isprintable() and unicodedata.category(c)[0] in "LNPS" \
                and unicodedata.normalize("NFC", c) == c:
            chars.append(c)
        code += 1
        if code > 0xFFFF:
            raise TestbedError(f"no {vocab_size} single-character tokens in the BMP")
    return chars


def build_tokenizer(vocab_size: int):
    """A ``tokenizers.Tokenizer`` with one character per id."""
    from tokenizers import Tokenizer, decoders, models

    vocab = {c: i for i, c in enumerate(vocab_chars(vocab_size))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    tok.decoder = decoders.Fuse()
    return tok


def tokenizer_config(max_context: int) -> dict:
    """tokenizer_config.json: what transformers.AutoTokenizer needs, offline."""
    return {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_context,
            "clean_up_tokenization_spaces": False, "model_input_names": ["input_ids"],
            "padding_side": "right", "truncation_side": "right", "added_tokens_decoder": {}}


def write_tokenizer(out_dir: Path, vocab_size: int, max_context: int) -> None:
    """Write tokenizer.json and tokenizer_config.json into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(vocab_size)
    (out_dir / "tokenizer.json").write_text(tok.to_str(pretty=True) + "\n")
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config(max_context), indent=1) + "\n")


def load_tokenizer(path: str | Path = TOKENIZER_DIR, vocab_size: int | None = None):
    """The stored tokenizer (a directory holding tokenizer.json, or the file itself).

    ``vocab_size``: the model's; a tokenizer of another size is a TestbedError.
    """
    from tokenizers import Tokenizer

    path = Path(path)
    file = path / "tokenizer.json" if path.is_dir() else path
    try:
        tok = Tokenizer.from_file(str(file))
    except Exception as err:  # tokenizers raises a bare Exception on a bad file
        raise TestbedError(f"{file}: not a tokenizer ({err})") from None
    if vocab_size is not None and tok.get_vocab_size() != vocab_size:
        raise TestbedError(f"{file}: {tok.get_vocab_size()} token ids, the model has "
                           f"{vocab_size}")
    return tok


def encode(tok, text: str) -> list[int]:
    """Token ids of ``text`` (no special tokens are added)."""
    return tok.encode(text, add_special_tokens=False).ids


def decode_one_each(tok, ids) -> list[str]:
    """The text of each id on its own (a streamed chunk's text)."""
    return [tok.id_to_token(i) or "" for i in ids]


def main(argv: list[str] | None = None) -> int:
    default = ModelConfig()
    ap = argparse.ArgumentParser(prog="python -m testbed.pdd.compute.text",
                                 description="write the tiny model's tokenizer files")
    ap.add_argument("--out", default=str(TOKENIZER_DIR), help="directory to write into")
    ap.add_argument("--vocab-size", type=int, default=default.vocab_size)
    ap.add_argument("--max-context", type=int, default=default.max_context)
    args = ap.parse_args(argv)
    write_tokenizer(Path(args.out), args.vocab_size, args.max_context)
    print(f"wrote {args.out}/tokenizer.json and tokenizer_config.json "
          f"({args.vocab_size} ids)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
