"""POST /v1/whatif and GET /v1/schedule over real HTTP (uvicorn on 127.0.0.1), inside the app's own error handling."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from sidecar_http import FIXTURES, CaptureServer, serving, wait_for

from policies.model.costmodel import ModelContext
from policies.model.profiles import drafter_for, hardware_by_name, model_by_name, model_from_hf_config
from policies.model.roofline import CostScales
from policies.offline.schedule import ScheduleAsk, inputs_from_evidence, schedule_for, vllm_bands
from policies.types import AcceptanceEvidence, DataState, Decision, DraftMethod, Evidence
from service.app import build_sidecar
from service.board import Board, Pricing
from service.exporter import MetricsPage
from service.http.api import ApiExtensions, create_api
from service.http.whatif import (
    LiveTargets,
    WhatIfRequest,
    create_whatif_router,
    live_targets_from_board,
    run_whatif,
)
from service.settings import load_settings
from service.sources.gpu import NoGpuSource

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
PROFILES = {"hardware": "h100-sxm", "model": "llama-3.1-8b", "drafter": "eagle3", "tensor_parallel": "1"}
BODY: dict[str, Any] = {
    "hardware": "h100-sxm",
    "target_model": "llama-3.1-8b",
    "drafter": {"method": "eagle3"},
    "acceptance": {"per_position": [0.78, 0.58, 0.43]},
    "batch_sizes": [1, 8, 64, 256],
    "context_lengths": [512, 4096],
    "gammas": [0, 1, 3, 5],
}
SMALL_LIMIT = 4096  # bytes, so the tests can cross it cheaply


def live_evidence(*, at_s: float = 1_000.0) -> Evidence:
    per_position = (0.78, 0.58, 0.43)
    return Evidence(
        target="llama", model=MODEL, at_s=at_s, state=DataState.OK, speculation_on=True, deployed_k=3,
        acceptance=AcceptanceEvidence(
            per_position=per_position, per_position_low=(0.76, 0.55, 0.40), per_position_high=(0.80, 0.61, 0.46),
            drafts=2000.0, draft_tokens=6000.0, accepted_tokens=2000.0 * sum(per_position),
            mean_acceptance_length=1.0 + sum(per_position), acceptance_rate=sum(per_position) / 3,
            mean_proposed_length=3.0, window_s=60.0,
        ),
        batch=12.0, waiting=0.0, context_tokens_per_seq=900.0, step_time_s=0.012,
    )


def decision_for(evidence: Evidence) -> Decision:
    return Decision(
        target="llama", model=MODEL, state=DataState.OK, enabled=True, num_speculative_tokens=3,
        expected_speedup=1.5, expected_speedup_low=1.4, expected_speedup_high=1.6, reason="on",
        evaluated_at_s=evidence.at_s,
    )


def catalog_context() -> ModelContext:
    model = model_by_name("llama-3.1-8b")
    drafter = drafter_for(DraftMethod.EAGLE3, model)
    return ModelContext(hardware=hardware_by_name("h100-sxm"), model=model, drafter=drafter)


def run_api(
    check: Callable[[httpx.AsyncClient, Board], Awaitable[None]],
    *,
    live: Callable[[Board], LiveTargets | None] = live_targets_from_board,
    max_body_bytes: int = SMALL_LIMIT * 64,
) -> None:
    """The real app (create_api, its error handlers) with the what-if router included, as the lead wires it."""
    board = Board([("llama", None), ("idle", "m")], started_at_s=1_000.0)
    router = create_whatif_router(live_targets=live(board), gamma_max=6, max_body_bytes=max_body_bytes)
    app = create_api(
        board, metrics=MetricsPage(board, clock=lambda: 1_000.0, version="t"), clock=lambda: 1_000.0,
        stall_after_s=15.0, version="t", extensions=ApiExtensions(routers=[router]),
    )

    async def scenario() -> None:
        async with serving(app) as url, httpx.AsyncClient(base_url=url, timeout=30.0) as client:
            await check(client, board)

    asyncio.run(scenario())


def with_(**changes: Any) -> dict[str, Any]:
    return {**BODY, **changes}


def without(key: str) -> dict[str, Any]:
    return {k: v for k, v in BODY.items() if k != key}


# ------------------------------------------------------------------------------------------------------------
# POST /v1/whatif
# ------------------------------------------------------------------------------------------------------------


def test_whatif_serves_what_the_model_computes() -> None:
    async def check(client: httpx.AsyncClient, _board: Board) -> None:
        reply = await client.post("/v1/whatif", json=BODY)
        assert reply.status_code == 200, reply.text
        body = reply.json()
        expected = run_whatif(WhatIfRequest.model_validate(BODY)).model_dump(mode="json")
        assert body == expected
        assert len(body["points"]) == 4 * 2 * 4  # batches x contexts x gammas
        assert len(body["best"]) == 4 * 2 and len(body["crossovers"]) == 2 * 3  # contexts x gammas >= 1
        assert body["profiles"]["hardware"] == "h100-sxm" and body["acceptance"]["measured_positions"] == 3
        # Every point says whether its KV fits; a batch of 4096 at 8k context is ~4.4 TB of KV: not on one H100.
        assert all({"fits_in_memory", "max_batch_in_memory"} <= set(p) for p in body["points"])
        crowded = await client.post(
            "/v1/whatif", json={**BODY, "batch_sizes": [4096], "context_lengths": [8192], "gammas": [0, 3]}
        )
        assert crowded.status_code == 200, crowded.text
        answer = crowded.json()
        assert [p["fits_in_memory"] for p in answer["points"]] == [False, False]
        assert answer["best"][0]["fits_in_memory"] is False
        assert any("do not fit in memory" in note for note in answer["notes"])
        # A GPU the catalog lacks, by its datasheet numbers.
        a10g = {"name": "a10g", "bf16_dense_tflops": 70, "mem_bandwidth_gbps": 600, "memory_gb": 24}
        custom = await client.post("/v1/whatif", json={**BODY, "hardware": a10g})
        assert custom.status_code == 200, custom.text
        assert custom.json()["profiles"]["hardware"] == "a10g"
        assert "operator-supplied" in custom.json()["profiles"]["sources"]["hardware"]
        # A tree drafter (SGLang-style: 25 draft tokens, gammas are its depth) is priced and says so.
        tree = await client.post("/v1/whatif", json={**BODY, "drafter": {"method": "eagle", "tree_tokens": 25}})
        assert tree.status_code == 200, tree.text
        assert any("tree drafting" in note for note in tree.json()["notes"])

    run_api(check)


BAD_BODIES: list[tuple[str, Any, list[str | int] | None]] = [
    # (what, body, the loc the error must name; None = any 4xx naming the body)
    ("unknown gpu", with_(hardware="h900"), ["body", "hardware"]),
    ("unknown model", with_(target_model="llama-9-1t"), ["body", "target_model"]),
    ("empty model name", with_(target_model=""), ["body", "target_model"]),
    ("model is a number", with_(target_model=7), ["body", "target_model"]),
    ("config.json missing fields", with_(target_model={"hidden_size": 4096}), ["body", "target_model"]),
    ("config.json without a dtype", with_(target_model={"hidden_size": 4096, "intermediate_size": 14336,
                                                       "num_hidden_layers": 32, "num_attention_heads": 32,
                                                       "num_key_value_heads": 8, "vocab_size": 128256}),
     ["body", "target_model"]),
    ("config.json zero heads", with_(target_model={"hidden_size": 64, "num_hidden_layers": 2,
                                                   "num_attention_heads": 0, "vocab_size": 9}),
     ["body", "target_model"]),
    ("acceptance above 1", with_(acceptance={"per_position": [1.2]}), ["body", "acceptance", "per_position", 0]),
    ("acceptance negative", with_(acceptance={"iid_rate": -0.1}), ["body", "acceptance", "iid_rate"]),
    ("acceptance rate above 1", with_(acceptance={"iid_rate": 1.01}), ["body", "acceptance", "iid_rate"]),
    ("acceptance increasing", with_(acceptance={"per_position": [0.3, 0.5]}), ["body", "acceptance", "per_position"]),
    ("two acceptance forms", with_(acceptance={"per_position": [0.5], "iid_rate": 0.5}), ["body", "acceptance"]),
    ("no acceptance form", with_(acceptance={}), ["body", "acceptance"]),
    ("no acceptance", without("acceptance"), ["body", "acceptance"]),
    ("mean length without k", with_(acceptance={"mean_acceptance_length": 2.5}),
     ["body", "acceptance", "measured_at_k"]),
    ("mean length above k+1", with_(acceptance={"mean_acceptance_length": 4.5, "measured_at_k": 3}),
     ["body", "acceptance", "mean_acceptance_length"]),
    ("mean length below 1", with_(acceptance={"mean_acceptance_length": 0.5, "measured_at_k": 3}),
     ["body", "acceptance", "mean_acceptance_length"]),
    ("negative batch", with_(batch_sizes=[-4]), ["body", "batch_sizes", 0]),
    ("zero batch", with_(batch_sizes=[0]), ["body", "batch_sizes", 0]),
    ("batch as text", with_(batch_sizes=["many"]), ["body", "batch_sizes", 0]),
    ("too many batches", with_(batch_sizes=list(range(1, 66))), ["body", "batch_sizes"]),
    ("empty batches", with_(batch_sizes=[]), ["body", "batch_sizes"]),
    ("negative context", with_(context_lengths=[-1]), ["body", "context_lengths", 0]),
    ("gamma beyond the max", with_(gammas=[0, 17]), ["body", "gammas", 1]),
    ("negative gamma", with_(gammas=[-1]), ["body", "gammas", 0]),
    ("fractional gamma", with_(gammas=[1.5]), ["body", "gammas", 0]),
    ("duplicate gammas", with_(gammas=[2, 2]), ["body", "gammas"]),
    ("too many points", with_(batch_sizes=list(range(1, 65)), context_lengths=list(range(100, 900, 100)),
                              gammas=[0, 1, 2, 3, 4]), ["body", "batch_sizes"]),
    ("tensor parallel 0", with_(tensor_parallel=0), ["body", "tensor_parallel"]),
    ("tensor parallel true", with_(tensor_parallel=True), ["body", "tensor_parallel"]),
    ("unknown drafter", with_(drafter={"method": "medusa"}), ["body", "drafter", "method"]),
    ("draft model missing", with_(drafter={"method": "draft_model"}), ["body", "drafter", "draft_model"]),
    ("draft model unknown", with_(drafter={"method": "draft_model", "draft_model": "nope"}),
     ["body", "drafter", "draft_model"]),
    ("draft model for eagle", with_(drafter={"method": "eagle3", "draft_model": "llama-3.2-1b"}),
     ["body", "drafter", "draft_model"]),
    ("typo field", with_(batch_size=[1]), ["body", "batch_size"]),
    ("negative prefill", with_(prefill_tokens_per_step=-5), ["body", "prefill_tokens_per_step"]),
    ("prompt of no tokens", with_(prefill_tokens_per_step=100, prompt_tokens=0), ["body", "prompt_tokens"]),
    ("prompt without prefill", with_(prompt_tokens=2000), ["body", "prompt_tokens"]),
    ("memory share 0", with_(gpu_memory_utilization=0), ["body", "gpu_memory_utilization"]),
    ("gpu numbers negative", with_(hardware={"name": "x", "bf16_dense_tflops": -1, "mem_bandwidth_gbps": 600,
                                             "memory_gb": 24}), ["body", "hardware"]),
    ("gpu numbers incomplete", with_(hardware={"name": "x", "bf16_dense_tflops": 70}), ["body", "hardware"]),
    ("tree of no tokens", with_(drafter={"method": "eagle3", "tree_tokens": 0}), ["body", "drafter", "tree_tokens"]),
    ("tree for n-gram", with_(drafter={"method": "ngram", "tree_tokens": 8}), ["body", "drafter", "tree_tokens"]),
    ("tree shallower than gamma", with_(drafter={"method": "eagle3", "tree_tokens": 3}),
     ["body", "drafter", "tree_tokens"]),
    ("memory share above 1", with_(gpu_memory_utilization=1.2), ["body", "gpu_memory_utilization"]),
    ("step budget 0", with_(max_num_batched_tokens=0), ["body", "max_num_batched_tokens"]),
    ("step budget fractional", with_(max_num_batched_tokens=512.5), ["body", "max_num_batched_tokens"]),
    ("draft coverage 0", with_(acceptance={"per_position": [0.8, 0.6], "draft_coverage": 0}),
     ["body", "acceptance", "draft_coverage"]),
    ("draft coverage above 1", with_(acceptance={"per_position": [0.8, 0.6], "draft_coverage": 1.2}),
     ["body", "acceptance", "draft_coverage"]),
    ("body is a list", [BODY], None),
    ("body is null", None, None),
]


def test_bad_bodies_are_422_naming_the_field() -> None:
    # One server for all of them: each case says which one failed.
    async def check(client: httpx.AsyncClient, _board: Board) -> None:
        for what, body, loc in BAD_BODIES:
            reply = await client.post("/v1/whatif", json=body)
            assert reply.status_code == 422, (what, reply.text)
            answer = reply.json()
            assert answer["error"] == "invalid_request", what
            if loc is not None:
                assert any(problem["loc"][: len(loc)] == loc for problem in answer["detail"]), (what, answer)

    run_api(check)


def test_unknown_names_list_the_known_ones() -> None:
    async def check(client: httpx.AsyncClient, _board: Board) -> None:
        gpu = (await client.post("/v1/whatif", json=with_(hardware="h900"))).json()["detail"][0]["msg"]
        assert "unknown hardware 'h900'" in gpu and "h100-sxm" in gpu
        model = (await client.post("/v1/whatif", json=with_(target_model="nope"))).json()["detail"][0]["msg"]
        assert "unknown model 'nope'" in model and "llama-3.1-8b" in model
        too_many = next(body for what, body, _ in BAD_BODIES if what == "too many points")
        limit = (await client.post("/v1/whatif", json=too_many)).json()["detail"][0]["msg"]
        assert "2560 points" in limit and "2048" in limit  # 64 x 8 x 5 > the limit, and it says so

    run_api(check)


RAW_BODIES: list[tuple[str, bytes]] = [
    ("not json", b"{not json"),
    ("truncated", json.dumps(BODY).encode()[:-5]),
    ("nan", json.dumps(with_(batch_sizes=[float("nan")])).encode()),
    ("infinity", json.dumps(with_(acceptance={"iid_rate": float("inf")})).encode()),
    ("deep nesting", b"[" * 3000 + b"]" * 3000),
    ("empty", b""),
    ("a json string", b'"h100"'),
    ("binary", bytes(range(256))),
]


def test_malformed_bodies_are_4xx() -> None:
    async def check(client: httpx.AsyncClient, _board: Board) -> None:
        for what, raw in RAW_BODIES:
            reply = await client.post("/v1/whatif", content=raw, headers={"content-type": "application/json"})
            assert 400 <= reply.status_code < 500, (what, reply.status_code, reply.text)
            assert "error" in reply.json(), what

    run_api(check)


def test_the_body_size_is_bounded_while_reading() -> None:
    padding = {"target_model": {"_name_or_path": "x" * (2 * SMALL_LIMIT)}}

    async def chunks() -> AsyncIterator[bytes]:
        data = json.dumps(with_(**padding)).encode()
        for start in range(0, len(data), 512):
            yield data[start : start + 512]

    async def check(client: httpx.AsyncClient, _board: Board) -> None:
        declared = await client.post("/v1/whatif", json=with_(**padding))
        assert declared.status_code == 413
        assert f"larger than {SMALL_LIMIT} bytes" in declared.json()["detail"]
        # Chunked: no Content-Length, so the limit is enforced on the bytes as they arrive.
        streamed = await client.post("/v1/whatif", content=chunks(), headers={"content-type": "application/json"})
        assert streamed.status_code == 413
        assert (await client.post("/v1/whatif", json=BODY)).status_code == 200  # under the limit

    run_api(check, max_body_bytes=SMALL_LIMIT)


def test_openapi_documents_both_endpoints() -> None:
    async def check(client: httpx.AsyncClient, _board: Board) -> None:
        schema = (await client.get("/openapi.json")).json()
        post = schema["paths"]["/v1/whatif"]["post"]
        body_schema = post["requestBody"]["content"]["application/json"]["schema"]
        assert body_schema == {"$ref": "#/components/schemas/WhatIfRequest"}
        gammas = schema["components"]["schemas"]["WhatIfRequest"]["properties"]["gammas"]
        assert gammas["items"]["maximum"] == 16 and gammas["maxItems"] == 17
        assert "/v1/schedule" in schema["paths"]

    run_api(check)


# ------------------------------------------------------------------------------------------------------------
# GET /v1/schedule
# ------------------------------------------------------------------------------------------------------------


def publish(board: Board, *, profiles: dict[str, str] = PROFILES) -> Evidence:
    evidence = live_evidence()
    board.publish("llama", evidence=evidence, decision=decision_for(evidence), good_scrape_s=1_000.0,
                  pricing=Pricing(profiles=profiles))
    return evidence


def test_schedule_for_a_live_target_is_ready_to_paste() -> None:
    async def check(client: httpx.AsyncClient, board: Board) -> None:
        evidence = publish(board)
        reply = await client.get("/v1/schedule", params={"target": "llama", "max_num_seqs": 128})
        assert reply.status_code == 200, reply.text
        (out,) = reply.json()["targets"]
        # Nothing fitted on this board yet: the uncalibrated profiles, and the reason says so.
        ask = ScheduleAsk(max_num_seqs=128, gamma_max=6)
        plan = inputs_from_evidence(evidence, catalog_context(), ask, scales=CostScales())
        expected = vllm_bands(schedule_for(plan))
        assert [[b["lo"], b["hi"], b["num_speculative_tokens"]] for b in out["bands"]] == expected
        assert out["state"] == "ok" and out["context_tokens"] == 900.0 and out["gamma_max"] == 6
        vllm = out["vllm"]
        assert vllm["speculative_config"]["num_speculative_tokens_per_batch_size"] == expected
        assert vllm["cli"].startswith("--speculative-config '") and vllm["cli"].endswith("'")
        assert json.loads(vllm["cli"].removeprefix("--speculative-config '")[:-1]) == vllm["speculative_config"]
        trt = out["trtllm"]
        assert yaml.safe_load(trt["yaml"]) == {"speculative_config": {
            k: ({int(key): value for key, value in v.items()} if isinstance(v, dict) else v)
            for k, v in trt["speculative_config"].items()
        }}
        # SGLang: one tier per band, keyed by its lower bound, the server flags naming the deepest K.
        sglang = out["sglang"]
        assert sglang["adaptive_config"] == {str(lo): {"candidate_steps": [k]} for lo, _, k in expected}
        assert sglang["cli"].endswith(f"--speculative-num-steps {max(k for _, _, k in expected)}")

    run_api(check)


def test_schedule_query_bounds_and_unknown_or_idle_targets() -> None:
    async def check(client: httpx.AsyncClient, board: Board) -> None:
        publish(board)
        everything = (await client.get("/v1/schedule")).json()["targets"]
        idle = next(t for t in everything if t["target"] == "idle")
        assert idle["state"] == "insufficient_data" and idle["bands"] == [] and idle["vllm"] is None
        unknown = await client.get("/v1/schedule", params={"target": "nope"})
        assert unknown.status_code == 404 and "configured: llama, idle" in unknown.json()["detail"]
        for params in ({"max_num_seqs": 0}, {"max_num_seqs": 10**6}, {"margin": -1}, {"context_tokens": -5},
                       {"k_max": 99}, {"max_num_seqs": "lots"}):
            bad = await client.get("/v1/schedule", params=params)
            assert bad.status_code == 422, params
            assert bad.json()["detail"][0]["loc"][0] == "query"
        override = (await client.get("/v1/schedule", params={"target": "llama", "context_tokens": 64,
                                                             "k_max": 2})).json()["targets"][0]
        assert override["context_tokens"] == 64.0
        assert max(b["num_speculative_tokens"] for b in override["bands"]) <= 2

    run_api(check)


def test_profiles_that_cannot_be_rebuilt_by_name_are_reported_or_taken_from_the_loop() -> None:
    custom = {**PROFILES, "model": "my-finetune"}

    async def by_name(client: httpx.AsyncClient, board: Board) -> None:
        publish(board, profiles=custom)
        (out,) = (await client.get("/v1/schedule", params={"target": "llama"})).json()["targets"]
        assert out["bands"] == [] and "cannot be rebuilt by name" in out["reason"]

    async def from_loop(client: httpx.AsyncClient, board: Board) -> None:
        publish(board, profiles=custom)
        (out,) = (await client.get("/v1/schedule", params={"target": "llama"})).json()["targets"]
        assert out["bands"] and out["vllm"]["speculative_config"]["method"] == "eagle3"

    run_api(by_name)
    run_api(from_loop, live=lambda board: live_targets_from_board(
        board, context_for=lambda name: catalog_context() if name == "llama" else None
    ))


def test_without_live_targets_only_the_whatif_works() -> None:
    async def check(client: httpx.AsyncClient, _board: Board) -> None:
        assert (await client.get("/v1/schedule")).json() == {"targets": []}
        assert (await client.get("/v1/schedule", params={"target": "llama"})).status_code == 404
        assert (await client.post("/v1/whatif", json=BODY)).status_code == 200

    run_api(check, live=lambda _board: None)


# ------------------------------------------------------------------------------------------------------------
# Through the real app (build_sidecar): the loop's exact profiles reach /v1/schedule
# ------------------------------------------------------------------------------------------------------------

# Llama-3.1-8B's shape, saved as a fine-tune the catalog does not know by name.
FINETUNE_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}


def test_the_sidecar_serves_whatif_and_exact_schedules_for_config_json_models_and_draft_models(
    tmp_path: Path,
) -> None:
    config_path = tmp_path / "my-finetune" / "config.json"
    config_path.parent.mkdir()
    config_path.write_text(json.dumps(FINETUNE_CONFIG), encoding="utf-8")
    model = model_from_hf_config(FINETUNE_CONFIG, name="my-finetune")
    expected_ctx = ModelContext(
        hardware=hardware_by_name("h100-sxm"), model=model,
        drafter=drafter_for(DraftMethod.DRAFT_MODEL, model, draft_model=model_by_name("llama-3.2-1b")),
    )

    async def scenario() -> None:
        capture = CaptureServer(FIXTURES / "synthetic-eagle-k3.txt")
        async with serving(capture) as capture_url:
            settings = load_settings(overrides={
                "targets": [{
                    "name": "llama", "url": capture_url, "hardware": "h100-sxm", "model_config_path": str(config_path),
                    "drafter": {"method": "draft_model", "draft_model_profile": "llama-3.2-1b"},
                }],
                "scrape_interval_s": 0.1, "scrape_timeout_s": 0.1,
                "estimator": {"window_s": 0.4, "stale_after_s": 0.5}, "gpu": {"telemetry": "none"},
            })
            sidecar = build_sidecar(settings, gpu_source=NoGpuSource())
            async with serving(sidecar.app) as url, httpx.AsyncClient(base_url=url, timeout=30.0) as client:
                await wait_for(client, "/v1/recommendation", lambda r: r.json()["targets"][0]["state"] == "ok")
                # Freeze the measurements: failed scrapes keep the window's numbers (the evidence goes stale).
                capture.status = 503
                await wait_for(client, "/v1/evidence", lambda r: r.json()["targets"][0]["state"] != "ok")
                status = sidecar.board.get("llama")
                assert status is not None and status.evidence is not None
                assert status.context == expected_ctx  # the loop published the profiles it priced with
                # The profile names alone cannot rebuild this context (a config.json model, a separate drafter).
                (by_name,) = live_targets_from_board(sidecar.board)()
                assert by_name.context is None and "cannot be rebuilt by name" in by_name.reason

                reply = await client.get("/v1/schedule", params={"target": "llama", "max_num_seqs": 128})
                assert reply.status_code == 200, reply.text
                (out,) = reply.json()["targets"]
                # The calibration the recommendation priced with, carried on the board: one for every answer.
                assert status.calibration is not None
                plan = inputs_from_evidence(
                    status.evidence, expected_ctx, ScheduleAsk(max_num_seqs=128, gamma_max=settings.decide.gamma_max),
                    scales=status.calibration.scales,
                )
                assert [[b["lo"], b["hi"], b["num_speculative_tokens"]] for b in out["bands"]] == vllm_bands(
                    schedule_for(plan)
                )
                assert out["gamma_max"] == settings.decide.gamma_max
                assert "from measured acceptance and the online calibration the recommendation" in out["reason"]

                whatif = await client.post("/v1/whatif", json=BODY)
                assert whatif.status_code == 200, whatif.text
                assert whatif.json() == run_whatif(WhatIfRequest.model_validate(BODY)).model_dump(mode="json")
                paths = (await client.get("/openapi.json")).json()["paths"]
                assert {"/v1/whatif", "/v1/schedule", "/v1/recommendation"} <= set(paths)

    asyncio.run(scenario())


def test_a_stated_draft_coverage_reaches_the_prices() -> None:
    # n-gram drafts on 58% of sequence-steps: the gamma-3 step emits 1 + 0.58 x (0.78 + 0.58 + 0.43) tokens.
    async def check(client: httpx.AsyncClient, _board: Board) -> None:
        body = with_(drafter={"method": "ngram"}, gammas=[0, 3],
                     acceptance={"per_position": [0.78, 0.58, 0.43], "draft_coverage": 0.58})
        reply = await client.post("/v1/whatif", json=body)
        assert reply.status_code == 200, reply.text
        lengths = [p["expected_accepted_length"] for p in reply.json()["points"] if p["gamma"] == 3]
        assert lengths and lengths == pytest.approx([1 + 0.58 * (0.78 + 0.58 + 0.43)] * len(lengths))

    run_api(check)


def test_a_stated_step_budget_reaches_the_prices() -> None:
    # 256 sequences at gamma 3 verify 1024 tokens: a 512-token budget holds 128 of them a step.
    async def check(client: httpx.AsyncClient, _board: Board) -> None:
        def speedups(answer: dict[str, Any]) -> list[float]:
            return [p["speedup"] for p in answer["points"] if p["gamma"] == 3 and p["batch"] == 256]

        body = with_(batch_sizes=[1, 256], gammas=[0, 3])
        free = await client.post("/v1/whatif", json=body)
        tight = await client.post("/v1/whatif", json={**body, "max_num_batched_tokens": 512})
        assert free.status_code == tight.status_code == 200, tight.text
        assert speedups(tight.json())[0] < speedups(free.json())[0]
        assert any("max_num_batched_tokens" in note for note in tight.json()["notes"])

    run_api(check)


def test_a_stated_prompt_length_reaches_a_moe_targets_prices() -> None:
    # Qwen3-30B-A3B at batch 4 with 200 prompt tokens a step: as whole 2000-token prompts in a tenth of the steps,
    # the other steps touch fewer experts than 200 prompt tokens in every step would, so the plain step is shorter.
    async def check(client: httpx.AsyncClient, _board: Board) -> None:
        def plain_step(answer: dict[str, Any]) -> float:
            return float(next(p["step_time_s"] for p in answer["points"] if p["gamma"] == 0))

        body = with_(target_model="qwen3-30b-a3b", batch_sizes=[4], context_lengths=[1024], gammas=[0, 3],
                     prefill_tokens_per_step=200)
        every = await client.post("/v1/whatif", json=body)
        chunked = await client.post("/v1/whatif", json={**body, "prompt_tokens": 2000})
        assert every.status_code == chunked.status_code == 200, chunked.text
        assert plain_step(chunked.json()) < plain_step(every.json())
        assert any("whole prompts of 2000 tokens" in note for note in chunked.json()["notes"])

    run_api(check)


def test_a_schedule_covers_the_targets_own_max_num_seqs_unless_asked_for_another() -> None:
    async def check(client: httpx.AsyncClient, board: Board) -> None:
        publish(board)
        (own,) = (await client.get("/v1/schedule", params={"target": "llama"})).json()["targets"]
        assert own["max_num_seqs"] == 64 and own["bands"][-1]["hi"] == 64
        (asked,) = (await client.get("/v1/schedule", params={"target": "llama", "max_num_seqs": 128})).json()[
            "targets"]
        assert asked["max_num_seqs"] == 128 and asked["bands"][-1]["hi"] == 128

    run_api(check, live=lambda board: live_targets_from_board(
        board, context_for=lambda name: replace(catalog_context(), max_num_seqs=64) if name == "llama" else None
    ))


def test_without_its_own_max_num_seqs_a_schedule_covers_vllms_default() -> None:
    async def check(client: httpx.AsyncClient, board: Board) -> None:
        publish(board)
        (out,) = (await client.get("/v1/schedule", params={"target": "llama"})).json()["targets"]
        assert out["max_num_seqs"] == 256 and out["bands"][-1]["hi"] == 256

    run_api(check)
