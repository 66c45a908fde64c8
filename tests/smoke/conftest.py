"""Shared toys for the smoke tests: the shipped Llama example and a GPT-2 toy with dropout."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from tests_smoke_paths import LLAMA_TOY

from sapper.smoke.toy import ModelFactory, hf_toy_factory


@pytest.fixture(scope="session")
def llama() -> ModelFactory:
    return hf_toy_factory(LLAMA_TOY)


@pytest.fixture(scope="session")
def gpt2(tmp_path_factory: pytest.TempPathFactory) -> ModelFactory:
    """GPT-2's own defaults (dropout 0.1 everywhere, tied embeddings), scaled down."""
    from transformers import GPT2Config

    path = tmp_path_factory.mktemp("gpt2") / "config.json"
    path.write_text(json.dumps(GPT2Config().to_dict()))
    return hf_toy_factory(path)


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Tests that build a context directly run as run_smoke does: one intra-op thread."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
