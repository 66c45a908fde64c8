"""What the model a config.json describes holds, and how a checkpoint compares with it.

``sapper inspect CKPT --config config.json`` builds the config's causal LM on the meta
device (transformers' own classes: no memory, no weights) and reads off every tensor it
expects: names and shapes, which are parameters and which buffers, which are tied, and the
init its config plans (``initializer_range``). Against that a checkpoint can fail in ways
no per-tensor statistic shows, and which loaders do not stop on:

- K013, weights the model has and the checkpoint lacks (``from_pretrained`` initialises
  them at random and logs a line), or stored in another shape;
- K014, tensors the model does not have (dropped on load without a word);
- K015, weights far from the scale the config's init plans.

Names are compared the way transformers loads them: wrapper prefixes (``_orig_mod.``,
``module.``) stripped, the base model's prefix (``model.``) added or removed where that
fits better, the model's non-persistent buffers and ``_keys_to_ignore_on_load_*`` patterns
ignored, tied weights stored once; and in both forms a model can be saved in: its own
``state_dict()`` and what ``save_pretrained`` writes after reverting the weight conversions
(transformers 5 fuses MoE experts into one 3-D tensor in memory, keeps one tensor per
expert on disk).
"""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sapper.checkpoint.naming import parse_name, strip_wrappers
from sapper.checkpoint.numbers import checked_number
from sapper.checkpoint.rules import INIT_SCALE_OFF, MODEL_MISMATCH, UNEXPECTED_TENSORS
from sapper.checkpoint.tensorstats import TensorStats
from sapper.errors import InputError
from sapper.rules.model import Finding, Severity

__all__ = ["INIT_BAND", "Expected", "expected_model", "model_findings"]

#: K015 fires when a role's RMS is this many times the planned std away from it: at a
#: checkpoint known to be untrained (step 0) the init itself is off; at any other the
#: weights ran away (trained weights stay within a few times their init). The low side
#: also allows the 1/sqrt(2L) residual scaling many models apply to output projections.
INIT_BAND = {"untrained": 3.0, "trained": 20.0}
#: Share of the checkpoint's tensors whose names must match the model's for the
#: comparison to mean anything (below it the checkpoint names things otherwise).
MIN_MATCHED = 0.5
#: Names listed per finding.
LISTED = 8
#: Buffers that training updates (a norm's running statistics): never "should not change".
_RUNNING = re.compile(r"(?:running_mean|running_var|num_batches_tracked)$")


@dataclass
class Expected:
    """The tensors a config's model holds, in the forms it can be saved in."""

    file: str
    config: dict[str, Any]
    #: Each form: state-dict key -> shape (``state_dict()``, then ``save_pretrained``'s).
    forms: list[dict[str, tuple[int, ...]]]
    parameters: set[str]
    #: Every buffer name, non-persistent ones included (a file may still hold them).
    buffers: set[str]
    #: key -> the key it is tied to (the same tensor; stored once or twice).
    tied: dict[str, str]
    ignore_missing: list[str]
    ignore_unexpected: list[str]
    prefix: str
    init_std: float | None
    layers: int

    def resolve(self, keys: list[str]) -> dict[str, str]:
        """Checkpoint key -> the model's key it stands for, for the names that match."""
        return _aligned(self, {k: strip_wrappers(k) for k in keys})[1]

    def constant(self, name: str) -> bool:
        """The model's key ``name`` is a buffer training never writes (a rotary table, a
        mask), not a parameter or a norm's running statistics."""
        return name in self.buffers and not _RUNNING.search(name)


