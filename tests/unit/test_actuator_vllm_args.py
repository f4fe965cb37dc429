"""Reading and editing vLLM's speculative config in a container's command/args: every form, refusals, round trips."""

from __future__ import annotations

import json
import shlex
from typing import Any

import pytest

from policies.act.deployment import ActuatorError, SpeculationSetting
from service.actuators.vllm_args import (
    ArgsError,
    config_for,
    read_vllm_command,
    select_vllm_container,
    setting_from_config,
    shell_words,
    vllm_bands,
    with_speculative_config,
)

SPEC: dict[str, Any] = {"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "num_speculative_tokens": 3}
SPEC_JSON = json.dumps(SPEC)
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
OTHER = ["--port", "8000", "--max-num-seqs", "256", "--served-model-name=llama", "--gpu-memory-utilization", "0.9"]


def k(config: dict[str, Any], value: int) -> dict[str, Any]:
    return {**config, "num_speculative_tokens": value}


# ----------------------------------------------------------------------------------------------------------------
# Reading every form
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "args"),
    [
        (["vllm", "serve"], [MODEL, *OTHER, "--speculative-config", SPEC_JSON]),
        (["vllm", "serve"], [MODEL, "--speculative-config=" + SPEC_JSON, *OTHER]),
        (["vllm", "serve"], [MODEL, "--speculative_config", SPEC_JSON, *OTHER]),
        (["vllm", "serve", MODEL, "--speculative-config", SPEC_JSON, *OTHER], []),
        ([], [MODEL, *OTHER, "--speculative-config", SPEC_JSON]),  # the vllm-openai image's entrypoint
        (["/usr/local/bin/vllm"], ["serve", MODEL, "--speculative-config", SPEC_JSON]),
        (["vllm", "serve"], [MODEL, "--speculative-config.method", "eagle3", "--speculative-config.model",
                             SPEC["model"], "--speculative-config.num_speculative_tokens", "3"]),
        (["vllm", "serve"], [MODEL, "--speculative-config.method=eagle3", f"--speculative_config.model={SPEC['model']}",
                             "--speculative-config.num_speculative_tokens=3"]),
    ],
)
def test_every_exec_form_reads_the_same_config_and_model(command: list[str], args: list[str]) -> None:
    read = read_vllm_command(command, args)
    assert read.speculative_config == SPEC
    assert read.model == MODEL
    assert not read.shell
    assert setting_from_config(read.speculative_config) == SpeculationSetting(3)


def test_python_module_form_reads_the_model_from_dash_dash_model() -> None:
    command = ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    read = read_vllm_command(command, ["--model", MODEL, "--speculative-config", SPEC_JSON])
    assert (read.model, read.speculative_config) == (MODEL, SPEC)
    assert read_vllm_command(command, [f"--model={MODEL}"]).model == MODEL


def test_no_speculative_config_reads_as_off() -> None:
    read = read_vllm_command(["vllm", "serve"], [MODEL, *OTHER])
    assert read.speculative_config is None and read.form == "absent"
    assert setting_from_config(None) == SpeculationSetting(0)


def test_a_shell_string_reads_like_the_shell_would() -> None:
    script = f"exec vllm serve {MODEL} \\\n  --port 8000 \\\n  --speculative-config '{SPEC_JSON}'\n"
    for command, args in ((["/bin/sh", "-c", script], []), (["bash", "-ec"], [script])):
        read = read_vllm_command(command, args)
        assert (read.shell, read.model, read.speculative_config) == (True, MODEL, SPEC)


def test_dynamic_sd_bands_read_as_ascending_end_and_k() -> None:
    config = {**SPEC, "num_speculative_tokens_per_batch_size": [[65, 128, 1], [1, 64, 3], [129, 512, 0]]}
    # [start, end, K] sorted by start: [1-64: 3], [65-128: 1], [129-512: 0] -> (end, K) pairs.
    assert setting_from_config(config) == SpeculationSetting(3, schedule=((64, 3), (128, 1), (512, 0)))


# ----------------------------------------------------------------------------------------------------------------
# Refusals
# ----------------------------------------------------------------------------------------------------------------


def reason(command: list[str], args: list[str]) -> ActuatorError:
    with pytest.raises(ArgsError) as caught:
        read_vllm_command(command, args)
    assert caught.value.detail
    return caught.value.reason


