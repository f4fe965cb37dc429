"""The acceptance memory on disk: the loop saves and reloads it, a bad file is reported and ignored, and a process
killed with SIGKILL at random moments while saving never leaves a torn file."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from policies.advise import AdvisorConfig
from policies.decide.rule import DecideConfig
from policies.estimate.memory import AcceptanceMemory, RememberedAcceptance
from policies.estimate.window import EstimatorConfig
from policies.model.costmodel import ModelContext
from policies.model.profiles import drafter_for, hardware_by_name, model_by_name
from policies.types import DraftMethod, EngineSnapshot, GpuSnapshot, SpecDecodeCounters
from service.board import Board
from service.loop import AdvisorLoop, LoopConfig, LoopWiring, TargetSpec
from service.stores.memory import MemoryStore

T0 = 1_767_225_600.0
MODEL = "tiny"
REPO = Path(__file__).resolve().parents[2]


class CountingScraper:
    """A vLLM server speculating at k=3: each scrape adds 400 drafts, 280/200/120 accepted at positions 0/1/2."""

    def __init__(self, *, speculating: bool = True) -> None:
        self.scrapes = 0
        self.speculating = speculating

    async def scrape(self, now_s: float) -> dict[str, EngineSnapshot]:
        self.scrapes += 1
        n = float(self.scrapes)
        spec = SpecDecodeCounters(
            drafts=400 * n, draft_tokens=1200 * n, accepted_tokens=600 * n, accepted_per_position=(280 * n, 200 * n,
                                                                                                   120 * n)
        )
        return {
            MODEL: EngineSnapshot(
                taken_at_s=now_s,
                model_name=MODEL,
                engines=1,
                spec=spec if self.speculating else None,
                num_requests_running=2.0,
                num_requests_waiting=0.0,
                created_s=T0 - 10.0,
            )
        }


class NoGpu:
    async def read(self, now_s: float) -> GpuSnapshot:
        return GpuSnapshot(taken_at_s=now_s, source="absent")


def resolve(_model: str, _gpu: GpuSnapshot) -> ModelContext:
    target = model_by_name("llama-3.1-8b")
    return ModelContext(hardware=hardware_by_name("h100-sxm"), model=target, drafter=drafter_for(DraftMethod.NGRAM,
                                                                                                   target))


# The sidecar's own logger may have been configured (propagation off) by a CLI test earlier in the session; this one
# propagates to pytest's capture whatever ran before.
LOG = logging.getLogger("tests.memory_store")


def make_loop(store: MemoryStore | None, scraper: CountingScraper) -> AdvisorLoop:
    return AdvisorLoop(
        [TargetSpec(name="a", model=MODEL, scraper=scraper, resolve_context=resolve)],
        wiring=LoopWiring(gpu=NoGpu(), board=Board([("a", MODEL)], started_at_s=T0), memory_store=store, logger=LOG),
        config=LoopConfig(
            estimator=EstimatorConfig(window_s=60.0, min_drafts=200), interval_s=5.0,
            advisor=AdvisorConfig(decide=DecideConfig()),
        ),
    )


def run_ticks(loop: AdvisorLoop, times: list[float]) -> None:
    async def go() -> None:
        for now in times:
            await loop.run_once(now)

    asyncio.run(go())


def test_the_memory_survives_a_restart_of_the_loop(tmp_path: Path) -> None:
    path = tmp_path / "state" / "acceptance-memory.json"
    first = make_loop(MemoryStore(path), CountingScraper())
    assert first.memory_load_error is None  # no file yet is not an error
    # Scrape 1: lifetime counters (cold start, 400 drafts); scrape 2: a real 5 s window of 400 drafts.
    run_ticks(first, [T0, T0 + 5.0])
    remembered = first.memories()["a"].get(MODEL)
    assert remembered is not None
    # r = (280, 200, 120) / 400 = (0.7, 0.5, 0.3) per window, the same in every window.
    assert remembered.per_position == pytest.approx((0.7, 0.5, 0.3))
    assert path.exists()  # a new model is saved at once, without waiting for the throttle

    second = make_loop(MemoryStore(path), CountingScraper(speculating=False))
    assert second.memory_load_error is None
    assert second.memories() == first.memories()
    # Speculation is off after the restart: the decision is priced from what the first process remembered.
    run_ticks(second, [T0 + 65.0])
    status = second_board_decision(second)
    assert "remembered acceptance from 60 s ago (k=3" in status


def second_board_decision(loop: AdvisorLoop) -> str:
    board: Board = loop._board  # the loop publishes here; reading it back is what the API does
    status = board.get("a")
    assert status is not None and status.decision is not None
    return status.decision.reason


def test_saves_are_throttled_but_a_flush_writes_the_latest(tmp_path: Path) -> None:
    path = tmp_path / "acceptance-memory.json"
    loop = make_loop(MemoryStore(path), CountingScraper())
    run_ticks(loop, [T0, T0 + 5.0])
    saved_at = json.loads(path.read_text())["saved_at_s"]
    # 10 s later the memory changed (a newer window) but the once-a-minute throttle holds the save back...
    run_ticks(loop, [T0 + 10.0])
    assert json.loads(path.read_text())["saved_at_s"] == saved_at
    # ...until it is flushed (shutdown), or a minute has passed.
    asyncio.run(loop.flush_memory(T0 + 11.0))
    document = json.loads(path.read_text())
    assert document["saved_at_s"] == T0 + 11.0
    assert document["targets"]["a"][0]["measured_at_s"] == T0 + 10.0


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        json.dumps({"version": 99, "targets": {}}),
        json.dumps({"version": 1, "targets": {"a": [{}]}}),
        '{"version": 1, "saved_at_s": ' + "9" * 5000 + ', "targets": {}}',  # past Python's int digit limit
        json.dumps({"version": 1, "targets": {"a": [{
            "model": "m", "per_position": [0.5], "per_position_low": [0.4], "per_position_high": [0.6],
            "drafts": 10**400, "mean_proposed_length": 1.0, "measured_at_s": 1.0,  # finite JSON, no float
        }]}}),
    ],
    ids=["not-json", "unknown-version", "bad-entry", "endless-integer", "integer-past-float"],
)
def test_a_bad_file_is_reported_and_ignored(tmp_path: Path, content: str, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "acceptance-memory.json"
    path.write_text(content)
    loop = make_loop(MemoryStore(path, logger=LOG), CountingScraper())
    assert loop.memory_load_error is not None and str(path) in loop.memory_load_error
    assert loop.memories() == {"a": AcceptanceMemory()}
    assert "acceptance memory file ignored" in caplog.text
    # The loop still runs, and its first save replaces the bad file with a good one.
    run_ticks(loop, [T0, T0 + 5.0])
    assert MemoryStore(path).load().error is None


def test_an_unwritable_state_directory_is_logged_not_fatal(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the state directory should be")
    loop = make_loop(MemoryStore(blocker / "acceptance-memory.json"), CountingScraper())
    run_ticks(loop, [T0, T0 + 5.0, T0 + 10.0])
    assert "acceptance memory not saved" in caplog.text
    assert loop.memories()["a"].get(MODEL) is not None  # kept in memory all the same


# ------------------------------------------------------------------------------------------------------------
# kill -9 while saving
# ------------------------------------------------------------------------------------------------------------

# Saves version i (drafts = i) in a tight loop, printing i once save() has returned; starts after the version it
# finds on disk, so each restart continues the sequence.
WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from policies.estimate.memory import AcceptanceMemory, RememberedAcceptance
    from service.stores.memory import MemoryStore

    store = MemoryStore(Path(sys.argv[1]))
    loaded = store.load()
    assert loaded.error is None, loaded.error
    found = loaded.memories.get("a")
    entry = found.get("m") if found is not None else None
    i = int(entry.drafts) if entry is not None else 0
    r = tuple(0.9 ** (p + 1) for p in range(8))
    while True:
        i += 1
        memory = AcceptanceMemory(entries=(
            RememberedAcceptance(model="m", per_position=r, per_position_low=r, per_position_high=r,
                                 drafts=float(i), mean_proposed_length=8.0, measured_at_s=float(i)),
        ))
        store.save({"a": memory, "b": memory}, now_s=float(i))
        print(i, flush=True)
    """
)


