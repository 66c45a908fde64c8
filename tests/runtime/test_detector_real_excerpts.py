"""The detectors on more real public excerpts (tests/fixtures/SOURCES.md): what their
authors reported must be found by the cold-start and short-log paths, and the noise of
healthy runs must not be."""

from __future__ import annotations

from pathlib import Path

from sapper.logs import read_log
from sapper.pipeline.logs import analyze_logs
from sapper.runtime import DetectorSet, StepRecord
from sapper.runtime.detectors import ThroughputDetector

LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "logs"


def _found(name: str) -> list[tuple[str, int | None]]:
    (analysis,) = analyze_logs([read_log(LOGS / name)], None, [], [])
    return [(f.code, f.step) for f in analysis.findings]


def test_bloom_176b_first_spike_grad_norm_builds_up() -> None:
    # bf16, one iteration per line: grad norm 0.24 → 0.95 → 2.4 → 15.9 → 145 → 960, lm loss
    # 2.2 → 5.1 at 31219. The surge is seen when it passes 10× the short history's median.
    found = _found("bigscience/tr11-176B-spike-31216.log")
    assert ("R013", 31217) in found and ("R002", 31219) in found
    assert not {c for c, _ in found} & {"R030", "R031", "R032", "R033", "R001"}


def test_tr8b_104b_overflow_storm() -> None:
    # The scale falls 1048576 → 32768 over 17063-17068 while DeepSpeed skips steps (its
    # OVERFLOW! lines), with a spike at 17062: R002 and R030 (five halvings in six records,
    # with a held value between them), no GradScaler rule on the scaled DeepSpeed norm.
    found = _found("bigscience/tr8b-104B-overflow-17062.log")
    assert ("R002", 17062) in found
    assert any(c == "R030" and 17063 <= s <= 17070 for c, s in found)
    assert not {c for c, _ in found} & {"R032", "R033"}


def test_megatron_bert_fp16_start_calibrating_is_quiet() -> None:
    # Megatron-LM BERT fp16: the first iterations are skipped while the scale comes down
    # from 2^32; that is the scaler's search, not an overflow storm.
    assert _found("megatron-issues/nvidia-nccl-743-bert-fp16-start.log") == []


def test_step_time_growth_in_four_pasted_windows() -> None:
    # epfLLM/Megatron-LLM#11: 73 s per iteration at 102 growing to 130 s at 185, 16 lines
    # from four windows: too short for the rolling test, the short-log comparison fires.
    found = _found("megatron-issues/epfllm-megatron-llm-11-step-time-growth.log")
    assert [c for c, _ in found] == ["R061"]


def test_short_noisy_excerpt_ending_in_a_burst_is_quiet() -> None:
    # 20 steps of 20 ms, the last five three times slower: a burst, 0.3 s of wall time.
    records = [
        StepRecord(step=5000 + s, step_time_s=0.06 if s >= 15 else 0.02, tokens=4096)
        for s in range(20)
    ]
    assert DetectorSet([ThroughputDetector()]).run(records) == []


def test_whisper_tiny_noisy_loss_is_not_a_spike() -> None:
    # Whisper large-v2 fine-tune, 15000 steps: late training losses of 0.007-0.16 jump ×2-×5
    # between logs, batch noise at that level (the WER improves at every evaluation).
    found = _found("hf/whisper-large-v2-cgn-flemish.trainer_state.json")
    assert not {c for c, _ in found} & {"R002", "R001", "R030", "R040", "R061"}