@pytest.mark.parametrize(
    "args",
    [
        [MODEL, "--speculative-config", "{'method': 'eagle3'}"],  # Python, not JSON
        [MODEL, "--speculative-config", "[3]"],  # JSON, not an object
        [MODEL, "--speculative-config"],  # no value
        [MODEL, "--speculative-config", SPEC_JSON, "--speculative-config", SPEC_JSON],  # twice: ambiguous
        [MODEL, "--speculative-config", SPEC_JSON, "--speculative-config.num_speculative_tokens", "2"],  # mixed
        [MODEL, "--speculative-config.num_speculative_tokens", "2", "--speculative-config.num_speculative_tokens", "3"],
        [MODEL, "--speculative-config.num_speculative_tokens_per_batch_size+", "1,2"],  # list append
    ],
)
def test_malformed_or_ambiguous_args_are_refused(args: list[str]) -> None:
    assert reason(["vllm", "serve"], args) is ActuatorError.MALFORMED_ARGS


@pytest.mark.parametrize(
    ("script", "why"),
    [
        (f"vllm serve {MODEL} --speculative-config '{SPEC_JSON}'; echo done", "';'"),
        (f"cd /models && vllm serve {MODEL}", "'&'"),
        (f"vllm serve {MODEL} | tee /tmp/log", "'|'"),
        (f"vllm serve {MODEL} --port $PORT", "'$'"),
        (f'vllm serve {MODEL} --port "${{PORT}}"', "'$'"),
        (f"vllm serve `cat /model-name` {MODEL}", "'`'"),
        (f"vllm serve {MODEL} > /tmp/log", "'>'"),
        (f"vllm serve {MODEL} --speculative-config '{SPEC_JSON}'\nsleep 1", "several lines"),
        (f"vllm serve {MODEL} --speculative-config '" + '{"method": "eagle3"}', "not closed"),
        (f"vllm serve /models/* {MODEL}", "'*'"),
        ("python /app/start.py", "does not run"),
    ],
)
def test_shell_strings_that_are_not_one_simple_command_are_refused_with_why(script: str, why: str) -> None:
    with pytest.raises(ArgsError) as caught:
        read_vllm_command(["/bin/sh", "-c", script], [])
    assert caught.value.reason is ActuatorError.MALFORMED_ARGS
    assert why in caught.value.detail
    assert "--speculative-config '<json>'" in caught.value.detail  # says which form to use instead


def test_a_wrapper_command_is_refused_because_it_may_ignore_edited_args() -> None:
    assert reason(["/app/entrypoint.sh"], [MODEL, "--speculative-config", SPEC_JSON]) is ActuatorError.MALFORMED_ARGS


@pytest.mark.parametrize("args", [
    [MODEL, "--config", "/etc/vllm/serve.yaml"],
    [MODEL, "--config=/etc/vllm/serve.yaml", "--speculative-config", SPEC_JSON],
    [MODEL, "--speculative-config", SPEC_JSON, "--config", "serve.yaml"],
])
def test_a_config_file_is_refused_since_it_may_set_speculative_config_unseen(args: list[str]) -> None:
    with pytest.raises(ArgsError) as caught:
        read_vllm_command(["vllm", "serve"], args)
    assert caught.value.reason is ActuatorError.MALFORMED_ARGS
    assert "--config" in caught.value.detail and "YAML" in caught.value.detail
    with pytest.raises(ArgsError):  # and nothing is edited either
        with_speculative_config(["vllm", "serve"], args, k(SPEC, 4))


def test_config_without_an_integer_k_or_with_bad_bands_is_malformed() -> None:
    for config in ({"method": "mtp"}, {**SPEC, "num_speculative_tokens": "3"},
                   {**SPEC, "num_speculative_tokens_per_batch_size": [[1, 64]]},
                   {**SPEC, "num_speculative_tokens_per_batch_size": {"1": 3}}):
        with pytest.raises(ArgsError) as caught:
            setting_from_config(config)
        assert caught.value.reason is ActuatorError.MALFORMED_ARGS


def test_shell_words_match_shlex_and_give_exact_spans() -> None:
    script = 'exec vllm serve "my model" --x=\'a b\' \\\n --y "q\\"q"'
    words = shell_words(script)
    assert [w for w, _, _ in words] == shlex.split(script.replace("\\\n", ""))
    assert [script[s:e] for _, s, e in words][3:] == ['"my model"', "--x='a b'", "--y", '"q\\"q"']


