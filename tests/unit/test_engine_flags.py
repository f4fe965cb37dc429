"""The engine a Deployment runs against the one the advice priced: reading vLLM's flags from the args
(service/actuators/vllm_args.py), comparing them (policies/act/engine.py) and the gate's rule 5 hold."""

from __future__ import annotations

from dataclasses import replace

import pytest

from policies.act.deployment import DeploymentObservation, EngineFlags, SpeculationSetting
from policies.act.engine import engine_mismatch, priced_engine
from policies.act.gate import ActuationConfig, ActuationState, Override, SkipReason, gate_action
from policies.model.costmodel import ModelContext
from policies.model.profiles import drafter_for, hardware_by_name, model_by_name
from policies.types import DataState, Decision, DraftMethod
from service.actuators.vllm_args import engine_flags, read_vllm_command

T0 = 1_700_000_000.0


@pytest.mark.parametrize(("words", "expected"), [
    (["vllm", "serve", "m"], EngineFlags()),
    (["vllm", "serve", "m", "--tensor-parallel-size", "8"], EngineFlags(tensor_parallel_size=8)),
    (["vllm", "serve", "m", "-tp", "2", "--max_num_seqs=128"], EngineFlags(tensor_parallel_size=2, max_num_seqs=128)),
    (["vllm", "serve", "m", "-tp=2", "--tensor_parallel_size=4"], EngineFlags(tensor_parallel_size=4)),
    (["vllm", "serve", "m", "--max-num-batched-tokens=8192", "--max-num-seqs", "64"],
     EngineFlags(max_num_seqs=64, max_num_batched_tokens=8192)),
    # vLLM's human-readable integers for the token budget: lowercase decimal, uppercase binary.
    (["vllm", "serve", "m", "--max-num-batched-tokens", "16K"], EngineFlags(max_num_batched_tokens=16384)),
    (["vllm", "serve", "m", "--max-num-batched-tokens=25.6k"], EngineFlags(max_num_batched_tokens=25600)),
    (["vllm", "serve", "m", "-pp", "2", "-tp", " +4 "], EngineFlags(tensor_parallel_size=4, pipeline_parallel_size=2)),
    # argparse's abbreviations: a prefix of exactly one of these flags (two is ambiguous, and vLLM refuses it).
    (["vllm", "serve", "m", "--tensor-parallel", "8", "--max-num-b=4096", "--max-num", "7"],
     EngineFlags(tensor_parallel_size=8, max_num_batched_tokens=4096)),
    (["vllm", "serve", "m", "-t", "4", "-p=2"], EngineFlags(tensor_parallel_size=4, pipeline_parallel_size=2)),
    # argparse keeps the last of a repeated flag, unreadable or not.
    (["vllm", "serve", "m", "--max-num-seqs", "64", "--max-num-seqs", "32"], EngineFlags(max_num_seqs=32)),
    (["vllm", "serve", "m", "--max-num-seqs", "x", "--max-num-seqs", "32"], EngineFlags(max_num_seqs=32)),
])
def test_the_flags_are_read_in_every_spelling_vllm_accepts(words: list[str], expected: EngineFlags) -> None:
    assert engine_flags(words) == expected


def test_a_value_that_cannot_be_read_is_kept_as_unreadable_not_taken_as_absent() -> None:
    flags = engine_flags(["vllm", "serve", "m", "-tp", "$(TP)", "--max-num-seqs", "1k", "--max-num-batched-tokens",
                          "8.5K", "-pp"])
    assert (flags.tensor_parallel_size, flags.max_num_seqs, flags.max_num_batched_tokens) == (None, None, None)
    # --max-num-seqs is a plain int to vLLM (no suffixes); binary suffixes take whole numbers only.
    assert flags.unreadable == (("max_num_batched_tokens", "8.5K"), ("max_num_seqs", "1k"),
                                ("pipeline_parallel_size", ""), ("tensor_parallel_size", "$(TP)"))


