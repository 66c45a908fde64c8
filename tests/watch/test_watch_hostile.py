"""Property test: ``sapper watch`` on damaged and hostile logs ends in bounded time with
its findings or one error line, never an unexpected exception.

The mutated logs of ``tests/logs/test_hostile_property.py`` are written in two parts
(the second appended after the first poll, often in the middle of a line), followed
by the watcher and closed, as a watch that hits its idle timeout does. Only a
:class:`SapperError` (the CLI's exit 2) may come out; the plain view prints one line per
event, with nothing raw from the log.
"""

from __future__ import annotations

import io
import json
import random
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.logs.hostile import CASE_LIMIT_S, LOGS, fast_settings, mutate_lines, time_limit

from sapper.errors import InputError, SapperError
from sapper.watch import Watcher, open_follower
from sapper.watch.follow import StreamFollower
from sapper.watch.live import PlainView

TEXT_LOGS = {
    "train.log": [x for x in (LOGS / "megatron-gpt345m-fp16.log").read_text().splitlines()
                  if "iteration" in x],
    "run.jsonl": (LOGS / "sapper-gpt2-healthy.jsonl").read_text().splitlines(),
    "history.csv": (LOGS / "wandb-history-lr-stuck.csv").read_text().splitlines(),
}
STATE = json.loads((LOGS / "hf-llama-sft" / "trainer_state.json").read_text())
_RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _watch(path: Path, parts: list[bytes]) -> None:
    """Follow ``path`` while ``parts`` are written one per poll; then close."""
    out = io.StringIO()
    with time_limit(CASE_LIMIT_S):
        try:
            watcher = Watcher(open_follower(path), idle_timeout=0,
                              sinks=[PlainView(out, status_every=0)])
            for part in parts:
                with path.open("ab") as fh:
                    fh.write(part)
                watcher.tick()
            watcher.close()
        except SapperError as exc:
            line = str(exc)
            assert "\n" not in line and len(line) < 2000, line
    assert not _RAW.search(out.getvalue().replace("\n", "")), ascii(out.getvalue()[-500:])


def _split(rng: random.Random, data: bytes) -> list[bytes]:
    cut = rng.randrange(len(data) + 1)
    return [data[:cut], data[cut:]]


@fast_settings(300)
@given(rng=st.randoms(use_true_random=False), name=st.sampled_from(sorted(TEXT_LOGS)))
def test_watch_text_logs(tmp_path_factory, rng: random.Random, name: str) -> None:
    lines = TEXT_LOGS[name]
    start = rng.randrange(1, max(2, len(lines) - 60))
    body = lines[:1] + lines[start : start + 60]
    mutated = mutate_lines(rng, body, f"watch {name}", keep=1, json_like=name.endswith("l"))
    data = ("\n".join(mutated) + "\n").encode("utf-8", errors="surrogatepass")
    path = tmp_path_factory.mktemp("w") / name
    _watch(path, _split(rng, data))


@fast_settings(60)
@given(rng=st.randoms(use_true_random=False))
def test_watch_trainer_states(tmp_path_factory, rng: random.Random) -> None:
    entries = STATE["log_history"][: rng.randrange(1, len(STATE["log_history"]) + 1)]
    text = json.dumps({**STATE, "log_history": entries}, indent=2)
    lines = mutate_lines(rng, text.splitlines(), "watch trainer_state", keep=1, json_like=True)
    folder = tmp_path_factory.mktemp("w")
    path = folder / "trainer_state.json"
    data = "\n".join(lines).encode("utf-8", errors="surrogatepass")
    _watch(path, [data])


@fast_settings(100)
@given(rng=st.randoms(use_true_random=False))
def test_watch_tensorboard_events(tmp_path_factory, rng: random.Random) -> None:
    """Real event bytes, damaged (bytes flipped, cut, inserted), appended in two parts:
    the follower checks each frame's length checksum before trusting it."""
    from tests.logs.test_hostile_property import RUNLOG, _events

    records = [json.loads(line) for line in RUNLOG[1:60]]
    data = bytearray(_events(records, rng))
    for _ in range(rng.randrange(1, 8)):
        pos = rng.randrange(len(data))
        if rng.random() < 0.5:
            data[pos] = rng.randrange(256)
        else:
            del data[pos : pos + rng.randrange(1, 24)]
    folder = tmp_path_factory.mktemp("tb")
    _watch(folder / "events.out.tfevents.1700000000.node1", _split(rng, bytes(data)))


def test_a_pipe_of_nul_bytes_ends_with_one_line(tmp_path):
    """``cat /dev/zero | sapper watch -``: no line ever comes; refused after 2 MiB."""
    stream = io.BytesIO(b"\x00" * (3 << 20))
    watcher = Watcher(StreamFollower(stream), idle_timeout=0, poll=0.01)
    with pytest.raises(InputError, match="no complete text line in the first"):
        watcher.run()
