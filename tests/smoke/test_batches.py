"""Batch sources: padding and labels, uneven re-cuts, rank sharding, token files."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sapper.errors import InputError
from sapper.smoke.batches import (
    IGNORE_INDEX,
    SyntheticTokens,
    TokenFile,
    concat_batches,
    fingerprints,
    normalize_batch,
    pad_samples,
    recut_variable_length,
    take,
    target_tokens,
)


def test_padding_is_masked_and_ignored() -> None:
    batch = pad_samples([torch.tensor([5, 6, 7]), torch.tensor([8])])
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [[5, 6, 7], [8, IGNORE_INDEX, IGNORE_INDEX]]
    assert target_tokens(batch) == 2  # 6, 7 (the first token of a sequence is never a target)
    both = concat_batches([batch, pad_samples([torch.tensor([1, 2, 3, 4, 5])])])
    assert both["input_ids"].shape == (3, 5)
    assert target_tokens(both) == 2 + 4


def test_recut_gives_uneven_token_counts_of_the_same_tokens() -> None:
    source = SyntheticTokens(100, 32, 4, variable_length=False)
    given = take(source, 2)
    cut = recut_variable_length(given, 2)
    counts = [target_tokens(b) for b in cut]
    assert counts[0] < counts[1] / 2
    assert all(b["input_ids"].shape[0] == 4 for b in cut)


def test_synthetic_ranks_are_disjoint_and_cover_one_process() -> None:
    source = SyntheticTokens(1000, 16, 2)
    ranks = [set(fingerprints(b)) for r in range(2) for b in take(source, 2, r, 2)]
    one = {fp for b in take(source, 4) for fp in fingerprints(b)}
    assert set.union(*ranks) == one
    assert sum(len(r) for r in ranks) == len(one)


def test_token_files_are_read_and_relabelled(tmp_path) -> None:
    stream = np.array([50000, 7, 50000, 9, 7, 7, 9, 50000] * 8, dtype=np.uint16)
    path = tmp_path / "train.bin"
    stream.tofile(path)
    source = TokenFile(path, seq_len=8, micro_batch=2)
    assert source.vocab_size == 3
    (batch,) = take(source, 1)
    assert batch["input_ids"].max() == 2
    # the relabelling is a bijection: the sequence keeps its structure
    first = batch["input_ids"][0].tolist()
    assert first[0] == first[2] == first[7] and first[1] == first[4] == first[5]
    np.save(tmp_path / "rows.npy", np.arange(40, dtype=np.int32).reshape(4, 10))
    rows = TokenFile(tmp_path / "rows.npy", seq_len=8, micro_batch=2)
    assert rows.vocab_size == 32 and len(take(rows, 2)) == 2


@pytest.mark.parametrize(
    ("name", "content", "problem"),
    [
        ("tokens.txt", b"1 2 3", "unknown token file format"),
        ("short.npy", None, "too few tokens"),
        ("floats.npy", "float", "not a token array"),
    ],
)
def test_bad_token_files(tmp_path, name: str, content, problem: str) -> None:
    path = tmp_path / name
    if content == "float":
        np.save(path, np.zeros(100, dtype=np.float32))
    elif content is None:
        np.save(path, np.arange(3, dtype=np.int64))
    else:
        path.write_bytes(content)
    with pytest.raises(InputError, match=problem):
        TokenFile(path, seq_len=8, micro_batch=2)


def test_loader_items_are_normalised_or_rejected() -> None:
    batch = normalize_batch(torch.ones(2, 4, dtype=torch.int32))
    assert batch["labels"].dtype == torch.long and batch["attention_mask"].all()
    with pytest.raises(InputError, match="not a batch"):
        normalize_batch([1, 2, 3])
    with pytest.raises(InputError, match="two-dimensional"):
        normalize_batch({"input_ids": torch.ones(4)})
    with pytest.raises(InputError, match="only 1 micro-batch"):
        take(_Finite(), 2)


class _Finite:
    def batches(self, rank: int = 0, world_size: int = 1):
        yield pad_samples([torch.tensor([1, 2, 3])])