def test_a_reference_that_may_hold_flags_makes_the_parallelism_unreadable() -> None:
    # Kubernetes expands a whole word too: `$(TP_ARGS)` can be a flag.
    assert engine_flags(["vllm", "serve", "m", "$(TP_ARGS)"], {"TP_ARGS": "--tensor-parallel-size=8"}) == (
        EngineFlags(tensor_parallel_size=8))
    # Left unexpanded (from a ConfigMap, say) where flags could stand: the parallelism is unknown.
    flags = engine_flags(["vllm", "serve", "m", "$(EXTRA_ARGS)", "--max-num-seqs", "64"])
    assert flags.max_num_seqs == 64 and flags.tensor_parallel_size is None
    assert flags.unreadable == (("pipeline_parallel_size", "$(EXTRA_ARGS)"), ("tensor_parallel_size", "$(EXTRA_ARGS)"))
    # As a flag's value, or as the model's positional, it cannot hold a flag.
    assert engine_flags(["vllm", "serve", "m", "--served-model-name", "$(NAME)"]).unreadable == ()
    assert read_vllm_command(["vllm", "serve"], ["$(MODEL)", "--port", "8000"]).engine == EngineFlags()


def test_env_references_are_expanded_as_kubernetes_does() -> None:
    env = {"TP": "2", "SEQS": "96"}
    flags = engine_flags(["vllm", "serve", "m", "-tp", "$(TP)", "--max-num-seqs=$(SEQS)"], env)
    assert flags == EngineFlags(tensor_parallel_size=2, max_num_seqs=96)
    # `$$` escapes the reference (the literal "$(TP)" reaches vLLM); an unknown name stays as written.
    assert engine_flags(["-tp", "$$(TP)"], env).unreadable == (("tensor_parallel_size", "$(TP)"),)
    assert engine_flags(["-tp", "$(GPUS)"], env).unreadable == (("tensor_parallel_size", "$(GPUS)"),)


def test_a_shell_string_and_the_image_entrypoint_are_read_too() -> None:
    shell = read_vllm_command(["/bin/sh", "-c", "exec vllm serve m --tensor-parallel-size 4 --max-num-seqs 96"], [])
    assert shell.engine == EngineFlags(tensor_parallel_size=4, max_num_seqs=96)
    entrypoint = read_vllm_command([], ["m", "-tp", "$(TP)"], {"TP": "2"})
    assert entrypoint.engine == EngineFlags(tensor_parallel_size=2)


def test_flags_are_integers_of_at_least_one() -> None:
    with pytest.raises(ValueError, match="max_num_seqs"):
        EngineFlags(max_num_seqs=0)


def _context(tp: int = 1, budget: float | None = None, seqs: float | None = None) -> ModelContext:
    model = model_by_name("llama-3.1-8b")
    return ModelContext(hardware=hardware_by_name("h100-sxm"), model=model,
                        drafter=drafter_for(DraftMethod.EAGLE, model), tensor_parallel=tp, step_token_budget=budget,
                        max_num_seqs=seqs)


def test_the_priced_engine_is_the_context_s_limits() -> None:
    assert priced_engine(_context()) == EngineFlags(tensor_parallel_size=1, pipeline_parallel_size=1)
    assert priced_engine(_context(2, 8192.0, 256.0)) == EngineFlags(2, 256, 8192, 1)
    assert priced_engine(_context(1, None, 128.5)).max_num_seqs is None  # no setting gives a fraction


