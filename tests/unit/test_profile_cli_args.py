"""`spec-advisor profile`'s deployment flags reach the context it measures and records: a draft model's own
tensor-parallel degree (vLLM's draft_tensor_parallel_size) is part of the deployment the profile describes."""

from __future__ import annotations

import argparse

import pytest

from policies.model.measured_profile import drafter_degree
from service.cli.profile_command import ProfileCommandError, _context, add_profile_command

BASE = ("profile", "--url", "http://127.0.0.1:1", "--out", "p.json", "--hardware", "h100-sxm",
        "--model-profile", "llama-3.1-70b", "--tensor-parallel", "4")
DRAFT_MODEL = ("--drafter-method", "draft_model", "--draft-model-profile", "llama-3.2-1b")


def _args(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_profile_command(parser.add_subparsers())
    return parser.parse_args([*BASE, *extra])


def test_a_draft_model_runs_on_the_targets_gpus_unless_told_otherwise() -> None:
    assert drafter_degree(_context(_args(*DRAFT_MODEL))) == 4
    assert drafter_degree(_context(_args(*DRAFT_MODEL, "--draft-tensor-parallel", "1"))) == 1


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ((*DRAFT_MODEL, "--draft-tensor-parallel", "3"), "must be 1 or the target's tensor_parallel (4), got 3"),
        (("--drafter-method", "eagle3", "--draft-tensor-parallel", "1"), "applies to method draft_model only"),
    ],
)
def test_a_draft_degree_vllm_would_refuse_is_a_usage_error(extra: tuple[str, ...], message: str) -> None:
    with pytest.raises(ProfileCommandError, match=r"drafter\.tensor_parallel") as info:
        _context(_args(*extra))
    assert message in str(info.value)
    assert not str(info.value).startswith(":")  # a model-level error has no field path to print
