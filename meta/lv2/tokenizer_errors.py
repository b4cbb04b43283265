"""The errors of tokenizers, apart from the tokenizers themselves: ``meta.lv2.tokenizers``
reads any saved tokenizer (char, byte, BPE) and ``meta.lv2.bpe`` wraps Hugging Face's, and
each raises both, so neither imports the other to raise."""

from __future__ import annotations

EXTRA = "pip install 'meta-dnn[text]' (Hugging Face tokenizers)"


class TokenizerError(ValueError):
    """A saved tokenizer that cannot be read: missing, not meta's JSON, or of an unknown kind."""


class MissingLibraryError(ImportError):
    """Hugging Face ``tokenizers`` is not installed; the message names the extra."""
