"""A Hugging Face Trainer script as users write them, with no sapper in it: a tiny GPT-2
built from a config (no download) learns a counting pattern. ``--lr`` plants a fault."""

import argparse

import torch
import transformers
from transformers import Trainer, TrainingArguments

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--lr", type=float, default=3e-3)
parser.add_argument("--steps", type=int, default=40)
args = parser.parse_args()

transformers.logging.set_verbosity_error()
torch.set_num_threads(1)
torch.manual_seed(0)
VOCAB, SEQ = 64, 16


class Counting(torch.utils.data.Dataset):
    """Every row counts up (mod VOCAB) from its own start by its own stride: each of the
    VOCAB x 7 rows once, in a shuffled order."""

    def __init__(self) -> None:
        start = torch.arange(VOCAB).repeat_interleave(7)[:, None]
        stride = torch.arange(1, 8).repeat(VOCAB)[:, None]
        rows = (start + stride * torch.arange(SEQ)) % VOCAB
        self.rows = rows[torch.randperm(len(rows), generator=torch.Generator().manual_seed(1))]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


config = transformers.GPT2Config(
    n_embd=32, n_layer=2, n_head=2, vocab_size=VOCAB, n_positions=SEQ,
    bos_token_id=0, eos_token_id=0,
)
model = transformers.GPT2LMHeadModel(config)
training = TrainingArguments(
    output_dir=args.out, max_steps=args.steps, per_device_train_batch_size=8,
    learning_rate=args.lr, warmup_steps=5, logging_steps=10, save_strategy="no",
    report_to=[], use_cpu=True, dataloader_num_workers=0, disable_tqdm=True,
    max_grad_norm=1.0,
)
trainer = Trainer(model=model, args=training, train_dataset=Counting())
result = trainer.train()
print(f"trained {trainer.state.global_step} steps, loss {result.training_loss:.3f}")
