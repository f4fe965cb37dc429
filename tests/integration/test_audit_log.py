"""The audit log's durability: records reported written survive `kill -9`, a torn tail is skipped and reported,
nothing before it is lost, and the bounded read-back."""

from __future__ import annotations

import errno
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from service.actuators import audit as audit_module
from service.actuators.audit import AuditLog, SkipThrottle, read_tail

REPO = Path(__file__).resolve().parents[2]

# Appends records as fast as it can and prints each sequence number only after `append` (write + fsync) returned.
WRITER = """
import sys
from pathlib import Path
from service.actuators.audit import AuditLog

log = AuditLog(Path(sys.argv[1]))
log.open()
run = int(sys.argv[2])
seq = 0
while True:
    log.append({"run": run, "seq": seq, "kind": "skip", "detail": "x" * (seq % 700)})
    print(seq, flush=True)
    seq += 1
"""


def test_every_record_reported_written_survives_kill_9_at_random_moments(tmp_path: Path) -> None:
    path = tmp_path / "state" / "actions.jsonl"
    rng = random.Random(20240601)
    reported: set[tuple[int, int]] = set()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for run in range(6):
        with subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path), str(run)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO, env=env, text=True,
        ) as proc:
            assert proc.stdout is not None
            first = proc.stdout.readline()  # it is writing now
            assert first.strip() == "0", proc.stderr.read() if proc.stderr else ""
            time.sleep(rng.uniform(0.0, 0.25))  # a random moment, not a timing assertion
            proc.send_signal(signal.SIGKILL)
            rest = proc.stdout.read()
            proc.wait()
            assert proc.returncode == -signal.SIGKILL
        reported |= {(run, int(line)) for line in [first, *rest.splitlines()] if line.strip()}

    result = read_tail(path, max_bytes=1 << 30)
    found = {(r["run"], r["seq"]) for r in result.records}
    assert reported <= found  # nothing that fsync acknowledged is missing
    # A kill can still tear the record being written when its write() spans a page boundary (Linux checks for a
    # fatal signal between pages, a short write): the next open ends that fragment with a newline, so it reads as
    # one skipped line, and the last run's may be left as a torn tail. At most one such piece per kill, and never
    # a record that was reported (above).
    assert result.report.corrupt_lines + (1 if result.report.torn_bytes else 0) <= 6
    # Each run's records are in order and without gaps up to its last (it may have written one more than reported).
    for run in range(6):
        seqs = [r["seq"] for r in result.records if r["run"] == run]
        assert seqs == list(range(len(seqs)))


def test_a_torn_tail_is_reported_skipped_and_the_next_record_starts_a_clean_line(tmp_path: Path) -> None:
    path = tmp_path / "actions.jsonl"
    log = AuditLog(path)
    log.open()
    log.append({"seq": 1})
    log.append({"seq": 2})
    log.close()
    with path.open("ab") as handle:  # a crash in the middle of writing record 3
        handle.write(b'{"seq": 3, "deta')

    reopened = AuditLog(path)
    report = reopened.open()
    assert report.torn_bytes == len(b'{"seq": 3, "deta') and report.records == 2
    assert [r["seq"] for r in reopened.recent(10)] == [1, 2]
    reopened.append({"seq": 4})
    reopened.close()

    result = read_tail(path)
    assert [r["seq"] for r in result.records] == [1, 2, 4]  # nothing before the torn line lost
    assert result.report.corrupt_lines == 1 and result.report.torn_bytes == 0  # the torn line, now terminated


def test_recent_is_bounded_and_filters_by_target(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "a.jsonl", tail_records=5)
    log.open()
    for seq in range(8):
        log.append({"seq": seq, "target": "a" if seq % 2 else "b"})
    # Only the last 5 (3..7) are kept in memory; of those, target "a" has 3, 5, 7.
    assert [r["seq"] for r in log.recent(100)] == [3, 4, 5, 6, 7]
    assert [r["seq"] for r in log.recent(2, target="a")] == [5, 7]
    log.close()
    reread = AuditLog(tmp_path / "a.jsonl", tail_records=3)
    reread.open()
    assert [r["seq"] for r in reread.recent(100)] == [5, 6, 7]
    reread.close()


