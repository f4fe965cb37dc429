"""Every field of every wire model (service/http/api.py, whatif.py, actions.py, audit.py) carries a description, and the
OpenAPI schema the app serves at /openapi.json (and /docs) shows it to operators."""

from __future__ import annotations

import inspect
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import BaseModel

import service.http.actions as actions_module
import service.http.api as api_module
import service.http.audit as audit_module
import service.http.routes as routes_module
import service.http.whatif as whatif_module
from policies.act.gate import ActuationConfig
from service.actuators.audit import AuditLog
from service.actuators.runner import ActuationRunner, RunnerOptions
from service.board import Board
from service.exporter import MetricsPage
from service.http.actions import create_actions_router
from service.http.api import ApiExtensions, create_api
from service.http.routes import create_routes_router
from service.http.whatif import create_whatif_router

MODULES: tuple[ModuleType, ...] = (api_module, whatif_module, actions_module, audit_module, routes_module)


def wire_models() -> dict[str, type[BaseModel]]:
    """The pydantic models with fields defined in the three HTTP modules (not imported ones), by class name."""
    models: dict[str, type[BaseModel]] = {}
    for module in MODULES:
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, BaseModel) and cls.__module__ == module.__name__ and cls.model_fields:
                # (Field-less bases such as each module's _Strict have nothing to document.)
                assert name not in models, f"two wire models named {name}: their OpenAPI schemas would collide"
                models[name] = cls
    return models


def test_the_walk_finds_the_models() -> None:
    models = wire_models()
    # Request and response models of every router: a walk that found nothing would pass vacuously.
    assert {"RecommendationOut", "EvidenceOut", "WhatIfRequest", "ScheduleOut", "OverrideIn", "ActionsOut"} <= set(
        models
    )


def test_every_wire_model_field_has_a_description() -> None:
    missing = [
        f"{cls.__module__}.{name}.{field}"
        for name, cls in sorted(wire_models().items())
        for field, info in cls.model_fields.items()
        if not (info.description or "").strip()
    ]
    assert not missing, f"{len(missing)} fields without a description:\n" + "\n".join(missing)


def full_app(tmp_path: Path) -> Any:
    """The API with the what-if router and the actions router with its write endpoints (a runner and a token), so
    every request and response model is in the schema."""
    board = Board([("a", None)], started_at_s=0.0)
    runner = ActuationRunner(
        board, {}, audit=AuditLog(tmp_path / "actions.jsonl"),
        options=RunnerOptions(mode="kubernetes", config=ActuationConfig()),
    )
    routers = [create_whatif_router(), create_actions_router(runner, None, clock=lambda: 0.0, token="t"),
               create_routes_router(board, {"a": "code"})]
    return create_api(
        board, metrics=MetricsPage(board, clock=lambda: 0.0, version="t"), clock=lambda: 0.0, stall_after_s=15.0,
        version="t", extensions=ApiExtensions(routers=routers),
    )


def test_the_served_openapi_schema_documents_every_field(tmp_path: Path) -> None:
    schemas: dict[str, Any] = full_app(tmp_path).openapi()["components"]["schemas"]
    models = wire_models()
    missing: list[str] = []
    seen: set[str] = set()
    for component, schema in schemas.items():
        # FastAPI names a model used both ways Name-Input / Name-Output.
        name = component.removesuffix("-Input").removesuffix("-Output")
        if name not in models:
            continue
        seen.add(name)
        for field, prop in schema.get("properties", {}).items():
            if not str(prop.get("description", "")).strip():
                missing.append(f"{component}.{field}")
    assert not missing, f"{len(missing)} OpenAPI properties without a description:\n" + "\n".join(missing)
    # Every model reaches the schema (one only used internally would escape this check silently).
    unserved = sorted(set(models) - seen)
    assert not unserved, f"wire models missing from the OpenAPI schema: {unserved}"
