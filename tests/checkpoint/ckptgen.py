"""Checkpoints written by the real libraries on CPU, and the faults planted into copies.

:func:`hf_trainer_checkpoints` trains a 4-layer Llama (hidden 32, 256-token vocabulary)
for a few steps with the HF Trainer and ``save_steps``, so its ``checkpoint-N/`` folders
are exactly what the Trainer writes (model.safetensors, optimizer.pt, scheduler.pt,
trainer_state.json, rng_state.pth). The ``plant_*`` helpers rewrite one piece of a copy
with the library that wrote it (safetensors / torch.save), so each finding has a planted
fault and the untouched original is its healthy twin.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
import transformers
from safetensors.torch import load_file, save_file

transformers.logging.set_verbosity_error()

VOCAB = 256


def llama(layers: int = 4, hidden: int = 32, tied: bool = False, seed: int = 0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=2, num_key_value_heads=1, vocab_size=VOCAB,
        max_position_embeddings=64, bos_token_id=0, eos_token_id=0, pad_token_id=0,
        tie_word_embeddings=tied,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(cfg)


class Markov(torch.utils.data.Dataset):
    """A learnable token chain: token t+1 = (3 t + 1) mod VOCAB, with noise."""

    def __init__(self, n: int = 64, length: int = 16, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, VOCAB, (n, 1), generator=g)
        steps = torch.arange(length).unsqueeze(0)
        self.data = (start * 3**steps + steps) % VOCAB

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = self.data[i]
        return {"input_ids": ids, "labels": ids.clone()}


def hf_trainer_checkpoints(
    out: Path, steps: int = 4, save_steps: int = 2, tied: bool = False
) -> list[Path]:
    """The checkpoint-N folders of a real HF Trainer run on CPU."""
    torch.set_num_threads(1)
    model = llama(tied=tied)
    args = transformers.TrainingArguments(
        output_dir=str(out), max_steps=steps, save_steps=save_steps, logging_steps=1,
        per_device_train_batch_size=8, learning_rate=1e-3, warmup_steps=2,
        lr_scheduler_type="linear", report_to=[], use_cpu=True,
        dataloader_num_workers=0, seed=0, disable_tqdm=True,
    )  # fmt: skip
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Markov())
    trainer.train()
    return sorted(out.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))


def copy_checkpoint(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def plant_weights(folder: Path, edit) -> None:
    """Rewrite model.safetensors after ``edit(state_dict)`` (in place on the dict)."""
    path = folder / "model.safetensors"
    sd = load_file(path)
    edit(sd)
    save_file(sd, path, metadata={"format": "pt"})


def plant_torch(path: Path, edit) -> None:
    """Rewrite a torch file (optimizer.pt, scheduler.pt...) after ``edit(obj)``."""
    obj = torch.load(path, weights_only=True)
    edit(obj)
    torch.save(obj, path)


def plant_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