# ----------------------------------------------------------------------------------------------------------------
# Editing: off, on, gamma change; every other word kept
# ----------------------------------------------------------------------------------------------------------------


def test_turning_off_removes_both_items_and_keeps_everything_else_in_order() -> None:
    args = [MODEL, "--port", "8000", "--speculative-config", SPEC_JSON, "--max-num-seqs", "256"]
    command, new_args = with_speculative_config(["vllm", "serve"], args, None)
    assert command == ["vllm", "serve"]
    assert new_args == [MODEL, "--port", "8000", "--max-num-seqs", "256"]


def test_turning_off_the_equals_and_dotted_forms() -> None:
    _, args = with_speculative_config([], [MODEL, f"--speculative-config={SPEC_JSON}", *OTHER], None)
    assert args == [MODEL, *OTHER]
    dotted = [MODEL, "--speculative-config.method", "ngram", *OTHER, "--speculative-config.num_speculative_tokens=3"]
    _, args = with_speculative_config([], dotted, None)
    assert args == [MODEL, *OTHER]


def test_turning_on_appends_the_json_form_after_everything() -> None:
    command, args = with_speculative_config(["vllm", "serve"], [MODEL, *OTHER], SPEC)
    assert command == ["vllm", "serve"]
    assert args == [MODEL, *OTHER, "--speculative-config", SPEC_JSON]
    # With everything in command and no args, Kubernetes runs command + args: appending to args appends to argv.
    command, args = with_speculative_config(["vllm", "serve", MODEL], [], SPEC)
    assert (command, args) == (["vllm", "serve", MODEL], ["--speculative-config", SPEC_JSON])


def test_changing_gamma_keeps_the_form_spelling_and_key_order() -> None:
    for flag_items in (["--speculative-config", SPEC_JSON], ["--speculative_config", SPEC_JSON]):
        _, args = with_speculative_config([], [MODEL, *flag_items, *OTHER], k(SPEC, 5))
        assert args[:2] == [MODEL, flag_items[0]] and args[3:] == OTHER
        assert list(json.loads(args[2]).items()) == list(k(SPEC, 5).items())  # same keys, same order, k = 5
    _, args = with_speculative_config([], [MODEL, f"--speculative-config={SPEC_JSON}", *OTHER], k(SPEC, 1))
    assert args == [MODEL, f"--speculative-config={json.dumps(k(SPEC, 1))}", *OTHER]


def test_the_dotted_form_is_edited_one_key_in_place() -> None:
    dotted = [MODEL, "--speculative-config.method", "ngram", "--speculative-config.num_speculative_tokens", "3", *OTHER]
    config = {"method": "ngram", "num_speculative_tokens": 3}
    _, args = with_speculative_config([], dotted, k(config, 2))
    assert args == [MODEL, "--speculative-config.method", "ngram", "--speculative-config.num_speculative_tokens",
                    "2", *OTHER]
    bands = [[1, 64, 3], [65, 512, 0]]
    _, args = with_speculative_config([], dotted, {**config, "num_speculative_tokens_per_batch_size": bands})
    # The new key goes right after the last dotted argument, in the same (space-separated) form, compact JSON.
    assert args == [MODEL, "--speculative-config.method", "ngram", "--speculative-config.num_speculative_tokens",
                    "3", "--speculative-config.num_speculative_tokens_per_batch_size", "[[1,64,3],[65,512,0]]", *OTHER]
    assert read_vllm_command([], args).speculative_config == {**config, "num_speculative_tokens_per_batch_size": bands}


def test_a_dotted_change_it_cannot_express_key_by_key_is_refused() -> None:
    dotted = [MODEL, "--speculative-config.num_speculative_tokens", "3", "--speculative-config.extra.a", "1"]
    with pytest.raises(ArgsError) as caught:
        with_speculative_config([], dotted, {"num_speculative_tokens": 3, "extra": {"a": 2}})
    assert caught.value.reason is ActuatorError.MALFORMED_ARGS