def test_skip_throttle_writes_a_new_reason_at_once_and_a_repeated_one_once_per_interval() -> None:
    throttle = SkipThrottle(interval_s=600)
    assert throttle.should_write("a", "cooldown", 0.0)
    assert not throttle.should_write("a", "cooldown", 599.0)
    assert throttle.should_write("a", "dwell", 600.0)  # new reason
    assert throttle.should_write("a", "cooldown", 601.0)  # changed back: new again
    assert not throttle.should_write("a", "cooldown", 1200.0)  # 1200 - 601 = 599 < 600
    assert throttle.should_write("a", "cooldown", 1201.0)  # 600
    assert throttle.should_write("b", "cooldown", 1201.0)  # per target
    throttle.reset("a")
    assert throttle.should_write("a", "cooldown", 1202.0)


def test_a_write_that_fails_part_way_never_glues_the_next_record_to_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "actions.jsonl"
    log = AuditLog(path)
    log.open()
    log.append({"seq": 1})
    real_write = os.write
    calls = 0

    def disk_fills_up(fd: int, data: bytes | memoryview) -> int:
        # The kernel takes half of the record, then the disk is full (what ENOSPC mid-record looks like).
        nonlocal calls
        calls += 1
        if calls == 1:
            return real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", disk_fills_up)
    with pytest.raises(OSError):
        log.append({"seq": 2, "detail": "lost to a full disk"})
    monkeypatch.setattr(os, "write", real_write)  # space was freed
    log.append({"seq": 3})
    log.close()

    result = read_tail(path)
    # Record 3 is on a line of its own: the half of record 2 is one corrupt line, not a prefix of record 3.
    assert [r["seq"] for r in result.records] == [1, 3]
    assert result.report.corrupt_lines == 1 and result.report.torn_bytes == 0


def test_gate_records_come_from_the_whole_file_however_long(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(audit_module, "_STREAM_CHUNK_BYTES", 100)  # many chunk boundaries inside records
    path = tmp_path / "actions.jsonl"
    day = 86400.0
    log = AuditLog(path, tail_records=10)
    log.open()
    log.append({"at_s": 0.0, "kind": "pause", "target": "a"})
    log.append({"at_s": 1.0, "kind": "override", "target": "a", "expires_at_s": 5 * day})
    log.append({"at_s": 2.0, "kind": "action", "target": "a", "result": "applied"})
    log.append({"at_s": 3.0, "kind": "resume", "target": "b"})
    for i in range(300):
        log.append({"at_s": 10.0 + i, "kind": "skip", "target": "a", "detail": "x" * (i % 50)})
    # A day and a bit later: the action at 2 is now more than a day older than the newest action of "a".
    log.append({"at_s": day + 5.0, "kind": "action_started", "target": "a"})
    log.append({"at_s": day + 5.0, "kind": "action", "target": "a", "result": "applied"})
    log.close()

    reopened = AuditLog(path, tail_records=10)
    report = reopened.open()
    assert report.records == 306 and report.corrupt_lines == 0 and report.torn_bytes == 0  # 4 + 300 + 2
    assert len(reopened.recent(500)) == 10  # GET /v1/actions keeps its bounded tail
    kept = [(r["kind"], r["target"], r["at_s"]) for r in reopened.gate_records()]
    # day + 5 - 2 >= one day: the old action is dropped; the pause, the override and b's resume stay.
    assert kept == [("pause", "a", 0.0), ("override", "a", 1.0), ("resume", "b", 3.0),
                    ("action_started", "a", day + 5.0), ("action", "a", day + 5.0)]
    # Records appended after opening count too, and a later command replaces the earlier one.
    reopened.append({"at_s": day + 6.0, "kind": "resume", "target": "a"})
    assert [r["kind"] for r in reopened.gate_records() if r["target"] == "a"] == [
        "override", "action_started", "action", "resume"]
    reopened.close()