def expected_model(path: Path) -> Expected:
    """The model ``path`` (a config.json, or a folder holding one) describes; InputError
    (exit 2) when the file is not a config transformers can build a causal LM from."""
    from sapper.plan.readers.hf_config import transformers_config
    from sapper.plan.readers.hf_families import meta_causal_lm, quiet_transformers

    file = path / "config.json" if path.is_dir() else path
    cfg, raw = transformers_config(file)
    model = meta_causal_lm(cfg)
    if model is None:
        raise InputError(
            "transformers cannot build a model from this config (or it has more blocks "
            "than sapper builds on the meta device)",
            file=str(file),
            expected="a config.json transformers' AutoModelForCausalLM accepts",
        )
    state = model.state_dict()
    forms = [{k: tuple(v.shape) for k, v in state.items()}]
    try:
        from transformers.core_model_loading import revert_weight_conversion

        with quiet_transformers():
            saved = revert_weight_conversion(model, dict(state))
        saved_form = {k: tuple(v.shape) for k, v in saved.items()}
        if saved_form != forms[0]:
            forms.append(saved_form)
    except Exception:  # an older transformers, or a conversion that needs real tensors
        pass
    by_id: dict[int, str] = {}
    tied: dict[str, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in by_id:
            tied[name], tied[by_id[id(p)]] = by_id[id(p)], name
        else:
            by_id[id(p)] = name
    parameters = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    for form in forms[1:]:  # names a conversion gives parameters (experts.0.w1.weight)
        parameters |= {k for k in form if k not in forms[0]}
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    stds = ((a, getattr(text, a, None)) for a in ("initializer_range", "init_std"))
    std = next(
        (
            checked_number(v, file=str(file), field=a)  # an int past 1.8e308 is refused
            for a, v in stds
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
        ),
        None,
    )
    return Expected(
        file=str(file),
        config=raw,
        forms=forms,
        parameters=parameters,
        buffers={n for n, _ in model.named_buffers()},
        tied=tied,
        ignore_missing=list(getattr(model, "_keys_to_ignore_on_load_missing", None) or ()),
        ignore_unexpected=list(getattr(model, "_keys_to_ignore_on_load_unexpected", None) or ()),
        prefix=getattr(model, "base_model_prefix", "") or "",
        init_std=std if std is not None and math.isfinite(std) else None,
        layers=int(getattr(text, "num_hidden_layers", 0) or 0),
    )


def _aligned(
    expected: Expected, clean: dict[str, str]
) -> tuple[dict[str, tuple[str, tuple[int, ...]]], dict[str, str]]:
    """The form and prefix handling under which most checkpoint names are the model's:
    that form keyed by the checkpoint's naming (name -> (model key, shape)), and
    checkpoint key -> model key."""
    prefix = expected.prefix + "." if expected.prefix else ""
    renames = [lambda k: k]
    if prefix:
        renames += [
            lambda k: k.removeprefix(prefix),  # saved from the base model
            lambda k: prefix + k,  # a base model's checkpoint loaded into the LM
        ]
    best: tuple[int, dict, dict] = (-1, {}, {})
    for form in expected.forms:
        for rename in renames:
            keyed = {rename(k): (k, shape) for k, shape in form.items()}
            hits = sum(1 for c in clean.values() if c in keyed)
            if hits > best[0]:
                mapping = {key: keyed[c][0] for key, c in clean.items() if c in keyed}
                best = (hits, keyed, mapping)
    return best[1], best[2]


def _ignored(name: str, patterns: list[str]) -> bool:
    return any(re.search(p, name) for p in patterns)


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:LISTED])
    return shown + (f" and {len(names) - LISTED} more" if len(names) > LISTED else "")


def comparable(mapping: dict[str, str], tensors: int) -> bool:
    """Enough of the checkpoint's names are the model's for a comparison to mean anything."""
    return tensors > 0 and len(mapping) >= MIN_MATCHED * tensors


