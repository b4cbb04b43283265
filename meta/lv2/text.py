"""Text for language models: a vocabulary, contiguous blocks of tokens, Tiny Shakespeare.

A corpus (the user's text files, or Tiny Shakespeare) is encoded with a character- or
byte-level ``Vocabulary``, or byte-level BPE subwords learnt from it (``tokenizer: "bpe"``,
``meta.lv2.bpe``), and cut into contiguous blocks of ``context + 1`` tokens, each giving
the inputs ``x[t]`` and the targets ``x[t + 1]`` (nanoGPT's and char-rnn's framing). The blocks
do not overlap, so a seeded draw of 10 % of them for validation shares no target with training.
The last, shorter block is padded: inputs with token 0, targets with ``IGNORE_INDEX``, which the
loss and the accuracy skip.

Tiny Shakespeare comes from ``$META_TINYSHAKESPEARE_DIR/input.txt`` when that variable is set
(nothing is downloaded then), else from the per-user cache, downloaded once from char-rnn's
public copy; either way its md5 is checked.

>>> v = Vocabulary.from_text("hello")
>>> v.decode(v.encode("hole")), len(v)
('hole', 4)
"""

from __future__ import annotations

import http.client
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from meta.common.component import Option
from meta.lv2.dataset_registry import register_dataset
from meta.lv2.datasets import (
    IGNORE_INDEX,
    ArrayDataset,
    DatasetError,
    _check_md5,
    _download,
    _md5,
    _reason,
    data_folder,
)

TINYSHAKESPEARE_MD5 = "6fb458f1232090904fb40fe944165e91"  # ../shared/datasets/tinyshakespeare
TINYSHAKESPEARE_URL = ("https://raw.githubusercontent.com/karpathy/char-rnn/master/data/"
                       "tinyshakespeare/input.txt")
TOKENIZERS = ("char", "byte", "bpe")


@dataclass(frozen=True)
class _Source:  # what ``data_folder`` reads: the cache folder's name and the variable
    name: str
    env_var: str


TINYSHAKESPEARE = _Source("tinyshakespeare", "META_TINYSHAKESPEARE_DIR")


class Vocabulary:
    """Token ids <-> text: ``char`` (the sorted distinct characters of the corpus, as char-rnn
    and nanoGPT's shakespeare_char) or ``byte`` (the 256 byte values of UTF-8: any text
    encodes, at the cost of more steps per character outside ASCII)."""

    def __init__(self, symbols: Sequence[str] | None = None) -> None:
        self.symbols = list(symbols) if symbols is not None else None  # None: bytes
        self._index = {c: i for i, c in enumerate(self.symbols or ())}
        self._order = None  # (ids by code point, sorted code points) of one-character symbols
        if self.symbols and all(len(c) == 1 for c in self.symbols):
            points = np.array([ord(c) for c in self.symbols], np.uint32)
            order = np.argsort(points, kind="stable")
            self._order = (order.astype(np.int64), points[order])

    @classmethod
    def from_text(cls, text: str) -> Vocabulary:
        return cls(sorted(set(text)))

    @property
    def kind(self) -> str:
        return "byte" if self.symbols is None else "char"

    def state(self) -> dict[str, Any]:
        """What rebuilds it (``meta.lv2.tokenizers`` saves it with a run)."""
        return {"kind": "byte"} if self.symbols is None else \
            {"kind": "char", "symbols": list(self.symbols)}

    def __len__(self) -> int:
        return 256 if self.symbols is None else len(self.symbols)

    def encode(self, text: str) -> np.ndarray:
        """``text`` as int64 ids; a character outside a char vocabulary is an error naming it."""
        if self.symbols is None:
            return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int64)
        if self._order is None:  # symbols longer than a character: one at a time
            try:
                return np.array([self._index[c] for c in text], np.int64)
            except KeyError as err:
                raise ValueError(f"character {err.args[0]!r} is not in the vocabulary of "
                                 f"{len(self)} characters") from None
        # Code points looked up in bulk: no Python object per character of a large corpus
        codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), np.uint32)
        order, keys = self._order
        at = np.minimum(np.searchsorted(keys, codes), len(keys) - 1)
        unknown = keys[at] != codes
        if unknown.any():
            raise ValueError(f"character {chr(codes[unknown.argmax()])!r} is not in the "
                             f"vocabulary of {len(self)} characters")
        return order[at]

    def decode(self, ids: Any) -> str:
        ids = [int(i) for i in np.asarray(ids).reshape(-1)]
        if self.symbols is None:
            return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")
        return "".join(self.symbols[i] for i in ids if 0 <= i < len(self.symbols))


def tinyshakespeare(download: bool = True) -> Path:
    """A verified local path of Tiny Shakespeare's ``input.txt``."""
    folder, chosen = data_folder(TINYSHAKESPEARE)  # type: ignore[arg-type]
    path = folder / "input.txt"
    if chosen:
        if not path.is_file():
            raise DatasetError(f"{path} not found: ${TINYSHAKESPEARE.env_var} points to "
                               f"{folder}, which must hold Tiny Shakespeare's input.txt "
                               f"(md5 {TINYSHAKESPEARE_MD5})")
        _check_md5(path, TINYSHAKESPEARE_MD5)
        return path
    if path.is_file() and _md5(path) == TINYSHAKESPEARE_MD5:
        return path
    if not download:
        raise DatasetError(f"{path} is missing or corrupt and download=False; set "
                           f"${TINYSHAKESPEARE.env_var} to a folder holding input.txt")
    folder.mkdir(parents=True, exist_ok=True)
    try:
        _download(TINYSHAKESPEARE_URL, path, TINYSHAKESPEARE_MD5, True)
    except (OSError, ValueError, http.client.HTTPException) as err:
        raise DatasetError(f"could not download {TINYSHAKESPEARE_URL} (md5 "
                           f"{TINYSHAKESPEARE_MD5}) into {folder}: {_reason(err)}; set "
                           f"${TINYSHAKESPEARE.env_var} to a folder holding input.txt") from err
    return path


