"""``sapper smoke``: the start-small checks on a toy of the user's model (seed §6)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from sapper.cli.output import (
    FormatOpt,
    OutputFormat,
    console,
    emit_json,
    err_console,
    run_guarded,
)
from sapper.errors import InputError

_PRECISIONS = ("fp32", "bf16", "fp16")


def _split(values: list[str] | None) -> list[str]:
    return [v.strip() for item in values or [] for v in item.split(",") if v.strip()]


def _model_of(configs: list[Path]) -> Path:
    """The model config.json a launch config points at (its ``hf_config`` reference, or
    the file itself when it is one): the toy is that architecture scaled down."""
    from sapper.plan.readers.registry import read_config

    for path in configs:
        src = read_config(path)
        if src.format == "hf":
            return path
        if "hf_config" in src.refs:
            return src.refs["hf_config"]
    raise InputError(
        "no local model config.json in the given config (a model named by its hub id is "
        "never downloaded)",
        file=", ".join(str(p) for p in configs),
        field="--config",
        expected="a config that points at a local model folder or config.json, or --model "
        "config.json",
    )


def smoke(
    configs: Annotated[
        list[Path] | None,
        typer.Option("--config", "-c", metavar="FILE",
                     help="A launch config (any format `sapper check` reads) whose local model "
                     "config.json is scaled to a toy.", show_default=False),
    ] = None,
    model: Annotated[
        Path | None,
        typer.Option("--model", "-m", help="HF config.json; scaled down to a toy.",
                     show_default=False),
    ] = None,
    factory: Annotated[
        str | None,
        typer.Option("--factory", help="module:function (imported from the current "
                     "directory or installed packages) or path/to/file.py:function returning "
                     "your nn.Module.",
                     show_default=False),
    ] = None,
    data: Annotated[
        Path | None,
        typer.Option("--data", help="Tokenized file: .npy or flat .bin.", show_default=False),
    ] = None,
    token_dtype: Annotated[
        str, typer.Option("--token-dtype", help="Token dtype of a .bin file.")
    ] = "uint16",
    loader: Annotated[
        str | None,
        typer.Option("--loader", help="module:function or file.py:function; (rank, "
                     "world_size) -> your batches.",
                     show_default=False),
    ] = None,
    step: Annotated[
        str | None,
        typer.Option("--step", help="module:name or file.py:name of your TrainStep (a "
                     "class or callable; docs/train-step.md).",
                     show_default=False),
    ] = None,
    checks: Annotated[
        list[str] | None,
        typer.Option("--checks", help="Only these checks (comma-separated); default all.",
                     show_default=False),
    ] = None,
    skip: Annotated[
        list[str] | None,
        typer.Option("--skip", help="Skip these checks (comma-separated).", show_default=False),
    ] = None,
    steps: Annotated[int, typer.Option("--steps", min=2, help="Overfit steps.")] = 60,
    lr: Annotated[float, typer.Option("--lr", min=0.0, help="Overfit learning rate.")] = 3e-3,
    dtype: Annotated[
        list[str] | None,
        typer.Option("--dtype", help="Low precisions to compare with fp32 (bf16,fp16).",
                     show_default=False),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of init, data and dropout.")] = 0,
    seq_len: Annotated[int, typer.Option("--seq-len", min=4, help="Tokens per sequence.")] = 64,
    micro_batch: Annotated[
        int, typer.Option("--micro-batch", min=1, help="Sequences per micro-batch.")
    ] = 4,
    grad_accum: Annotated[
        int, typer.Option("--grad-accum", min=2, help="Micro-batches per step (GA check).")
    ] = 2,
    dp: Annotated[int, typer.Option("--dp", min=2, help="Data-parallel ranks (gloo).")] = 2,
    layers: Annotated[int, typer.Option("--layers", min=2, help="Toy depth (max).")] = 4,
    head_dim: Annotated[int, typer.Option("--head-dim", min=2, help="Toy head width.")] = 16,
    vocab: Annotated[int, typer.Option("--vocab", min=8, help="Toy vocabulary (max).")] = 512,
    device: Annotated[str, typer.Option("--device", help="cpu, cuda, cuda:1 ...")] = "cpu",
    fmt: FormatOpt = OutputFormat.text,
    strict: bool = typer.Option(False, "--strict", help="Exit 1 on warnings too."),
) -> None:
    """Train a toy of your architecture for seconds and prove: it overfits one batch, labels
    are shifted once, gradient accumulation, activation checkpointing and data parallel are
    exact, bf16/fp16 agree with fp32, activations fit fp16, init is healthy, and the memory
    estimate matches a measured step."""

    def body() -> int:
        import logging

        import torch

        from sapper.cli.smoke_progress import Progress, Streaming
        from sapper.smoke.batches import LoaderFactory, TokenFile
        from sapper.smoke.context import SmokeConfig
        from sapper.smoke.render import render_footer, render_smoke_report
        from sapper.smoke.runner import CHECKS, run_smoke
        from sapper.smoke.toy import ToySize, hf_toy_factory, user_factory
        from sapper.smoke.userref import import_callable

        logging.getLogger("transformers").setLevel(logging.ERROR)
        if os.getcwd() not in sys.path:  # --factory/--loader/--step name the user's modules
            sys.path.insert(0, os.getcwd())
        model_file = model
        if model_file is None and factory is None and configs:
            model_file = _model_of(configs)
        if (model_file is None) == (factory is None):
            raise InputError(
                "give exactly one model",
                field="--model/--factory",
                expected="--model config.json (scaled to a toy) or --factory module:function",
            )
        if data is not None and loader is not None:
            raise InputError("give one data source", field="--data/--loader",
                             expected="--data FILE or --loader module:function, not both")
        precisions = tuple(_split(dtype)) or ("bf16", "fp16")
        for p in precisions:
            if p not in _PRECISIONS:
                raise InputError("unknown precision", field="--dtype", value=p,
                                 expected="bf16, fp16 (fp32 is the reference)")
        try:
            dev = torch.device(device)
        except RuntimeError:
            raise InputError("unknown device", field="--device", value=device,
                             expected="cpu, cuda or cuda:N") from None
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise InputError("no CUDA device here", field="--device", value=device,
                             expected="cpu")
        source = None
        min_vocab = 0
        if data is not None:
            source = TokenFile(data, seq_len, micro_batch, token_dtype=token_dtype)
            min_vocab = source.vocab_size
        elif loader is not None:
            source = LoaderFactory(import_callable(loader, "--loader"))
        size = ToySize(layers=layers, head_dim=head_dim, vocab_size=vocab)
        toy = (
            hf_toy_factory(model_file, size, min_vocab=min_vocab)
            if model_file is not None
            else user_factory(str(factory))
        )
        train_step = None
        if step is not None:
            obj = import_callable(step, "--step")
            train_step = obj() if isinstance(obj, type) else obj
        chosen = _split(checks) or list(CHECKS)
        dropped = set(_split(skip))
        for name in dropped - set(CHECKS):
            raise InputError("unknown check", field="--skip", value=name,
                             expected=f"some of {', '.join(CHECKS)}")
        config = SmokeConfig(
            steps=steps,
            lr=lr,
            seed=seed,
            precisions=precisions,  # type: ignore[arg-type]
            grad_accum=grad_accum,
            micro_batch=micro_batch,
            seq_len=seq_len,
            device=str(dev),
            dp_world_size=dp,
        )
        observer = None
        if fmt != OutputFormat.json:
            observer = Streaming(console) if not console.is_terminal else Progress(err_console)
        report = run_smoke(
            toy, source, train_step, config, [c for c in chosen if c not in dropped],
            observer=observer,
        )
        if fmt == OutputFormat.json:
            emit_json(report.to_json())
        elif isinstance(observer, Streaming):
            console.print(render_footer(report))
        else:
            console.print(render_smoke_report(report))
        return report.exit_code(strict)

    run_guarded(body)