def test_kill_9_at_random_moments_never_leaves_a_torn_file(tmp_path: Path) -> None:
    path = tmp_path / "acceptance-memory.json"
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    rng = random.Random(20260101)
    last_seen = 0
    for _ in range(8):
        child = subprocess.Popen(
            [sys.executable, str(script), str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )
        assert child.stdout is not None
        # Wait for the first acknowledged save (not a guess at how long Python takes to start): from here on it is
        # saving, and the random sleep picks the moment of the kill, not whether the writer got going at all.
        first = child.stdout.readline()
        if not first.strip():
            child.wait()
            raise AssertionError(f"the writer exited before its first save: {child.stderr.read().decode()}"
                                 if child.stderr is not None else "the writer exited before its first save")
        time.sleep(rng.uniform(0.0, 0.3))  # a random moment mid-save, not a timing assertion
        os.kill(child.pid, signal.SIGKILL)
        out, err = child.communicate()
        assert child.returncode == -signal.SIGKILL, err.decode()
        acknowledged = [int(line) for line in (first + out).split()]
        result = MemoryStore(path).load()
        assert result.error is None  # always a complete, parseable version
        entry = result.memories["a"].get("m")
        assert entry is not None
        on_disk = int(entry.drafts)
        # The last version save() returned for, or the next one if the kill came after its rename.
        assert on_disk in (acknowledged[-1], acknowledged[-1] + 1)
        assert on_disk > last_seen
        assert result.memories["b"] == result.memories["a"]  # both targets from the same version
        last_seen = on_disk
    # Temporaries a kill left behind are swept at load.
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".acceptance-memory-")] == []


def test_encode_decode_round_trip(tmp_path: Path) -> None:
    r = (0.8, 0.55)
    entry = RememberedAcceptance(
        model="m", per_position=r, per_position_low=(0.7, 0.5), per_position_high=(0.9, 0.6), drafts=321.0,
        mean_proposed_length=1.9, measured_at_s=T0, cold_start=True,
    )
    store = MemoryStore(tmp_path / "m.json")
    store.save({"x": AcceptanceMemory(entries=(entry,))}, now_s=T0)
    assert store.load().memories == {"x": AcceptanceMemory(entries=(entry,))}
