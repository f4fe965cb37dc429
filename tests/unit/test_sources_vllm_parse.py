"""vLLM `/metrics` text -> EngineSnapshot, on real captures, hand-made pages and broken input.

Expected numbers are read off the fixture files (their header lines or the raw sample lines, quoted in comments),
never computed by the parser under test.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from policies.types import EngineSnapshot
from service.sources import names
from service.sources.errors import ScrapeError, ScrapeErrorReason
from service.sources.vllm import MAX_POSITIONS, parse_vllm_metrics

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
AFTER_30 = "vllm/vllm-0.32.0-cpu-ngram-k3-after-30-requests.txt"
IDLE = "vllm/vllm-0.32.0-cpu-ngram-k3-idle.txt"
DP2 = "vllm/synthetic-ngram-k5-dp2.txt"
EAGLE = "vllm/synthetic-eagle-k3.txt"
OLD_NAMES = "sources/vllm-0.10-old-names.txt"
T = 1_800_000_000.0
TINY = 'engine="0",model_name="tiny"'
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


def page(name: str) -> str:
    return (FIXTURES / name).read_text()


def only(text: str) -> EngineSnapshot:
    snapshots = parse_vllm_metrics(text, taken_at_s=T)
    assert len(snapshots) == 1
    return next(iter(snapshots.values()))


def replace_line(text: str, prefix: str, new_line: str | None) -> str:
    """Replace (or drop, with None) the one sample line starting with `prefix`."""
    lines = text.split("\n")
    hits = [i for i, line in enumerate(lines) if line.startswith(prefix)]
    assert len(hits) == 1, (prefix, len(hits))
    if new_line is None:
        del lines[hits[0]]
    else:
        lines[hits[0]] = new_line
    return "\n".join(lines)


def drop_lines(text: str, contains: str) -> str:
    kept = [line for line in text.split("\n") if contains not in line]
    assert len(kept) < len(text.split("\n")), contains
    return "\n".join(kept)


def reason_of(text: str) -> ScrapeErrorReason:
    with pytest.raises(ScrapeError) as caught:
        parse_vllm_metrics(text, taken_at_s=T)
    return caught.value.reason


# ---------------------------------------------------------------------------------------------------------------
# Real captures
# ---------------------------------------------------------------------------------------------------------------


def test_after_30_requests_capture_matches_its_header_and_raw_lines() -> None:
    snap = parse_vllm_metrics(page(AFTER_30), taken_at_s=T)["tiny"]
    assert snap.taken_at_s == T
    assert snap.model_name == "tiny"
    assert snap.engines == 1
    assert snap.spec is not None
    # Header: drafts=540 draft_tokens=1505 accepted=1415; raw per_pos lines: 515, 465, 435.
    assert snap.spec.drafts == 540
    assert snap.spec.draft_tokens == 1505
    assert snap.spec.accepted_tokens == 1415
    assert snap.spec.accepted_per_position == (515, 465, 435)
    assert snap.spec.deployed_k == 3  # num_speculative_tokens=3 in the header
    assert sum(snap.spec.accepted_per_position) == snap.spec.accepted_tokens  # 515 + 465 + 435 = 1415
    assert snap.num_requests_running == 0
    assert snap.num_requests_waiting == 0
    assert snap.kv_cache_usage_ratio == 0.0
    # cache_config_info label kv_cache_size_tokens="1048576" (= num_gpu_blocks 8192 x block_size 128).
    assert snap.kv_cache_capacity_tokens == 1_048_576
    assert snap.generation_tokens == 1920
    assert snap.prompt_tokens == 2945
    assert snap.estimated_flops == 0.0
    assert snap.estimated_read_bytes == 0.0
    # Earliest of the epoch families' _created: drafts 1.7962052104809506e+09 < prompt ...15338e+09 < generation.
    assert snap.created_s == 1.7962052104809506e09
    assert snap.naming == "vllm-v1"


def test_after_30_requests_histograms_are_read_with_cumulative_buckets() -> None:
    snap = only(page(AFTER_30))
    itl = snap.inter_token_latency
    assert itl is not None
    # Raw lines: _count 550.0, _sum 1.2031304589999081, every bucket 550 (all ITLs under 10 ms).
    assert itl.count == 550
    assert itl.sum == 1.2031304589999081
    assert itl.buckets[0] == (0.01, 550)
    assert itl.buckets[-1] == (math.inf, 550)
    assert len(itl.buckets) == 20  # 19 finite bounds + +Inf
    it = snap.iteration_tokens
    assert it is not None
    # Raw lines: _count 162, _sum 4353. Only the mean tokens per step is used, so its buckets are not read.
    assert (it.count, it.sum) == (162, 4353)
    assert it.buckets == ()


def test_idle_capture_has_all_positions_at_zero() -> None:
    snap = only(page(IDLE))
    assert snap.spec is not None
    # vLLM creates every position series at start-up: k=3 zeros before any request.
    assert snap.spec.accepted_per_position == (0, 0, 0)
    assert (snap.spec.drafts, snap.spec.draft_tokens, snap.spec.accepted_tokens) == (0, 0, 0)
    assert snap.inter_token_latency is not None
    assert snap.inter_token_latency.count == 0
    assert snap.kv_cache_capacity_tokens == 1_048_576


def test_data_parallel_capture_sums_both_engines() -> None:
    snap = parse_vllm_metrics(page(DP2), taken_at_s=T)["Qwen/Qwen3-8B"]
    assert snap.engines == 2
    assert snap.spec is not None
    assert snap.spec.drafts == 78_500  # 40000 + 38500
    assert snap.spec.draft_tokens == 385_500  # 196400 + 189100
    assert snap.spec.accepted_tokens == 141_400  # 72800 + 68600
    # Per position, engine 0 + engine 1: 22800+21600, 17100+16200, 13500+12700, 10800+10100, 8600+8000.
    assert snap.spec.accepted_per_position == (44_400, 33_300, 26_200, 20_900, 16_600)
    assert snap.num_requests_running == 119  # 61 + 58
    assert snap.num_requests_waiting == 10  # 7 + 3
    # No cache_config_info on this page: plain mean of 0.6821 and 0.6433.
    assert snap.kv_cache_usage_ratio == pytest.approx(0.6627)
    assert snap.kv_cache_capacity_tokens is None
    assert snap.generation_tokens == 245_450  # 125800 + 119650
    assert snap.prompt_tokens is None
    assert snap.inter_token_latency is None
    # Engine epochs: engine 0 earliest = drafts_created 1.767225612483171e9, engine 1 = 1.767225612483185e9.
    # The later of the two, so a restart of either engine moves it.
    assert snap.created_s == 1.767225612483185e09


def test_eagle_capture_matches_its_consistency_header() -> None:
    snap = only(page(EAGLE))
    assert snap.spec is not None
    # Header: accepted = sum(per_pos) = 207600; draft_tokens = 3*drafts (drafts 120000).
    assert snap.spec.accepted_tokens == 207_600
    assert sum(snap.spec.accepted_per_position) == 207_600
    assert snap.spec.draft_tokens == 3 * snap.spec.drafts == 360_000
    assert snap.num_requests_running == 14
    assert snap.inter_token_latency is not None
    assert snap.inter_token_latency.count == 126_300  # "ITL count = decode output events (126300)"
    assert snap.kv_cache_capacity_tokens is None  # header: cache_config_info omitted


def test_speculation_off_is_not_an_error() -> None:
    text = drop_lines(page(AFTER_30), "vllm:spec_decode_")
    snap = only(text)
    assert snap.spec is None
    assert snap.generation_tokens == 1920
    # Without the drafts family the epoch comes from prompt/generation: prompt_tokens_created 1.7962052104815338e9.
    assert snap.created_s == 1.7962052104815338e09


# ---------------------------------------------------------------------------------------------------------------
# Names across vLLM versions
# ---------------------------------------------------------------------------------------------------------------


def test_old_vllm_names_are_read_and_recorded() -> None:
    snap = only(page(OLD_NAMES))
    assert snap.naming == "vllm-v1+legacy:gpu_cache_usage_perc,time_per_output_token_seconds"
    assert snap.kv_cache_usage_ratio == 0.4375
    # No kv_cache_size_tokens label: num_gpu_blocks 27798 x block_size 16 = 444768 tokens.
    assert snap.kv_cache_capacity_tokens == 444_768
    assert snap.inter_token_latency is not None
    assert (snap.inter_token_latency.count, snap.inter_token_latency.sum) == (1200, 30.0)
    assert snap.spec is not None
    assert snap.spec.accepted_per_position == (820, 610, 450, 330)
    # spec series carry no engine label there: still one engine, not two.
    assert snap.engines == 1
    assert snap.estimated_flops is None
    # Unlabelled spec _created 1.752001234567e9 belongs to engine 0 and is its earliest.
    assert snap.created_s == 1.752001234567e09


def test_new_name_wins_when_both_are_exported() -> None:
    # 0.10-0.12 with --show-hidden-metrics export both; the old gauge here disagrees on purpose.
    text = page(AFTER_30) + f"vllm:gpu_cache_usage_perc{{{TINY}}} 0.9\n"
    snap = only(text)
    assert snap.kv_cache_usage_ratio == 0.0  # from vllm:kv_cache_usage_perc
    assert snap.naming == "vllm-v1"


def test_counters_exposed_without_total_suffix_are_read() -> None:
    # Some exporters type a counter under its bare name; prometheus_client's parser would rename it, we must not
    # depend on that either way.
    text = (
        page(AFTER_30)
        .replace("vllm:spec_decode_num_drafts_total{", "vllm:spec_decode_num_drafts{")
        .replace("# TYPE vllm:spec_decode_num_drafts_total counter", "# TYPE vllm:spec_decode_num_drafts counter")
    )
    snap = only(text)
    assert snap.spec is not None
    assert snap.spec.drafts == 540


# ---------------------------------------------------------------------------------------------------------------
# Labels and aggregation
# ---------------------------------------------------------------------------------------------------------------


def test_cache_config_without_model_applies_to_every_model_and_weights_dp_usage() -> None:
    # Two engines with different KV pools: engine 0 holds 1000 tokens at 50% use, engine 1 holds 3000 at 10%.
    lines = []
    for engine, usage in (("0", 0.5), ("1", 0.1)):
        labels = f'engine="{engine}",model_name="m"'
        lines += [
            f"vllm:num_requests_running{{{labels}}} 1",
            f"vllm:num_requests_waiting{{{labels}}} 0",
            f"vllm:kv_cache_usage_perc{{{labels}}} {usage}",
        ]
    lines += [
        'vllm:cache_config_info{block_size="16",engine="0",kv_cache_size_tokens="1000",num_gpu_blocks="62"} 1.0',
        'vllm:cache_config_info{block_size="16",engine="1",kv_cache_size_tokens="3000",num_gpu_blocks="187"} 1.0',
    ]
    snap = only("\n".join(lines) + "\n")
    assert snap.kv_cache_capacity_tokens == 4000  # 1000 + 3000
    # Used tokens 0.5*1000 + 0.1*3000 = 800 of 4000 = 0.2 (a plain mean would say 0.3).
    assert snap.kv_cache_usage_ratio == pytest.approx(0.2)
    assert snap.spec is None
    assert snap.created_s is None  # no _created lines (e.g. multiprocess prometheus_client)


def test_two_models_on_one_page_are_kept_apart() -> None:
    lines = []
    for model, running in (("a", 3), ("b", 5)):
        lines += [
            f'vllm:num_requests_running{{engine="0",model_name="{model}"}} {running}',
            f'vllm:num_requests_waiting{{engine="0",model_name="{model}"}} 0',
        ]
    lines.append('vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="100"} 1.0')
    snapshots = parse_vllm_metrics("\n".join(lines) + "\n", taken_at_s=T)
    assert sorted(snapshots) == ["a", "b"]
    assert (snapshots["a"].num_requests_running, snapshots["b"].num_requests_running) == (3, 5)
    # The model-less cache config (100 blocks x 16) applies to both.
    assert snapshots["a"].kv_cache_capacity_tokens == snapshots["b"].kv_cache_capacity_tokens == 1600


def test_a_vanished_trailing_position_is_invalid_because_positions_no_longer_add_up() -> None:
    # Raw lines: accepted 1415 = 515 + 465 + 435. Without position="2" the positions add up to 980 != 1415;
    # read as k=2 it would silently halve the deployed k.
    text = replace_line(page(AFTER_30), f'{PER_POS}{{{TINY},position="2"}}', None)
    with pytest.raises(ScrapeError) as caught:
        parse_vllm_metrics(text, taken_at_s=T)
    assert caught.value.reason is ScrapeErrorReason.INVALID_VALUE
    assert "1415" in caught.value.detail and "980" in caught.value.detail


def test_accepted_one_token_off_the_sum_of_positions_is_invalid() -> None:
    # 1416 vs 515 + 465 + 435 = 1415: counts are integers, so a difference of one is a real disagreement.
    prefix = f"vllm:spec_decode_num_accepted_tokens_total{{{TINY}}}"
    assert reason_of(replace_line(page(AFTER_30), prefix, f"{prefix} 1416.0")) is ScrapeErrorReason.INVALID_VALUE


def test_accepted_written_in_exponent_notation_still_adds_up() -> None:
    # 1.415e+03 is 1415 = 515 + 465 + 435: formatting is not a mismatch.
    prefix = f"vllm:spec_decode_num_accepted_tokens_total{{{TINY}}}"
    snap = only(replace_line(page(AFTER_30), prefix, f"{prefix} 1.415e+03"))
    assert snap.spec is not None
    assert snap.spec.accepted_tokens == 1415


def test_positions_must_add_up_per_engine_not_only_in_total() -> None:
    # Engine 0 position 0: 22800 -> 23800 and engine 1 position 0: 21600 -> 20600 keeps the page-wide sum at
    # 141400 but engine 0 now sums to 73800 != 72800 (and engine 1 to 67600 != 68600).
    qwen = 'model_name="Qwen/Qwen3-8B",position="0"'
    text = replace_line(page(DP2), f'{PER_POS}{{engine="0",{qwen}}}', f'{PER_POS}{{engine="0",{qwen}}} 23800.0')
    text = replace_line(text, f'{PER_POS}{{engine="1",{qwen}}}', f'{PER_POS}{{engine="1",{qwen}}} 20600.0')
    assert reason_of(text) is ScrapeErrorReason.INVALID_VALUE


def spec_page(positions: int) -> str:
    """A minimal one-engine page with `positions` per-position series at 0 (so accepted 0 adds up)."""
    lines = [
        f"vllm:num_requests_running{{{TINY}}} 1.0",
        f"vllm:num_requests_waiting{{{TINY}}} 0.0",
        f"vllm:spec_decode_num_drafts_total{{{TINY}}} 10.0",
        f"vllm:spec_decode_num_draft_tokens_total{{{TINY}}} 10.0",
        f"vllm:spec_decode_num_accepted_tokens_total{{{TINY}}} 0.0",
    ]
    lines += [f'{PER_POS}{{{TINY},position="{i}"}} 0.0' for i in range(positions)]
    return "\n".join(lines) + "\n"


def test_max_positions_are_accepted() -> None:
    snap = only(spec_page(MAX_POSITIONS))
    assert snap.spec is not None
    assert snap.spec.deployed_k == 64


@pytest.mark.parametrize(
    ("positions", "reason"),
    [(MAX_POSITIONS + 1, ScrapeErrorReason.INVALID_VALUE), (20_000, ScrapeErrorReason.TOO_MANY_SERIES)],
)
def test_more_positions_than_the_bound_are_refused(positions: int, reason: ScrapeErrorReason) -> None:
    # 20000 series would become 20000 exported acceptance series and a k=20000 estimator state; so many lines are
    # refused before the parser runs.
    assert reason_of(spec_page(positions)) is reason


def test_unrelated_lines_do_not_change_the_result() -> None:
    noise = "".join(f'other_metric_total{{i="{i}"}} {i}\n' for i in range(5000))
    assert only(noise + page(AFTER_30) + noise) == only(page(AFTER_30))


# ---------------------------------------------------------------------------------------------------------------
# Broken input: always a ScrapeError with a reason
# ---------------------------------------------------------------------------------------------------------------


def test_a_gap_in_positions_is_invalid() -> None:
    text = replace_line(page(AFTER_30), f'{PER_POS}{{{TINY},position="1"}}', None)
    assert reason_of(text) is ScrapeErrorReason.INVALID_VALUE


@pytest.mark.parametrize("position", ["x", "-1", "1.0", ""])
def test_a_non_integer_position_is_invalid(position: str) -> None:
    prefix = f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{TINY},position="2"}}'
    text = replace_line(page(AFTER_30), prefix, prefix.replace('"2"', f'"{position}"') + " 435.0")
    assert reason_of(text) is ScrapeErrorReason.INVALID_VALUE


@pytest.mark.parametrize(
    "prefix",
    [
        f"vllm:spec_decode_num_drafts_total{{{TINY}}}",
        f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{TINY},position="0"}}',
        f"vllm:num_requests_running{{{TINY}}}",
        f"vllm:kv_cache_usage_perc{{{TINY}}}",
        f"vllm:inter_token_latency_seconds_sum{{{TINY}}}",
        'vllm:inter_token_latency_seconds_bucket{engine="0",le="0.05",model_name="tiny"}',
        f"vllm:spec_decode_num_drafts_created{{{TINY}}}",
        f"vllm:estimated_flops_per_gpu_total{{{TINY}}}",
    ],
)
@pytest.mark.parametrize("bad", ["NaN", "+Inf", "-Inf", "-1.0"])
def test_non_finite_or_negative_values_in_used_fields_are_invalid(prefix: str, bad: str) -> None:
    text = replace_line(page(AFTER_30), prefix, f"{prefix} {bad}")
    assert reason_of(text) is ScrapeErrorReason.INVALID_VALUE


def test_nan_in_a_family_we_do_not_use_is_ignored() -> None:
    prefix = f"vllm:num_preemptions_total{{{TINY}}}"
    snap = only(replace_line(page(AFTER_30), prefix, f"{prefix} NaN"))
    assert snap.spec is not None


def test_a_malformed_line_in_a_used_family_is_a_parse_error() -> None:
    prefix = f"vllm:num_requests_running{{{TINY}}}"
    assert reason_of(replace_line(page(AFTER_30), prefix, f"{prefix} twelve")) is ScrapeErrorReason.PARSE
    broken_labels = 'vllm:num_requests_running{engine="0,model_name="tiny"} 1.0'
    assert reason_of(replace_line(page(AFTER_30), prefix, broken_labels)) is ScrapeErrorReason.PARSE


@pytest.mark.parametrize(
    "text",
    [
        "<html><body><h1>502 Bad Gateway</h1></body></html>\n",
        "vllm is {{ broken\n",
        "\x00\x01\x02 binary\n",
    ],
)
def test_garbage_is_a_parse_error(text: str) -> None:
    assert reason_of(text) is ScrapeErrorReason.PARSE


@pytest.mark.parametrize(
    "text",
    [
        "",
        "# HELP python_gc_objects_collected_total x\n# TYPE python_gc_objects_collected_total counter\n"
        'python_gc_objects_collected_total{generation="0"} 1.0\n',
        'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="1"} 1.0\n',
    ],
)
def test_a_page_without_vllm_engine_series_is_model_missing(text: str) -> None:
    assert reason_of(text) is ScrapeErrorReason.MODEL_MISSING


def test_a_body_cut_mid_line_is_a_parse_error() -> None:
    text = page(AFTER_30)
    # Cut inside "vllm:num_requests_running{...} 0.0": without the final newline the page cannot be trusted.
    cut = text.index(f"vllm:num_requests_running{{{TINY}}}") + 40
    assert reason_of(text[:cut]) is ScrapeErrorReason.PARSE


def test_a_body_cut_between_spec_families_is_a_missing_family_not_speculation_off() -> None:
    text = page(AFTER_30)
    cut = text.index("# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total")
    assert reason_of(text[:cut]) is ScrapeErrorReason.MISSING_FAMILY


def test_renamed_spec_families_are_a_missing_family_not_speculation_off() -> None:
    # A future vLLM renaming vllm:spec_decode_num_* to vllm:spec_decode_count_*: none of the four known families
    # is left, but the engine plainly speculates; "speculation off" would be a wrong, confident answer.
    text = page(AFTER_30).replace("vllm:spec_decode_num_", "vllm:spec_decode_count_")
    with pytest.raises(ScrapeError) as caught:
        parse_vllm_metrics(text, taken_at_s=T)
    assert caught.value.reason is ScrapeErrorReason.MISSING_FAMILY
    assert "vllm:spec_decode_count_drafts_total" in caught.value.detail
    assert "service/sources/names.py" in caught.value.detail


def test_an_unknown_spec_name_beside_the_known_families_is_ignored() -> None:
    # A new extra family next to the four we read is the server's business (like any other unused family).
    text = page(AFTER_30) + f"vllm:spec_decode_new_thing_total{{{TINY}}} 3.0\n"
    assert only(text).spec == only(page(AFTER_30)).spec


@pytest.mark.parametrize("name", [AFTER_30, IDLE, EAGLE, DP2, OLD_NAMES])
def test_real_and_synthetic_pages_carry_no_unknown_spec_name(name: str) -> None:
    # Their unread spec names are the *_created siblings (e.g. ..._per_pos_created), which names.py knows.
    spec_names = {
        line.partition("{")[0] for line in page(name).split("\n") if line.startswith("vllm:spec_decode")
    }
    assert spec_names
    assert spec_names <= names.known_spec_decode_sample_names()


def test_some_but_not_all_spec_families_is_a_missing_family() -> None:
    # A V0-era page: draft and accepted totals, but no drafts count and no per-position series.
    text = drop_lines(drop_lines(page(AFTER_30), "vllm:spec_decode_num_drafts"), "_per_pos_")
    assert reason_of(text) is ScrapeErrorReason.MISSING_FAMILY


def test_a_model_without_running_requests_is_a_missing_family() -> None:
    text = replace_line(page(AFTER_30), f"vllm:num_requests_running{{{TINY}}}", None)
    assert reason_of(text) is ScrapeErrorReason.MISSING_FAMILY


def test_a_histogram_without_sum_is_a_missing_family() -> None:
    text = replace_line(page(AFTER_30), f"vllm:inter_token_latency_seconds_sum{{{TINY}}}", None)
    assert reason_of(text) is ScrapeErrorReason.MISSING_FAMILY


def test_a_non_cumulative_histogram_is_invalid() -> None:
    # Every ITL bucket of the capture holds 550; le=0.05 at 2 would make the cumulative counts fall.
    prefix = 'vllm:inter_token_latency_seconds_bucket{engine="0",le="0.05",model_name="tiny"}'
    assert reason_of(replace_line(page(AFTER_30), prefix, f"{prefix} 2.0")) is ScrapeErrorReason.INVALID_VALUE


def test_a_histogram_without_inf_bucket_is_invalid() -> None:
    prefix = 'vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf",model_name="tiny"}'
    assert reason_of(replace_line(page(AFTER_30), prefix, None)) is ScrapeErrorReason.INVALID_VALUE


def test_a_duplicated_series_is_invalid() -> None:
    line = f"vllm:spec_decode_num_drafts_total{{{TINY}}} 540.0"
    assert reason_of(page(AFTER_30) + line + "\n") is ScrapeErrorReason.INVALID_VALUE


def test_an_engine_series_without_model_name_is_invalid() -> None:
    prefix = f"vllm:num_requests_waiting{{{TINY}}}"
    text = replace_line(page(AFTER_30), prefix, 'vllm:num_requests_waiting{engine="0"} 0.0')
    assert reason_of(text) is ScrapeErrorReason.INVALID_VALUE


def test_a_nan_kv_capacity_label_is_invalid() -> None:
    text = page(AFTER_30).replace('kv_cache_size_tokens="1048576"', 'kv_cache_size_tokens="nan"')
    assert reason_of(text) is ScrapeErrorReason.INVALID_VALUE


@pytest.mark.parametrize("seed", range(40))
def test_random_damage_yields_a_snapshot_or_a_scrape_error(seed: int) -> None:
    """Flip, drop or duplicate bytes anywhere in the real page: the parser may succeed, or raise ScrapeError."""
    rng = random.Random(seed)
    chars = list(page(AFTER_30))
    for _ in range(rng.randint(1, 20)):
        at = rng.randrange(len(chars))
        action = rng.choice(("flip", "drop", "dup"))
        if action == "flip":
            chars[at] = rng.choice('{}",=\\ \n#e.+-0aZ\x00\u00e9')
        elif action == "drop":
            del chars[at]
        else:
            chars.insert(at, chars[at])
    try:
        result = parse_vllm_metrics("".join(chars), taken_at_s=T)
    except ScrapeError as exc:
        assert isinstance(exc.reason, ScrapeErrorReason)
    else:
        assert all(isinstance(s, EngineSnapshot) for s in result.values())


# ---------------------------------------------------------------------------------------------------------------
# Counters vLLM's own accounting cannot produce
# ---------------------------------------------------------------------------------------------------------------

LLAMA = 'engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"'


def _detail_of(text: str) -> str:
    with pytest.raises(ScrapeError) as caught:
        parse_vllm_metrics(text, taken_at_s=T)
    assert caught.value.reason is ScrapeErrorReason.INVALID_VALUE
    return caught.value.detail


def test_finite_but_absurd_drafts_are_invalid_not_an_acceptance_of_zero() -> None:
    # 1e12 drafts beside 336000 generated tokens: every verification emits a token, so at most ~336000 drafts.
    # Read as it stands, acceptance per position would be ~0 and a k=3 recommendation would flip to off.
    prefix = f"vllm:spec_decode_num_drafts_total{{{LLAMA}}}"
    detail = _detail_of(replace_line(page(EAGLE), prefix, f"{prefix} 1e12"))
    assert "drafts 1e+12 > generated tokens 336000" in detail


def test_engines_whose_counters_would_sum_to_infinity_are_refused_by_their_range() -> None:
    # Each engine's 1.5e308 is finite; their sum is not (before: Inf reached the cost model and raised every tick).
    # No counter past MAX_COUNT (1e18) is read, so no sum over engines can overflow.
    qwen = 'model_name="Qwen/Qwen3-8B"'
    text = page(DP2)
    for engine in ("0", "1"):
        prefix = f'vllm:spec_decode_num_drafts_total{{engine="{engine}",{qwen}}}'
        text = replace_line(text, prefix, f"{prefix} 1.5e308")
    assert "over 1e+18" in _detail_of(text)


@pytest.mark.parametrize(
    ("prefix", "value", "bound"),
    [
        (f"vllm:num_requests_running{{{LLAMA}}}", "2e6", "over 1e+06"),  # a queue no engine holds
        (f"vllm:num_requests_waiting{{{LLAMA}}}", "1e308", "over 1e+06"),
        (f"vllm:kv_cache_usage_perc{{{LLAMA}}}", "1.5", "over 1"),  # a fraction of the cache, not a percent
        (f"vllm:generation_tokens_total{{{LLAMA}}}", "2e18", "over 1e+18"),
        (f"vllm:generation_tokens_total{{{LLAMA}}}", "9" * 400, "inf"),  # an integer literal past 2**1024
    ],
)
def test_readings_past_their_plausible_range_are_invalid(prefix: str, value: str, bound: str) -> None:
    text = replace_line(page(EAGLE), prefix, f"{prefix} {value}")
    with pytest.raises(ScrapeError) as caught:
        parse_vllm_metrics(text, taken_at_s=T)
    assert caught.value.reason is ScrapeErrorReason.INVALID_VALUE
    assert bound in caught.value.detail


def test_a_huge_integer_timestamp_is_a_parse_error_not_an_internal_one() -> None:
    prefix = f"vllm:num_requests_running{{{LLAMA}}}"
    assert reason_of(replace_line(page(EAGLE), prefix, f"{prefix} 1.0 {'9' * 400}")) is ScrapeErrorReason.PARSE
    assert reason_of(f"process_open_fds 1 {'9' * 400}\n") is ScrapeErrorReason.PARSE


def _counts_page(drafts: float, draft_tokens: float, per_position: tuple[float, ...]) -> str:
    lines = [
        f"vllm:num_requests_running{{{TINY}}} 1.0",
        f"vllm:num_requests_waiting{{{TINY}}} 0.0",
        f"vllm:spec_decode_num_drafts_total{{{TINY}}} {drafts}",
        f"vllm:spec_decode_num_draft_tokens_total{{{TINY}}} {draft_tokens}",
        f"vllm:spec_decode_num_accepted_tokens_total{{{TINY}}} {sum(per_position)}",
    ]
    lines += [f'{PER_POS}{{{TINY},position="{i}"}} {c}' for i, c in enumerate(per_position)]
    return "\n".join(lines) + "\n"


def test_counts_that_break_vllms_accounting_are_invalid() -> None:
    # Consistent: 100 drafts of k=3 proposing 300 tokens, 80 >= 60 >= 40 accepted by position.
    assert only(_counts_page(100, 300, (80, 60, 40))).spec is not None
    # More accepted (180) than proposed (150).
    assert "accepted tokens 180 > draft tokens 150" in _detail_of(_counts_page(100, 150, (80, 60, 40)))
    # More proposed (400) than k x drafts (300).
    assert "draft tokens 400 > k=3 x drafts 100" in _detail_of(_counts_page(100, 400, (80, 60, 40)))
    # Position 1 accepted more often than position 0.
    assert "rise with the position" in _detail_of(_counts_page(100, 300, (60, 80, 40)))
    # Position 0 accepted in more verifications (120) than there were drafts (100).
    assert "position 0 accepted 120 > drafts 100" in _detail_of(_counts_page(100, 300, (120, 60, 40)))


ITL = "vllm:inter_token_latency_seconds"


def _itl_page(count: str, *, inf_bucket: str | None = None, total: str | None = None) -> str:
    text = page(EAGLE)
    text = replace_line(text, f"{ITL}_count{{{LLAMA}}}", f"{ITL}_count{{{LLAMA}}} {count}")
    if inf_bucket is not None:
        prefix = f'{ITL}_bucket{{engine="0",le="+Inf",model_name="meta-llama/Llama-3.1-8B-Instruct"}}'
        text = replace_line(text, prefix, f"{prefix} {inf_bucket}")
    if total is not None:
        text = replace_line(text, f"{ITL}_sum{{{LLAMA}}}", f"{ITL}_sum{{{LLAMA}}} {total}")
    return text


def test_a_histogram_count_is_a_whole_number_of_observations_matching_its_inf_bucket() -> None:
    # As captured: 126300 observations, the +Inf bucket the same.
    itl = only(page(EAGLE)).inter_token_latency
    assert itl is not None and itl.count == 126300.0
    # 1.263e+05 is the same whole number.
    written = only(_itl_page("1.263e+05")).inter_token_latency
    assert written is not None and written.count == 126300.0
    # A fraction of an observation.
    assert "not a whole number" in _detail_of(_itl_page("126300.5", inf_bucket="126300.5"))
    # _count disagrees with its +Inf bucket.
    assert "!= +Inf bucket" in _detail_of(_itl_page("126299.0"))


def test_a_denormal_count_under_a_positive_sum_is_invalid_not_an_infinite_step_time() -> None:
    # Cold start: _count 5e-324 with _sum 12 made the mean inter-token latency 12 / 5e-324 = inf.
    text = _itl_page("5e-324", inf_bucket="0.0", total="12.0")
    text = "\n".join(
        line if not line.startswith(f"{ITL}_bucket{{") else line.rsplit(" ", 1)[0] + " 0.0"
        for line in text.split("\n")
    )
    assert "with no observations" in _detail_of(text)