def test_a_shell_string_is_edited_only_in_the_spans_of_the_speculative_config() -> None:
    head = f'exec vllm serve "{MODEL}" \\\n  --port 8000 \\\n  --served-model-name=\'llama 8b\''
    script = f"{head} \\\n  --speculative-config '{SPEC_JSON}' \\\n  --max-num-seqs 256\n"
    command = ["/bin/sh", "-c", script]
    (new_command, args) = with_speculative_config(command, [], None)
    assert args == [] and new_command[:2] == ["/bin/sh", "-c"]
    assert new_command[2] == f"{head} \\\n  --max-num-seqs 256\n"  # the rest byte for byte, quotes included
    (on_command, _) = with_speculative_config(new_command, [], k(SPEC, 4))
    k4, k2 = shlex.quote(json.dumps(k(SPEC, 4))), shlex.quote(json.dumps(k(SPEC, 2)))
    assert on_command[2] == f"{head} \\\n  --max-num-seqs 256 --speculative-config {k4}\n"
    (changed, _) = with_speculative_config(command, [], k(SPEC, 2))
    assert changed[2] == f"{head} \\\n  --speculative-config {k2} \\\n  --max-num-seqs 256\n"
    assert read_vllm_command(changed, []).speculative_config == k(SPEC, 2)


def test_the_script_in_args_is_edited_there() -> None:
    script = f"vllm serve {MODEL} --speculative-config='{SPEC_JSON}'"
    command, args = with_speculative_config(["sh", "-c"], [script, "ignored-dollar-zero"], None)
    assert command == ["sh", "-c"]
    assert args == [f"vllm serve {MODEL}", "ignored-dollar-zero"]


def test_round_trip_off_then_on_restores_the_config() -> None:
    original = [MODEL, "--speculative-config", SPEC_JSON, *OTHER]
    _, off = with_speculative_config([], original, None)
    _, on = with_speculative_config([], off, SPEC)
    assert read_vllm_command([], on).speculative_config == SPEC
    assert [a for a in on if a not in ("--speculative-config", SPEC_JSON)] == [MODEL, *OTHER]


# ----------------------------------------------------------------------------------------------------------------
# Settings -> config
# ----------------------------------------------------------------------------------------------------------------


def test_bands_start_at_batch_one_and_are_contiguous() -> None:
    # (8, 3), (32, 1), (256, 0): 1..8 -> 3, 9..32 -> 1, 33..256 -> 0.
    assert vllm_bands(((8, 3), (32, 1), (256, 0))) == [[1, 8, 3], [9, 32, 1], [33, 256, 0]]


def test_schedule_mode_writes_bands_and_k_is_their_maximum() -> None:
    desired = SpeculationSetting(1, schedule=((64, 4), (128, 2), (512, 0)))
    config = config_for(SPEC, desired, schedule=True)
    # max K over bands (4, 2, 0) is 4, whatever desired.num_speculative_tokens says.
    assert config == {**SPEC, "num_speculative_tokens": 4,
                      "num_speculative_tokens_per_batch_size": [[1, 64, 4], [65, 128, 2], [129, 512, 0]]}
    assert setting_from_config(config) == SpeculationSetting(4, schedule=desired.schedule)


def test_a_fixed_k_drops_any_bands() -> None:
    with_bands = {**SPEC, "num_speculative_tokens_per_batch_size": [[1, 64, 3]]}
    assert config_for(with_bands, SpeculationSetting(2), schedule=False) == k(SPEC, 2)


# ----------------------------------------------------------------------------------------------------------------
# Which container
# ----------------------------------------------------------------------------------------------------------------


VLLM = {"name": "engine", "image": "vllm/vllm-openai:v0.32.0", "args": [MODEL]}
ADVISOR = {"name": "spec-advisor", "image": "spec-advisor:1", "args": ["--config", "/etc/spec-advisor/config.yaml"]}


def test_container_by_name_only_one_or_the_one_running_vllm() -> None:
    assert select_vllm_container([ADVISOR, VLLM], "engine") is VLLM
    assert select_vllm_container([VLLM], None) is VLLM
    assert select_vllm_container([ADVISOR, VLLM], None) is VLLM
    shell = {"name": "s", "image": "base", "command": ["sh", "-c", f"vllm serve {MODEL}"]}
    assert select_vllm_container([ADVISOR, shell], None) is shell


@pytest.mark.parametrize(
    ("containers", "name"),
    [([ADVISOR, VLLM], "vllm"), ([ADVISOR, {**ADVISOR, "name": "other"}], None), ([VLLM, {**VLLM, "name": "b"}], None)],
)
def test_no_identifiable_vllm_container(containers: list[dict[str, Any]], name: str | None) -> None:
    with pytest.raises(ArgsError) as caught:
        select_vllm_container(containers, name)
    assert caught.value.reason is ActuatorError.NO_VLLM_CONTAINER
