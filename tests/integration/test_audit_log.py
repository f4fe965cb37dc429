"""The audit log's durability: records reported written survive `kill -9`, a torn tail is skipped and reported,
nothing before it is lost, and the bounded read-back."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

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
    assert result.report.corrupt_lines == 0 and result.report.torn_bytes == 0
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
