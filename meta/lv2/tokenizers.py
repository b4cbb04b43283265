"""A language model's tokenizer saved with its run, so sampling needs no corpus.

A model's token ids mean nothing without the tokenizer that made them: ``meta run`` writes it
as ``tokenizer.json`` beside ``model.onnx`` and into the model's ``metadata_props`` (key
``meta.tokenizer``), so either file alone is enough for ``meta sample``. The JSON holds the
tokenizer's ``state()``: ``{"kind": "char", "symbols": [...]}``, ``{"kind": "byte"}`` or
``{"kind": "bpe", "tokenizer": <Hugging Face tokenizers' own JSON>}``; it is written with
sorted keys, so a tokenizer read back writes the same bytes (``tokenizer_json``).

>>> from meta.lv2.text import Vocabulary
>>> v = Vocabulary.from_text("to be")
>>> tokenizer_from_json(tokenizer_json(v)).decode(v.encode("bet"))
'bet'
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from meta.lv2.tokenizer_errors import TokenizerError

TOKENIZER_JSON = "tokenizer.json"  # in the run folder
METADATA_KEY = "meta.tokenizer"  # in model.onnx's metadata_props
FORMAT = 1  # the layout of the JSON below; a later one that this meta cannot read is named


def tokenizer_json(tokenizer: Any) -> str:
    """The tokenizer as meta's JSON (one line, keys sorted: the same tokenizer, the same
    bytes)."""
    return json.dumps({"format": FORMAT, **tokenizer.state()}, sort_keys=True,
                      ensure_ascii=False, separators=(",", ":"))


def tokenizer_from_json(text: str, where: str = "tokenizer") -> Any:
    """The tokenizer ``tokenizer_json`` wrote; ``where`` names the source in errors."""
    from meta.lv2.text import Vocabulary

    try:
        state = json.loads(text)
    except ValueError as err:
        raise TokenizerError(f"{where}: not a tokenizer meta wrote ({err})") from None
    kind = state.get("kind") if isinstance(state, dict) else None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise TokenizerError(f"{where}: not a tokenizer meta wrote (format "
                             f"{state.get('format') if isinstance(state, dict) else '?'}, "
                             f"expected {FORMAT})")
    if kind == "char" and isinstance(state.get("symbols"), list):
        return Vocabulary(state["symbols"])
    if kind == "byte":
        return Vocabulary()
    if kind == "bpe" and isinstance(state.get("tokenizer"), str):
        from meta.lv2.bpe import BPETokenizer

        return BPETokenizer.from_json(state["tokenizer"], where)
    raise TokenizerError(f"{where}: unknown tokenizer kind {kind!r} (expected char, byte or "
                         "bpe)")


def save_tokenizer(tokenizer: Any, folder: str | os.PathLike) -> Path:
    """``folder/tokenizer.json``, written whole."""
    from meta.common.files import write_text

    path = Path(folder) / TOKENIZER_JSON
    write_text(path, tokenizer_json(tokenizer) + "\n")
    return path


def add_to_model(model: Any, tokenizer: Any) -> None:
    """Put the tokenizer into an ONNX ModelProto's ``metadata_props`` (replacing one there)."""
    kept = [p for p in model.metadata_props if p.key != METADATA_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    entry = model.metadata_props.add()
    entry.key, entry.value = METADATA_KEY, tokenizer_json(tokenizer)


def model_tokenizer(model: Any, where: str) -> Any | None:
    """The tokenizer in an ONNX ModelProto's ``metadata_props``, or None."""
    for prop in model.metadata_props:
        if prop.key == METADATA_KEY:
            return tokenizer_from_json(prop.value, f"{where} (metadata {METADATA_KEY})")
    return None


def load_tokenizer(path: str | os.PathLike) -> Any:
    """The tokenizer of a run folder (its tokenizer.json, else its model.onnx's metadata) or
    of a model.onnx file."""
    import onnx

    path = Path(path)
    if path.is_dir():
        saved = path / TOKENIZER_JSON
        if saved.is_file():
            return tokenizer_from_json(saved.read_text(encoding="utf-8"), str(saved))
        path = path / "model.onnx"
    if not path.is_file():
        raise TokenizerError(f"{path}: no such file (nor {path.parent / TOKENIZER_JSON})")
    found = model_tokenizer(onnx.load(str(path), load_external_data=False), str(path))
    if found is None:
        raise TokenizerError(f"{path} holds no tokenizer (metadata {METADATA_KEY}): it was not "
                             "trained on meta's text dataset, or was written before meta saved "
                             "tokenizers; train it again to save one")
    return found