def test_tensor_parallelism_is_always_compared_and_absent_means_one() -> None:
    one, two = EngineFlags(tensor_parallel_size=1), EngineFlags(tensor_parallel_size=2)
    assert engine_mismatch(EngineFlags(), one) is None
    assert engine_mismatch(EngineFlags(tensor_parallel_size=8), EngineFlags(tensor_parallel_size=8)) is None
    assert engine_mismatch(EngineFlags(), two) == (
        "the Deployment runs without --tensor-parallel-size (vLLM's 1), the advice is priced for 2 (set the "
        "target's tensor_parallel to 1)")
    assert engine_mismatch(EngineFlags(tensor_parallel_size=8), one) == (
        "the Deployment runs --tensor-parallel-size 8, the advice is priced for 1 (set the target's "
        "tensor_parallel to 8)")


def test_pipeline_stages_and_unreadable_parallelism_are_never_priced() -> None:
    one = EngineFlags(tensor_parallel_size=1)
    why = engine_mismatch(EngineFlags(pipeline_parallel_size=2), one)
    assert why is not None and "--pipeline-parallel-size 2: pipeline parallelism is not priced" in why
    assert engine_mismatch(EngineFlags(pipeline_parallel_size=1), one) is None
    why = engine_mismatch(EngineFlags(unreadable=(("tensor_parallel_size", "$(TP)"),)), one)
    assert why is not None and why.startswith("cannot read --tensor-parallel-size from the Deployment's args ('$(TP)')")
    assert "priced for" not in why  # the unreadable flag is not also taken as vLLM's default
    # An unreadable step limit matters only where the setting prices one.
    seqs = EngineFlags(unreadable=(("max_num_seqs", "x"),))
    assert engine_mismatch(seqs, one) is None
    assert engine_mismatch(seqs, EngineFlags(tensor_parallel_size=1, max_num_seqs=256)) is not None


def test_step_limits_are_compared_only_where_both_sides_give_one() -> None:
    # Unset in the settings (priced without the cap) or left to vLLM's default: nothing to compare.
    assert engine_mismatch(EngineFlags(max_num_seqs=128), EngineFlags(tensor_parallel_size=1)) is None
    assert engine_mismatch(EngineFlags(), EngineFlags(1, 256, 8192)) is None
    why = engine_mismatch(EngineFlags(4, 128, 4096), EngineFlags(2, 256, 4096))
    assert why is not None
    assert "--tensor-parallel-size 4" in why and "tensor_parallel to 4" in why
    assert "--max-num-seqs 128, the advice is priced for 256 (set the target's max_num_seqs to 128)" in why
    assert "max-num-batched-tokens" not in why


def _decision() -> Decision:
    return Decision(target="llama", model="m", state=DataState.OK, enabled=True, num_speculative_tokens=3,
                    expected_speedup=1.4, expected_speedup_low=1.3, expected_speedup_high=1.5, reason="on",
                    evaluated_at_s=T0)


def _observed(mismatch: str | None) -> DeploymentObservation:
    return DeploymentObservation(at_s=T0, setting=SpeculationSetting(0), rollout_in_progress=False,
                                 resource_version="7", engine=EngineFlags(2, None, None), engine_mismatch=mismatch)


def test_the_gate_holds_the_advice_back_but_not_an_override() -> None:
    config = ActuationConfig(dwell_s=300, cooldown_s=900)
    held = ActuationState(wanted=SpeculationSetting(3), wanted_since_s=T0 - 400)  # past the dwell
    plan, _ = gate_action(_decision(), _observed("tp differs"), SpeculationSetting(3), config=config, state=held,
                          now_s=T0)
    assert not plan.act and plan.skip is SkipReason.ENGINE_MISMATCH and plan.detail == "tp differs"
    plan, _ = gate_action(_decision(), _observed(None), SpeculationSetting(3), config=config, state=held, now_s=T0)
    assert plan.act
    override = Override(setting=SpeculationSetting(0, ()), expires_at_s=T0 + 60, reason="incident", set_at_s=T0)
    plan, _ = gate_action(_decision(), replace(_observed("tp differs"), setting=SpeculationSetting(3)),
                          SpeculationSetting(3), config=config, state=replace(held, override=override), now_s=T0)
    assert plan.act and plan.via_override
