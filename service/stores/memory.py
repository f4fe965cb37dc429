"""The acceptance memory on disk: one JSON file in the state directory, replaced atomically and durably.

A save writes the whole memory to a fresh temporary file in the same directory, fsyncs it, `os.replace`s it over
the old file and fsyncs the directory, so after a crash (`kill -9`, power loss) at any moment the file is either the
previous complete version or the new complete version, never a mix. A file that cannot be read, is not valid
JSON, has an unknown `version` or a malformed entry is reported (a logged warning and the returned error) and
ignored: the advisor then starts with an empty memory, which costs it only the remembered acceptance.

Format (version 1):

    {"version": 1, "saved_at_s": 1767225600.0,
     "targets": {"<target name>": [{"model": "...", "per_position": [...], "per_position_low": [...],
                                     "per_position_high": [...], "drafts": 900.0, "mean_proposed_length": 3.0,
                                     "measured_at_s": 1767225000.0, "cold_start": false}, ...]}}
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from policies.estimate.memory import AcceptanceMemory, RememberedAcceptance
from service.logs import fields, get_logger

FORMAT_VERSION = 1
_TMP_PREFIX = ".acceptance-memory-"
_TMP_SUFFIX = ".tmp"


class MemoryFormatError(ValueError):
    """The file's content is not a memory this version can read; the message says where."""


@dataclass(frozen=True, slots=True)
class LoadResult:
    """What `MemoryStore.load` found: the memory per target name, and why the file was ignored (None = it wasn't,
    including when there is no file yet)."""

    memories: Mapping[str, AcceptanceMemory] = field(default_factory=dict)
    error: str | None = None


class MemoryStore:
    """Loads and saves the acceptance memory of every target in one JSON file at `path`."""

    def __init__(self, path: Path, *, logger: logging.Logger | None = None) -> None:
        self.path = Path(path)
        self._log = logger if logger is not None else get_logger("memory_store")

    def load(self) -> LoadResult:
        """The saved memories; an empty result (with `error` set unless the file is simply absent) otherwise.
        Never raises for a bad file: a corrupt memory must not stop the advisor."""
        self._remove_leftover_temporaries()
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return LoadResult()
        except (OSError, UnicodeDecodeError) as exc:
            return self._ignored(f"cannot read {self.path}: {exc}")
        try:
            return LoadResult(memories=decode(json.loads(text)))
        except MemoryFormatError as exc:
            return self._ignored(f"{self.path}: {exc}")
        except (ValueError, RecursionError) as exc:  # bad JSON, an integer past Python's digit limit, nesting
            return self._ignored(f"{self.path} is not valid JSON: {exc}")

    def save(self, memories: Mapping[str, AcceptanceMemory], *, now_s: float) -> None:
        """Replace the file with `memories` (target name -> memory), durably (module docstring). Raises OSError
        when the directory cannot be written; the previous file is then left as it was."""
        payload = json.dumps(encode(memories, now_s=now_s), indent=1, sort_keys=True, allow_nan=False)
        directory = self.path.parent
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=_TMP_PREFIX, suffix=_TMP_SUFFIX, dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(payload)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp_name, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp_name)
            raise
        _fsync_directory(directory)

    def _ignored(self, error: str) -> LoadResult:
        self._log.warning(
            "acceptance memory file ignored; starting with an empty memory",
            extra=fields(path=str(self.path), error=error),
        )
        return LoadResult(error=error)

    def _remove_leftover_temporaries(self) -> None:
        # A crash between mkstemp and os.replace leaves a temporary behind; it never holds the only copy.
        with contextlib.suppress(OSError):
            for leftover in self.path.parent.glob(f"{_TMP_PREFIX}*{_TMP_SUFFIX}"):
                with contextlib.suppress(OSError):
                    leftover.unlink()


def _fsync_directory(directory: Path) -> None:
    # The rename is durable only once the directory entry is on disk.
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def encode(memories: Mapping[str, AcceptanceMemory], *, now_s: float) -> dict[str, Any]:
    """The JSON document for `memories` (target name -> memory) saved at `now_s` (Unix seconds)."""
    return {
        "version": FORMAT_VERSION,
        "saved_at_s": now_s,
        "targets": {
            target: [
                {
                    "model": e.model,
                    "per_position": list(e.per_position),
                    "per_position_low": list(e.per_position_low),
                    "per_position_high": list(e.per_position_high),
                    "drafts": e.drafts,
                    "mean_proposed_length": e.mean_proposed_length,
                    "measured_at_s": e.measured_at_s,
                    "cold_start": e.cold_start,
                    "draft_coverage": e.draft_coverage,
                    "positions_measured": e.positions_measured,
                }
                for e in memory.entries
            ]
            for target, memory in sorted(memories.items())
        },
    }