def read_corpus(files: Sequence[str | Path]) -> str:
    """The text of ``files`` joined (UTF-8), or Tiny Shakespeare when ``files`` is empty."""
    paths = [Path(f).expanduser() for f in files] or [tinyshakespeare()]
    parts = []
    for path in paths:
        try:
            parts.append(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise DatasetError(f"{path}: text file not found") from None
        except (OSError, UnicodeDecodeError) as err:
            raise DatasetError(f"{path}: cannot read it as UTF-8 text ({err})") from err
    text = "".join(parts)
    if not text:
        raise DatasetError(f"{', '.join(map(str, paths))}: no text")
    return text


def blocks(tokens: np.ndarray, context: int) -> tuple[np.ndarray, np.ndarray]:
    """Contiguous, non-overlapping blocks: inputs (n, context) ``tokens[t]`` and targets
    ``tokens[t + 1]``; the last block padded (inputs 0, targets ``IGNORE_INDEX``)."""
    if context < 1:
        raise ValueError(f"context must be at least 1, got {context}")
    if len(tokens) < 2:
        raise DatasetError(f"a text of {len(tokens)} token(s) has no next token to predict")
    n = -(-(len(tokens) - 1) // context)
    x = np.zeros(n * context, np.int64)
    y = np.full(n * context, IGNORE_INDEX, np.int64)
    x[:len(tokens) - 1] = tokens[:-1]
    y[:len(tokens) - 1] = tokens[1:]
    return x.reshape(n, context), y.reshape(n, context)


def characters_per_token(data: ArrayDataset) -> float:
    """Characters the targets of ``data`` decode to (with its ``vocabulary``), per target
    token: what converts a loss per token into a loss per character."""
    chars = tokens = 0
    for row in data.labels:
        real = row[row != IGNORE_INDEX]
        chars += len(data.vocabulary.decode(real))
        tokens += len(real)
    return chars / tokens if tokens else 1.0


def split(inputs: np.ndarray, targets: np.ndarray, validation: float,
          seed: int) -> tuple[ArrayDataset, ArrayDataset]:
    """A seeded draw of ``validation`` of the blocks (at least one each way) for validation."""
    n = len(inputs)
    if n < 2:
        raise DatasetError(f"the text makes {n} block(s); a training and a validation block "
                           "need a longer text or a shorter context")
    held = min(max(1, round(n * validation)), n - 1)
    order = np.random.default_rng([seed, 0x7E47]).permutation(n)
    val, train = np.sort(order[:held]), np.sort(order[held:])
    return (ArrayDataset(inputs[train], targets[train]),
            ArrayDataset(inputs[val], targets[val]))


def make_tokenizer(kind: str, text: str, vocab_size: int = 1024) -> Any:
    """The tokenizer ``kind`` names for ``text``: its characters, the 256 bytes, or a
    byte-level BPE of ``vocab_size`` tokens trained on it (``meta.lv2.bpe``)."""
    if kind not in TOKENIZERS:
        raise ValueError(f"tokenizer {kind!r} is not one of {list(TOKENIZERS)}")
    if kind == "bpe":
        from meta.lv2.bpe import BPETokenizer, MissingLibraryError

        try:
            return BPETokenizer.train(text, vocab_size)
        except MissingLibraryError as err:
            raise DatasetError(f"dataset 'text': {err}") from None
    return Vocabulary.from_text(text) if kind == "char" else Vocabulary()


def text_dataset(seed: int = 0, files: Sequence[str] = (), context: int = 64,
                 tokenizer: str = "char", vocab_size: int = 1024,
                 validation: float = 0.1) -> tuple[ArrayDataset, ArrayDataset]:
    """(train, validation) blocks of a text in tokens of ``tokenizer`` (each split keeps it as
    ``vocabulary``: the run saves it, ``meta sample`` reads it back)."""
    if tokenizer not in TOKENIZERS:
        raise ValueError(f"tokenizer {tokenizer!r} is not one of {list(TOKENIZERS)}")
    text = read_corpus(files)
    vocab = make_tokenizer(tokenizer, text, vocab_size)
    train, val = split(*blocks(vocab.encode(text), context), validation, seed)
    train.vocabulary = val.vocabulary = vocab
    return train, val


register_dataset(
    "text",
    files=Option((), "UTF-8 text files to model (none: Tiny Shakespeare)", type=tuple[str, ...],
                 path=True),
    context=Option(64, "tokens per block (the model's context)", low=1),
    tokenizer=Option("char", "char: the corpus' characters; byte: the 256 UTF-8 bytes; bpe: "
                     "byte-level BPE subwords trained on the corpus (the 'text' extra)",
                     choices=TOKENIZERS),
    vocab_size=Option(1024, "bpe: tokens in the vocabulary learnt from the corpus (at least "
                      "the 256 bytes)", low=256),
    validation=Option(0.1, "share of the blocks held out for validation (the test split)",
                      low=0.0, high=0.9),
)(text_dataset)
