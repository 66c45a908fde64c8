"""The vocabulary Megatron's tokenizer gives, before Megatron pads it, where the launch
decides it: by the tokenizer type alone, or from a tokenizer file on this machine.

Megatron builds the tokenizer in ``megatron/core/tokenizers/utils/build_tokenizer.py``
(NVIDIA/Megatron-LM at d98e8a64) and pads ``tokenizer.vocab_size`` to a multiple of
``--make-vocab-size-divisible-by`` × TP (``vocab_size_with_padding``):

- ``GPT2BPETokenizer`` is the GPT-2 tokenizer (``MEGATRON_CONFIG_MAP``: ``gpt2``, its
  ``gpt2-vocab.json`` and merges): 50,257 tokens, whatever path ``--vocab-file`` names.
- ``HuggingFaceTokenizer`` is ``len(tokenizer)`` of ``--tokenizer-model``: the model's
  vocabulary and the added tokens, counted here from ``tokenizer.json`` when the path is a
  folder or file on this machine (a hub id is not downloaded).
- ``SentencePieceTokenizer``, ``GPTSentencePieceTokenizer`` and ``Llama2Tokenizer`` are
  the SentencePiece model's piece count (``get_piece_size``), read here from the
  ``--tokenizer-model`` file (its ``pieces``, protobuf field 1); ``--special-tokens`` adds
  tokens, so the size is then left unknown.
- ``BertWordPieceLowerCase`` / ``BertWordPieceCase`` depend on the vocabulary file and the
  special tokens Megatron adds to it (``<extra_id_*>`` for the cased one); left unknown.
- ``NullTokenizer`` and ``TikTokenizer`` take ``--vocab-size`` (handled by the caller).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

__all__ = ["GPT2_VOCAB", "TokenizerVocab", "file_vocab"]

#: GPT-2's vocabulary (``gpt2-vocab.json``: 50,000 merges + 256 bytes + ``<|endoftext|>``).
GPT2_VOCAB = 50_257
#: Largest tokenizer file read (Llama 3's tokenizer.json is 9 MB, Gemma 3's 262k-token one
#: 33 MB); beyond it the vocabulary is left unknown.
MAX_TOKENIZER_BYTES = 40 << 20
#: SentencePiece types: the piece count of ``--tokenizer-model``.
SENTENCEPIECE = ("SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer")


class TokenizerVocab:
    """What :func:`file_vocab` found: the size and where it came from, or why not."""

    def __init__(self, size: int | None, said: str) -> None:
        self.size, self.said = size, said


def _read_bytes(path: Path) -> bytes | str:
    """The file's bytes, or why it is not read (a regular file of at most the bound)."""
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            return f"{path} is not a regular file"
        if info.st_size > MAX_TOKENIZER_BYTES:
            return f"{path} is over {MAX_TOKENIZER_BYTES >> 20} MiB"
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                return f"{path} is not a regular file"
            data = fh.read(MAX_TOKENIZER_BYTES + 1)
    except (OSError, ValueError):
        return f"{path} is not on this machine"
    if len(data) > MAX_TOKENIZER_BYTES:
        return f"{path} is over {MAX_TOKENIZER_BYTES >> 20} MiB"
    return data


def _hf_vocab(path: Path) -> TokenizerVocab:
    """``len(tokenizer)`` of a Hugging Face tokenizer: the distinct tokens of
    ``tokenizer.json``'s model vocabulary and its ``added_tokens``."""
    try:
        folder = path.is_dir()
    except (OSError, ValueError):
        folder = False
    file = path / "tokenizer.json" if folder else path
    data = _read_bytes(file)
    if isinstance(data, str):
        return TokenizerVocab(None, data)
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return TokenizerVocab(None, f"{file} is not a tokenizer.json sapper reads")
    model = doc.get("model") if isinstance(doc, dict) else None
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if isinstance(vocab, dict):
        tokens = set(vocab)
    elif isinstance(vocab, list):  # Unigram: [[piece, score], ...]
        tokens = {str(v[0]) if isinstance(v, list) and v else str(v) for v in vocab}
    else:
        return TokenizerVocab(None, f"{file} has no model.vocab")
    added = doc.get("added_tokens") if isinstance(doc, dict) else None
    for tok in added if isinstance(added, list) else []:
        if isinstance(tok, dict) and isinstance(tok.get("content"), str):
            tokens.add(tok["content"])
    if not tokens:
        return TokenizerVocab(None, f"{file} has an empty model.vocab")
    return TokenizerVocab(len(tokens), f"{file.name}: {len(tokens):,} tokens "
                          "(model vocabulary and added tokens)")


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        b = data[i]
        value |= (b & 0x7F) << shift
        i += 1
        if not b & 0x80:
            return value, i
        shift += 7


def _sentencepiece_pieces(data: bytes) -> int:
    """The pieces of a SentencePiece ``ModelProto`` (repeated field 1), counted by
    walking its top-level fields."""
    i = count = 0
    while i < len(data):
        key, i = _varint(data, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            _, i = _varint(data, i)
        elif wire == 1:
            i += 8
        elif wire == 2:
            length, i = _varint(data, i)
            i += length
            count += field == 1
        elif wire == 5:
            i += 4
        else:
            raise ValueError("not a protobuf message")
        if i > len(data):
            raise ValueError("truncated field")
    return count


def _sp_vocab(path: Path) -> TokenizerVocab:
    data = _read_bytes(path)
    if isinstance(data, str):
        return TokenizerVocab(None, data)
    try:
        pieces = _sentencepiece_pieces(data)
    except ValueError:
        pieces = 0
    if not pieces:
        return TokenizerVocab(None, f"{path} is not a SentencePiece model sapper reads")
    return TokenizerVocab(pieces, f"{path.name}: {pieces:,} SentencePiece pieces")


def file_vocab(tokenizer: str, path: Path) -> TokenizerVocab:
    """The vocabulary of ``--tokenizer-type tokenizer --tokenizer-model path`` read from the
    file (HuggingFaceTokenizer, the SentencePiece types)."""
    if tokenizer == "HuggingFaceTokenizer":
        try:
            there = path.exists()
        except (OSError, ValueError):
            there = False
        if not there:
            return TokenizerVocab(None, f"{path} is not on this machine (or is a Hugging "
                                  "Face hub id, which sapper does not download)")
        return _hf_vocab(path)
    return _sp_vocab(path)