def decode(document: Any) -> dict[str, AcceptanceMemory]:
    """Memories from a parsed document; raises MemoryFormatError naming the first bad field."""
    if not isinstance(document, dict):
        raise MemoryFormatError(f"top level must be an object, got {type(document).__name__}")
    version = document.get("version")
    if version != FORMAT_VERSION:
        raise MemoryFormatError(f"unknown version {version!r} (this build reads {FORMAT_VERSION})")
    targets = document.get("targets")
    if not isinstance(targets, dict):
        raise MemoryFormatError("'targets' must be an object")
    memories: dict[str, AcceptanceMemory] = {}
    for target, entries in targets.items():
        if not isinstance(entries, list):
            raise MemoryFormatError(f"targets.{target} must be a list")
        memory = AcceptanceMemory()
        for index, raw in enumerate(entries):
            memory = memory.with_entry(_entry(raw, where=f"targets.{target}[{index}]"))
        memories[str(target)] = memory
    return memories


def _entry(raw: Any, *, where: str) -> RememberedAcceptance:
    if not isinstance(raw, dict):
        raise MemoryFormatError(f"{where} must be an object")
    model = raw.get("model")
    if not isinstance(model, str) or not model:
        raise MemoryFormatError(f"{where}.model must be a non-empty string")
    positions = _ratios(raw.get("per_position"), where=f"{where}.per_position")
    low = _ratios(raw.get("per_position_low"), where=f"{where}.per_position_low")
    high = _ratios(raw.get("per_position_high"), where=f"{where}.per_position_high")
    if not positions or len(low) != len(positions) or len(high) != len(positions):
        raise MemoryFormatError(f"{where}: per_position and its bounds must be equally long and non-empty")
    cold = raw.get("cold_start", False)
    if not isinstance(cold, bool):
        raise MemoryFormatError(f"{where}.cold_start must be true or false")
    # Files written before the field existed hold vLLM's counted positions.
    measured = raw.get("positions_measured", True)
    if not isinstance(measured, bool):
        raise MemoryFormatError(f"{where}.positions_measured must be true or false")
    return RememberedAcceptance(
        model=model,
        per_position=positions,
        per_position_low=low,
        per_position_high=high,
        drafts=_number(raw.get("drafts"), where=f"{where}.drafts", minimum=0.0),
        mean_proposed_length=_number(raw.get("mean_proposed_length"), where=f"{where}.mean_proposed_length",
                                     minimum=0.0),
        measured_at_s=_number(raw.get("measured_at_s"), where=f"{where}.measured_at_s", minimum=0.0),
        cold_start=cold,
        draft_coverage=_coverage(raw.get("draft_coverage", 1.0), where=f"{where}.draft_coverage"),
        positions_measured=measured,
    )


def _coverage(value: Any, *, where: str) -> float:
    # Files written before the field existed lack it: every sequence-step drafted, as was then assumed.
    number = _number(value, where=where, minimum=0.0)
    if not 0.0 < number <= 1.0:
        raise MemoryFormatError(f"{where} must be in (0, 1], got {number!r}")
    return number


def _number(value: Any, *, where: str, minimum: float) -> float:
    try:
        number = float(value) if isinstance(value, int | float) and not isinstance(value, bool) else math.nan
    except OverflowError:  # an integer too large for a float
        number = math.inf
    if not math.isfinite(number) or number < minimum:
        shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:37]}..."
        raise MemoryFormatError(f"{where} must be a finite number >= {minimum:g}, got {shown}")
    return number


def _ratios(value: Any, *, where: str) -> tuple[float, ...]:
    if not isinstance(value, list):
        raise MemoryFormatError(f"{where} must be a list")
    numbers = tuple(_number(v, where=f"{where}[{i}]", minimum=0.0) for i, v in enumerate(value))
    if any(v > 1.0 for v in numbers):
        raise MemoryFormatError(f"{where} values must be in [0, 1]")
    return numbers
