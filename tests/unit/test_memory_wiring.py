"""Where the composition root keeps the acceptance memory (service.app.memory_store)."""

from __future__ import annotations

from pathlib import Path

from service.app import MEMORY_FILE_NAME, memory_store
from service.settings import load_settings

TARGET = {"name": "a", "url": "http://127.0.0.1:8000/metrics"}


def test_recommend_only_with_default_state_dir_keeps_memory_in_process() -> None:
    # The demo and a plain recommend-only sidecar must not need /var/lib/spec-advisor to exist.
    settings = load_settings(None, overrides={"targets": [TARGET]})
    assert memory_store(settings) is None


def test_an_explicit_state_dir_persists_the_memory_even_in_recommend_only(tmp_path: Path) -> None:
    settings = load_settings(None, overrides={"targets": [TARGET], "actuation": {"state_dir": str(tmp_path)}})
    store = memory_store(settings)
    assert store is not None
    assert store.path == tmp_path / MEMORY_FILE_NAME
    loaded = store.load()  # nothing saved yet: an empty memory, not an error
    assert loaded.error is None and not loaded.memories