def match(
    expected: Expected, shapes: dict[str, tuple[int, ...]], file: str
) -> tuple[list[Finding], dict[str, str]]:
    """K013 and K014 for a checkpoint whose tensors have ``shapes``, and the names matched
    (checkpoint key -> model key). A checkpoint named in another scheme (Megatron's, an
    adapter's) gets one INFO finding saying the comparison could not be made."""
    clean = {k: strip_wrappers(k) for k in shapes}
    keyed, mapping = _aligned(expected, clean)
    if not comparable(mapping, len(shapes)):
        return [
            MODEL_MISMATCH.finding(
                f"only {len(mapping)} of the checkpoint's {len(shapes)} tensor names are "
                f"names of the model {expected.file} describes: the checkpoint names its "
                "tensors in another scheme (Megatron, an adapter), so it was not compared "
                "with the model",
                severity=Severity.INFO,
                fix="compare with the config of the framework that wrote the checkpoint",
                source=file,
                matched=len(mapping),
                tensors=len(shapes),
            )
        ], mapping
    stored = set(mapping.values())
    findings: list[Finding] = []
    missing = [
        name
        for name, (model_key, _) in keyed.items()
        if model_key not in stored
        and model_key not in expected.buffers
        and not (model_key in expected.tied and expected.tied[model_key] in stored)
        and not _ignored(model_key, expected.ignore_missing)
    ]
    reshaped = [
        f"{key} {list(shapes[key])} (model: {list(keyed[clean[key]][1])})"
        for key in shapes
        if clean[key] in keyed and tuple(shapes[key]) != tuple(keyed[clean[key]][1])
    ]
    if missing or reshaped:
        parts = []
        if missing:
            parts.append(
                f"{len(missing)} of the model's tensors are not in the checkpoint "
                f"({_listed(sorted(missing))}): loading initialises them at random"
            )
        if reshaped:
            parts.append(f"{len(reshaped)} are stored in another shape ({_listed(reshaped)})")
        findings.append(
            MODEL_MISMATCH.finding(
                "; ".join(parts) + f", against the model of {expected.file}",
                value=float(len(missing) + len(reshaped)),
                source=file,
                missing=sorted(missing)[:50],
                reshaped=reshaped[:50],
            )
        )
    # A buffer an older version kept per layer (``layers.0.self_attn.rotary_emb.inv_freq``)
    # is dropped on load like the model's own non-persistent ones.
    buffer_leaves = {b.rsplit(".", 1)[-1] for b in expected.buffers} - {"weight", "bias"}
    extra = sorted(
        key
        for key, c in clean.items()
        if c not in keyed
        and not _ignored(c, expected.ignore_unexpected)
        and c.rsplit(".", 1)[-1] not in buffer_leaves
    )
    if extra:
        findings.append(
            UNEXPECTED_TENSORS.finding(
                f"{len(extra)} tensors of the checkpoint are not in the model of "
                f"{expected.file} ({_listed(extra)}): loading drops them",
                value=float(len(extra)),
                source=file,
                unexpected=extra[:50],
            )
        )
    return findings, mapping


def init_findings(
    expected: Expected, stats: list[TensorStats], mapping: dict[str, str], untrained: bool
) -> list[Finding]:
    """K015: per role (the same weight in every layer; a tensor outside the layers on its
    own), the median RMS of the model's matrices against the config's planned std."""
    if expected.init_std is None:
        return []
    std = expected.init_std
    band = INIT_BAND["untrained" if untrained else "trained"]
    low = std / (band * math.sqrt(2 * max(expected.layers, 1)))
    groups: dict[str, list[TensorStats]] = defaultdict(list)
    for s in stats:
        if (
            mapping.get(s.key) in expected.parameters
            and s.floating
            and len(s.shape) >= 2
            and math.isfinite(s.rms)
            and s.rms > 0
        ):
            groups[parse_name(s.key).role].append(s)
    out = []
    for role, group in sorted(groups.items()):
        rms = statistics.median(s.rms for s in group)
        if low <= rms <= std * band:
            continue
        ratio = rms / std
        where = f"{role} ({len(group)} layers)" if len(group) > 1 else group[0].key
        out.append(
            INIT_SCALE_OFF.finding(
                f"{where}: RMS {rms:.3g} is {ratio:.3g}x the init std {std:g} that "
                f"{expected.file} plans ({'untrained checkpoint: ' if untrained else ''}"
                f"expected within {low / std:.2g}x-{band:g}x)",
                value=rms,
                threshold=std,
                source=group[0].file,
                tensor=group[0].key,
                role=role,
                ratio=ratio,
            )
        )
    return out


def model_findings(
    expected: Expected, stats: list[TensorStats], file: str, untrained: bool
) -> list[Finding]:
    """K013-K015 of one checkpoint's weights against the config's model."""
    found, mapping = match(expected, {s.key: tuple(s.shape) for s in stats}, file)
    if comparable(mapping, len(stats)):
        found += init_findings(expected, stats, mapping, untrained)
    return found
