"""`sapper smoke`: wall time on the shipped example, and the margins behind every tolerance.

For toys of several architectures (dense/GQA/MoE, pre-LN/sandwich, tied/untied, a
hand-written model) it prints what each check measures on correct code, then what it
measures on the planted bugs of ``tests/smoke/smoke_planted.py``, next to the tolerance
in :class:`sapper.smoke.context.Tolerances`. Targets: all checks on the example in under
60 s on a 2-core CPU; every correct value inside its tolerance and every planted bug
outside it by a wide margin.

    python benchmarks/bench_smoke.py [--arch llama,gpt2,...]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "smoke"))  # the planted bugs

import smoke_planted  # noqa: E402
from transformers.models.auto.configuration_auto import CONFIG_MAPPING  # noqa: E402

from sapper.smoke.batches import LoaderFactory  # noqa: E402
from sapper.smoke.context import SmokeConfig, Tolerances  # noqa: E402
from sapper.smoke.runner import run_smoke  # noqa: E402
from sapper.smoke.step import DefaultTrainStep  # noqa: E402
from sapper.smoke.toy import ModelFactory, hf_toy_factory, user_factory  # noqa: E402

EXAMPLE = ROOT / "examples" / "smoke" / "llama-toy.json"
ARCHS = ("gpt2", "mistral", "qwen2_moe", "gemma2", "opt", "gpt_neox")
TOL = Tolerances()


def _factory(arch: str, tmp: Path, **overrides: object) -> ModelFactory:
    if arch == "example":
        raw = json.loads(EXAMPLE.read_text())
    elif arch == "tinylm":
        return user_factory(smoke_planted.tiny_lm)
    else:
        raw = CONFIG_MAPPING[arch]().to_dict()
    raw.update(overrides)
    path = tmp / f"{arch}.json"
    path.write_text(json.dumps(raw))
    return hf_toy_factory(path)


def _data(report) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for f in report.findings:
        key = f.code + (f"-{f.data['precision']}" if "precision" in f.data else "")
        out[key] = {"value": f.value, "status": f.data.get("status"), **f.data}
    return out


def correct_row(arch: str, tmp: Path) -> list[str]:
    d = _data(run_smoke(_factory(arch, tmp)))
    return [
        arch,
        f"{d['S001']['value']:.0%}",
        f"{d['S002']['pairs_loss_over_ln_k']:.2f}/{d['S002']['keys_loss_over_ln_k']:.2f}",
        f"{d['S003']['value']:.1e}",
        f"{d['S004']['value']:.1e}" + (" (dropout)" if d["S004"]["stochastic"] else ""),
        f"{d['S005-bf16']['min_layer_cosine']:.4f}/{d['S005-bf16']['max_layer_rel_err']:.3f}",
        f"{d['S005-fp16']['min_layer_cosine']:.5f}/{d['S005-fp16']['max_layer_rel_err']:.4f}",
        f"{d['S006']['value']:.3g}",
        f"{d['S007']['value']:.1e}",
        f"{d['S009']['amplification']:.2f}/{d['S009']['param_grad_spread']:.2f}",
        f"{d['S010']['measured']['activations'] / 2**20:.2f}/"
        + (
            f"{d['S010']['estimated']['activations'] / 2**20:.2f}"
            if d["S010"]["estimated"]
            else "n/a"
        ),
        "all pass" if all(v["status"] == "pass" for v in d.values()) else
        ",".join(k for k, v in d.items() if v["status"] != "pass"),
    ]


def planted_rows(tmp: Path) -> list[list[str]]:
    llama = _factory("example", tmp)
    gpt2 = _factory("gpt2", tmp)
    quick = SmokeConfig(steps=10)
    no_rng = DefaultTrainStep(
        checkpoint_kwargs={"use_reentrant": False, "preserve_rng_state": False}
    )
    cases = [
        ("lr = 0", llama, {"config": SmokeConfig(lr=0.0, steps=20)}, ["overfit"], "S001",
         lambda f: f"drop {f.value:.0%}", f"drop ≥ {TOL.overfit_min_drop:.0%}"),
        ("labels not shifted", llama, {"step": smoke_planted.NotShifted(), "config": quick},
         ["overfit"], "S002", lambda f: f"keys {f.data['keys_loss_over_ln_k']:.2f}·ln K",
         f"≥ {TOL.probe_copy_fraction}·ln K"),
        ("labels shifted twice", llama, {"step": smoke_planted.ShiftedTwice(), "config": quick},
         ["overfit"], "S002", lambda f: f"pairs {f.data['pairs_loss_over_ln_k']:.2f}·ln K",
         f"< {TOL.probe_learned_fraction}·ln K"),
        ("GA mean per micro-batch", llama, {"step": smoke_planted.PerMicroBatchMean()},
         ["accumulation"], "S003", lambda f: f"rel err {f.value:.2g}",
         f"≤ {TOL.fp32_rel_err:g}"),
        ("checkpoint w/o RNG state", gpt2, {"step": no_rng}, ["checkpointing"], "S004",
         lambda f: f"rel err {f.value:.2g}", f"≤ {TOL.fp32_rel_err:g}"),
        ("MLP ×3e5 (fp16 overflow)", user_factory(smoke_planted.overflowing_lm), {},
         ["precision"], "S006", lambda f: f"max act {f.value:.3g}", "< 65504"),
        ("DP per-rank token mean", llama, {"step": smoke_planted.PerRankTokens()},
         ["data_parallel"], "S007", lambda f: f"rel err {f.value:.2g}",
         f"≤ {TOL.fp32_rel_err:g}"),
        ("DP unsharded loader", llama,
         {"source": LoaderFactory(smoke_planted.unsharded_loader)}, ["data_parallel"], "S008",
         lambda f: f"{f.data['overlap']} extra reads, {f.data['missing']} unread", "0"),
        ("sampler seeded by rank", llama,
         {"source": LoaderFactory(smoke_planted.rank_seeded_loader)}, ["data_parallel"],
         "S008", lambda f: f"{f.data['overlap']} extra reads, {f.data['missing']} unread",
         "0 (epoch tail aside)"),
        ("num_replicas = 2 × world", llama,
         {"source": LoaderFactory(smoke_planted.replicas_doubled_loader)}, ["data_parallel"],
         "S008", lambda f: f"{f.data['overlap']} extra reads, {f.data['missing']} unread",
         "0 (epoch tail aside)"),
        ("collator labels = input_ids", llama,
         {"source": LoaderFactory(smoke_planted.unmasked_labels_loader)}, ["padding"], "S011",
         lambda f: f"{f.data['padded_with_labels']} padded labels, grad rel err "
         f"{f.data['grad_rel_err']:.2g}", f"≤ {TOL.fp32_rel_err:g}"),
        ("targets from input_ids", llama, {"step": smoke_planted.TargetsFromInputIds()},
         ["accumulation"], "S003", lambda f: f"cause: {f.data['cause']}", "named"),
        ("norm updated in eval", user_factory(smoke_planted.stateful_lm), {},
         ["accumulation"], "S003", lambda f: f"cause: {f.data['cause']}", "named"),
        ("fp16 log-softmax in the loss", user_factory(smoke_planted.tiny_lm),
         {"step": smoke_planted.SharpenedLossInHalf()}, ["precision"], "S005",
         lambda f: f"first non-finite: {f.data.get('first_nonfinite_phase')} "
         f"({f.data.get('first_nonfinite_op')})", "named"),
        ("forward via model.module", llama, {"step": smoke_planted.ForwardThroughModule()},
         ["contract"], "S012", lambda f: f"broken: {', '.join(f.data['broken'])}", "named"),
        ("init std 1.0", _factory("example", tmp, initializer_range=1.0), {}, ["init_health"],
         "S009", lambda f: f"×{f.data['amplification']:.3g}/×{f.data['param_grad_spread']:.3g}",
         f"≤ ×{TOL.init_amplification:g}/×{TOL.init_grad_spread:g}"),
    ]
    rows = []
    for name, factory, kwargs, checks, code, show, limit in cases:
        report = run_smoke(factory, checks=checks, **kwargs)
        found = [f for f in report.findings if f.code == code]
        caught = any(f.data.get("status") == "fail" for f in found)
        worst = next((f for f in found if f.data.get("status") == "fail"), found[0])
        rows.append([name, code, show(worst), limit, "caught" if caught else "MISSED"])
    return rows


def _table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default=",".join(("example", *ARCHS, "tinylm")))
    args = parser.parse_args()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        start = time.perf_counter()
        report = run_smoke(_factory("example", tmp))
        total = time.perf_counter() - start
        times = ", ".join(f"{o.name} {o.seconds:.2f}s" for o in report.outcomes)
        print(f"example, all checks: {total:.1f} s ({times}); exit {report.exit_code()}\n")
        head = [
            "toy", "S001 drop", "S002 pairs/keys", "S003 GA", "S004 ckpt",
            "S005 bf16 cos/rel", "S005 fp16 cos/rel", "S006 max act", "S007 DP",
            "S009 amp/spread", "S010 act MiB meas/est", "verdict",
        ]
        rows = [correct_row(a, tmp) for a in args.arch.split(",") if a]
        print("correct code:\n" + _table(head, rows) + "\n")
        print("planted bugs:\n" + _table(
            ["bug", "rule", "measured", "tolerance", "verdict"], planted_rows(tmp)
        ))


if __name__ == "__main__":
    main()
