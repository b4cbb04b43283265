"""Subword tokens for language models: byte-level BPE trained on the user's corpus.

Every current language-model recipe reads subwords, not characters: a token then covers a few
characters, so the same context sees more text and a step learns from more of it. meta does
not write its own BPE: ``BPETokenizer`` wraps Hugging Face ``tokenizers`` (Rust, the library
behind GPT-2's and most hub tokenizers), configured as GPT-2's byte-level BPE: the 256 byte
values are the alphabet, so any text encodes and decodes back exactly, and merges are learnt
from the corpus until ``vocab_size`` tokens. It is an optional extra
(``pip install 'meta-dnn[text]'``); without it, asking for one is one line naming the extra.

The trained tokenizer is saved with the run as the library's own JSON (``state()``, read by
``meta.lv2.tokenizers``), so ``meta sample`` encodes prompts as training did.

>>> tok = BPETokenizer.train("to be or not to be, " * 50, vocab_size=270)  # doctest: +SKIP
>>> tok.decode(tok.encode("not to be"))  # doctest: +SKIP
'not to be'
"""

from __future__ import annotations

from typing import Any

import numpy as np

from meta.lv2.tokenizer_errors import EXTRA, MissingLibraryError, TokenizerError


def _library(what: str) -> Any:
    try:
        import tokenizers
    except ImportError:
        raise MissingLibraryError(f"{what} needs Hugging Face tokenizers, not installed: "
                                  f"{EXTRA}") from None
    return tokenizers


class BPETokenizer:
    """Byte-level BPE: ``encode(text)`` int64 ids, ``decode(ids)`` text, ``len()`` tokens."""

    kind = "bpe"

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer  # a tokenizers.Tokenizer

    @classmethod
    def train(cls, text: str, vocab_size: int) -> BPETokenizer:
        """Merges learnt from ``text`` (line by line) up to ``vocab_size`` tokens."""
        lib = _library("tokenizer 'bpe'")
        tok = lib.Tokenizer(lib.models.BPE())
        tok.pre_tokenizer = lib.pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = lib.decoders.ByteLevel()
        trainer = lib.trainers.BpeTrainer(
            vocab_size=vocab_size, show_progress=False, special_tokens=[],
            initial_alphabet=lib.pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(text.splitlines(keepends=True), trainer=trainer)
        return cls(tok)

    @classmethod
    def from_json(cls, text: str, where: str = "tokenizer") -> BPETokenizer:
        """The tokenizer ``state()`` saved (the library's JSON); ``where`` names it in errors."""
        lib = _library(f"{where}: its BPE tokenizer")
        try:
            return cls(lib.Tokenizer.from_str(text))
        except Exception as err:  # the library raises its own Exception types
            raise TokenizerError(f"{where}: not a tokenizers BPE ({err})") from None

    def state(self) -> dict[str, Any]:
        """What rebuilds it (``meta.lv2.tokenizers`` saves it with a run)."""
        return {"kind": "bpe", "tokenizer": self.tokenizer.to_str()}

    def __len__(self) -> int:
        return int(self.tokenizer.get_vocab_size())

    def encode(self, text: str) -> np.ndarray:
        """``text`` as int64 ids (any text: its bytes are the alphabet)."""
        return np.array(self.tokenizer.encode(text).ids, np.int64)

    def decode(self, ids: Any) -> str:
        """The text of ``ids`` (ids outside the vocabulary skipped, as ``Vocabulary`` does)."""
        ids = [int(i) for i in np.asarray(ids).reshape(-1) if 0 <= int(i) < len(self)]
        return self.tokenizer.decode(ids, skip_special_tokens=False)
