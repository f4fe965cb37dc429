"""A loopback kube-apiserver for the actuator tests: real HTTP on 127.0.0.1 (ephemeral port, in a thread), the part
of the Kubernetes API the actuators and `kubectl get/patch` use, with the real semantics:

- GET and PATCH of apps/v1 Deployments and gateway.networking.k8s.io/v1 HTTPRoutes in a namespace;
- coordination.k8s.io/v1 Leases (leader election): GET, POST (create: 201; 409 AlreadyExists when the name is
  taken), PUT (update: the body's metadata.resourceVersion must be the stored one, else 409 Conflict; none is 422
  Invalid, as Leases allow no unconditional update; a PUT of a missing Lease creates it, 201, as Leases allow create
  on update) and PATCH; the Lease's validation (leaseDurationSeconds > 0, leaseTransitions >= 0) and its MicroTime
  fields parsed with the API server's layout (six fraction digits; anything else is a 400 decode error) and stored
  in UTC; a name or namespace in the body other than the URL's is a 400; create is authorized without a name (RBAC
  cannot restrict create by resourceNames), so only a grant for every name ("*") allows it;
- patch types: JSON patch (RFC 6902, `test` included; a failed op is 422), JSON merge patch (RFC 7386), strategic
  merge patch for Deployments (merge keys: containers/initContainers/ephemeralContainers/env/volumes/volumeMounts/
  imagePullSecrets by name or mountPath, ports by containerPort, conditions by type; `$patch: replace|delete|merge`;
  lists without a merge key replaced) and 415 for HTTPRoutes (a CRD), apply patch 415 (not implemented here);
- `metadata.resourceVersion`: one counter for the store, bumped on every write (a no-op write writes nothing); a
  patched object whose resourceVersion differs from the stored one (i.e. the patch carried an older one) is a 409
  Conflict; `metadata.generation` bumped on spec changes; status cannot be changed through the main resource;
- `?dryRun=All`: the result without storing it;
- a changed Deployment pod template starts a rollout: status.observedGeneration lags until `finish_rollout`;
- bearer-token authentication (401) when configured; per (user, verb, resource, name) RBAC (403); 404;
- every error a `Status` object with the apiserver's reason, message and details;
- discovery (/version, /api, /apis, /api/v1, /apis/apps/v1, /apis/gateway.networking.k8s.io/v1) and GET of a
  namespace (kubectl asks after a 404) for kubectl. Plain http only: kubectl sends no bearer token over it, so
  kubectl runs against a server without authentication.
Test hooks: `put`, `get`, `find` (None when absent), `mutate` (a concurrent writer), `before_patch` (runs between a
PATCH's arrival and its write), `before_write` (the same for a POST or PUT), `finish_rollout`, and `requests` (what
arrived).
"""

from __future__ import annotations

import copy
import json
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

Json = Any

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"


@dataclass(frozen=True, slots=True)
class Kind:
    group: str
    version: str
    plural: str
    kind: str
    strategic: bool  # built-in types take strategic merge patches; CRDs do not
    short_names: tuple[str, ...] = ()
    verbs: tuple[str, ...] = ("get", "patch")  # what this server serves for the kind
    generation: bool = True  # the kind's strategy keeps metadata.generation (Leases' does not)
    create_on_update: bool = False  # a PUT of a missing object creates it (the strategy's AllowCreateOnUpdate)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_resource(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


DEPLOYMENTS = Kind("apps", "v1", "deployments", "Deployment", strategic=True, short_names=("deploy",))
HTTPROUTES = Kind("gateway.networking.k8s.io", "v1", "httproutes", "HTTPRoute", strategic=False)
NAMESPACES = Kind("", "v1", "namespaces", "Namespace", strategic=True, short_names=("ns",))
LEASES = Kind("coordination.k8s.io", "v1", "leases", "Lease", strategic=True,
              verbs=("create", "get", "patch", "update"), generation=False, create_on_update=True)
KINDS = {(k.group, k.version, k.plural): k for k in (DEPLOYMENTS, HTTPROUTES, LEASES)}


class ApiStatusError(Exception):
    """Answered as a `Status` object."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": self.message, "reason": self.reason, "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


def _invalid(message: str) -> ApiStatusError:
    return ApiStatusError(422, "Invalid", message)


def _bad_request(message: str) -> ApiStatusError:
    return ApiStatusError(400, "BadRequest", message)


# ----------------------------------------------------------------------------------------------------------------
# RFC 7386 JSON merge patch
# ----------------------------------------------------------------------------------------------------------------


def merge_patch(target: Json, patch: Json) -> Json:
    """RFC 7386 section 2: objects merge recursively, null deletes, anything else (lists too) replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# ----------------------------------------------------------------------------------------------------------------
# RFC 6902 JSON patch
# ----------------------------------------------------------------------------------------------------------------


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise _invalid(f"invalid JSON pointer {path!r}")
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _index(container: list[Any], token: str, *, for_add: bool) -> int:
    if for_add and token == "-":
        return len(container)
    if not token.isdigit() or (token != "0" and token.startswith("0")):
        raise _invalid(f"invalid array index {token!r}")
    index = int(token)
    if index > len(container) or (index == len(container) and not for_add):
        raise _invalid(f"array index {index} out of bounds")
    return index


def _parent(doc: Json, tokens: list[str]) -> Json:
    node = doc
    for token in tokens[:-1]:
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list):
            node = node[_index(node, token, for_add=False)]
        else:
            raise _invalid(f"path /{'/'.join(tokens)} does not exist")
    return node


def _get(doc: Json, path: str) -> Json:
    tokens = _pointer(path)
    if not tokens:
        return doc
    parent, last = _parent(doc, tokens), tokens[-1]
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    if isinstance(parent, list):
        return parent[_index(parent, last, for_add=False)]
    raise _invalid(f"path {path} does not exist")


def _add(doc: Json, path: str, value: Json) -> Json:
    tokens = _pointer(path)
    if not tokens:
        return copy.deepcopy(value)
    parent, last = _parent(doc, tokens), tokens[-1]
    if isinstance(parent, dict):
        parent[last] = copy.deepcopy(value)
    elif isinstance(parent, list):
        parent.insert(_index(parent, last, for_add=True), copy.deepcopy(value))
    else:
        raise _invalid(f"cannot add at {path}")
    return doc


def _remove(doc: Json, path: str) -> Json:
    tokens = _pointer(path)
    if not tokens:
        raise _invalid("cannot remove the whole document")
    parent, last = _parent(doc, tokens), tokens[-1]
    if isinstance(parent, dict) and last in parent:
        del parent[last]
    elif isinstance(parent, list):
        del parent[_index(parent, last, for_add=False)]
    else:
        raise _invalid(f"path {path} does not exist")
    return doc


def _op_replace(doc: Json, op: dict[str, Any]) -> Json:
    path = op["path"]
    _get(doc, path)  # must exist
    return _add(_remove(doc, path), path, op["value"]) if _pointer(path) else copy.deepcopy(op["value"])


def _op_move(doc: Json, op: dict[str, Any]) -> Json:
    value = copy.deepcopy(_get(doc, op["from"]))
    return _add(_remove(doc, op["from"]), op["path"], value)


def _op_test(doc: Json, op: dict[str, Any]) -> Json:
    if _get(doc, op["path"]) != op["value"]:
        raise _invalid(f"testing value {op['path']} failed")
    return doc


# RFC 6902 operation -> (document, operation) -> the document after it.
JSON_PATCH_OPS: dict[str, Callable[[Json, dict[str, Any]], Json]] = {
    "add": lambda doc, op: _add(doc, op["path"], op["value"]),
    "remove": lambda doc, op: _remove(doc, op["path"]),
    "replace": _op_replace,
    "move": _op_move,
    "copy": lambda doc, op: _add(doc, op["path"], copy.deepcopy(_get(doc, op["from"]))),
    "test": _op_test,
}


def json_patch(doc: Json, operations: Json) -> Json:
    """RFC 6902: add, remove, replace, move, copy, test, applied in order, all or nothing."""
    if not isinstance(operations, list):
        raise _bad_request("json patch must be a list of operations")
    doc = copy.deepcopy(doc)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise _bad_request(f"invalid json patch operation {op!r}")
        kind = op["op"]
        if kind in ("add", "replace", "test") and "value" not in op:
            raise _bad_request(f"{kind} operation without a value")
        apply = JSON_PATCH_OPS.get(kind) if isinstance(kind, str) else None
        if apply is None:
            raise _bad_request(f"unknown json patch operation {kind!r}")
        doc = apply(doc, op)
    return doc


# ----------------------------------------------------------------------------------------------------------------
# Strategic merge patch (the Deployment schema's merge keys)
# ----------------------------------------------------------------------------------------------------------------

# Field name -> patchMergeKey, for the lists of a Deployment that have patchStrategy "merge" (k8s.io/api).
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "imagePullSecrets": "name",
    "ports": "containerPort",
    "conditions": "type",
    "ownerReferences": "uid",
    "hostAliases": "ip",
}


def strategic_merge_patch(target: Json, patch: Json, field_name: str | None = None) -> Json:
    """Kubernetes strategic merge patch for the fields above: maps merge, null deletes, `$patch: replace` replaces
    a map (or a list, as an element), `$patch: delete` deletes a map (or a list element by merge key), lists with a
    merge key merge element by element (new ones appended), other lists are replaced."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    body = {k: v for k, v in patch.items() if k != "$patch"}
    if directive == "replace":
        return copy.deepcopy(body)
    if directive == "delete":
        return None
    if directive not in (None, "merge"):
        raise _bad_request(f"unknown patch type {directive!r}")
    unsupported = next((key for key in body if key.startswith("$")), None)
    if unsupported is not None:
        raise _bad_request(f"the directive {unsupported!r} is not supported by this test apiserver")
    return _merge_map(target, body)


def _merge_map(target: Json, body: dict[str, Any]) -> dict[str, Any]:
    """`body`'s keys merged into the map `target` (strategic merge patch, no directive left in `body`)."""
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in body.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and key in MERGE_KEYS:
            result[key] = _merge_list(result.get(key) or [], value, MERGE_KEYS[key])
        elif isinstance(value, dict):
            merged = strategic_merge_patch(result.get(key), value, key)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        else:
            result[key] = copy.deepcopy(value)
    return result


def _merge_list(original: list[Any], patch: list[Any], key: str) -> list[Any]:
    if any(isinstance(e, dict) and e.get("$patch") == "replace" for e in patch):
        return [copy.deepcopy(e) for e in patch if not (isinstance(e, dict) and "$patch" in e)]
    result = [copy.deepcopy(e) for e in original]
    for element in patch:
        if not isinstance(element, dict) or key not in element:
            raise _bad_request(f"map in a list with merge key {key!r} has no {key!r}: {element!r}")
        position = next((i for i, e in enumerate(result) if isinstance(e, dict) and e.get(key) == element[key]), None)
        if element.get("$patch") == "delete":
            if position is not None:
                del result[position]
            continue
        if position is None:
            result.append(strategic_merge_patch({}, element))
        else:
            result[position] = strategic_merge_patch(result[position], element)
    return result


# ----------------------------------------------------------------------------------------------------------------
# Validation (the few rules a patch of ours could break)
# ----------------------------------------------------------------------------------------------------------------


def _validate_deployment(obj: dict[str, Any]) -> None:
    if not isinstance((obj.get("spec") or {}).get("selector"), dict):
        raise _invalid("spec.selector: Required value")
    containers = (((obj.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers")
    if not isinstance(containers, list) or not containers:
        raise _invalid("spec.template.spec.containers: Required value")
    names = [c.get("name") if isinstance(c, dict) else None for c in containers]
    if not all(isinstance(n, str) and n for n in names) or len(set(names)) != len(names):
        raise _invalid(f"spec.template.spec.containers: names must be unique and non-empty: {names!r}")
    for container in containers:
        for name in ("command", "args"):
            value = container.get(name)
            if value is not None and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
                raise _invalid(f"spec.template.spec.containers[{container['name']}].{name}: must be strings")


def _validate_httproute(obj: dict[str, Any]) -> None:
    for rule in (obj.get("spec") or {}).get("rules") or []:
        for ref in rule.get("backendRefs") or []:
            weight = ref.get("weight", 1)
            if not isinstance(weight, int) or not 0 <= weight <= 1_000_000:
                raise _invalid(f"spec.rules.backendRefs.weight: Invalid value: {weight!r}")


# metav1.MicroTime's wire format: Go's layout "2006-01-02T15:04:05.000000Z07:00", exactly six fraction digits.
_MICRO_TIME = re.compile(r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})\.(\d{6})(Z|[+-]\d{2}:\d{2})$")
_LEASE_TIMES = ("acquireTime", "renewTime")


def _decode_lease(obj: dict[str, Any]) -> None:
    """The decoding step of a Lease body (before validation): its MicroTimes parsed with the API server's layout and
    stored as it writes them, in UTC; a value it cannot parse fails the request as a 400, as the real decoder does."""
    spec = obj.get("spec")
    if spec is None:
        return
    if not isinstance(spec, dict):
        raise _bad_request('Lease in version "v1" cannot be handled as a Lease: spec: expected an object')
    for name in _LEASE_TIMES:
        value = spec.get(name)
        if value is None:
            continue
        stored = _micro_time(value)
        if stored is None:
            raise _bad_request(
                f'Lease in version "v1" cannot be handled as a Lease: parsing time {json.dumps(value)} as '
                '"2006-01-02T15:04:05.000000Z07:00": cannot parse as RFC3339Micro'
            )
        spec[name] = stored


def _micro_time(value: object) -> str | None:
    """`value` as the API server stores a MicroTime (UTC, six fraction digits), None when it cannot parse it."""
    match = _MICRO_TIME.match(value) if isinstance(value, str) else None
    if match is None:
        return None
    try:
        parsed = datetime.fromisoformat(f"{match[1]}.{match[2]}{'+00:00' if match[3] == 'Z' else match[3]}")
    except ValueError:
        return None
    return parsed.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _validate_lease(obj: dict[str, Any]) -> None:
    """k8s.io/kubernetes/pkg/apis/coordination/validation ValidateLeaseSpec (the fields leader election writes)."""
    spec = obj.get("spec") or {}
    name = (obj.get("metadata") or {}).get("name")
    duration, transitions = spec.get("leaseDurationSeconds"), spec.get("leaseTransitions")
    problems = []
    if duration is not None and (not isinstance(duration, int) or duration <= 0):
        problems.append(f"spec.leaseDurationSeconds: Invalid value: {duration}: must be greater than 0")
    if transitions is not None and (not isinstance(transitions, int) or transitions < 0):
        problems.append(f"spec.leaseTransitions: Invalid value: {transitions}: must be greater than or equal to 0")
    if problems:
        raise ApiStatusError(
            422, "Invalid", f'Lease.coordination.k8s.io "{name}" is invalid: {", ".join(problems)}',
            {"name": name, "group": "coordination.k8s.io", "kind": "Lease"},
        )


# The kinds whose writes are validated, and how.
VALIDATORS: dict[Kind, Callable[[dict[str, Any]], None]] = {
    DEPLOYMENTS: _validate_deployment,
    HTTPROUTES: _validate_httproute,
    LEASES: _validate_lease,
}


def _validate(kind: Kind, obj: dict[str, Any]) -> None:
    validator = VALIDATORS.get(kind)
    if validator is not None:
        validator(obj)


# ----------------------------------------------------------------------------------------------------------------
# The server
# ----------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    method: str
    path: str
    content_type: str | None
    user: str | None


@dataclass
class _State:
    objects: dict[tuple[Kind, str, str], dict[str, Any]] = field(default_factory=dict)
    revision: int = 100
    requests: list[RecordedRequest] = field(default_factory=list)


class FakeKubeApiServer:
    """Run with `with FakeKubeApiServer(...) as api:`; `api.url` is its base URL.

    `tokens` maps bearer tokens to user names (None: no authentication, every request is user None). `grants` is the
    RBAC: (user, verb, plural, name) tuples ("*" wildcards any part); None allows everything.
    """

    def __init__(
        self,
        *,
        tokens: dict[str, str] | None = None,
        grants: set[tuple[str, str, str, str]] | None = None,
    ) -> None:
        self.tokens = tokens
        self.grants = grants
        self.before_patch: Callable[[], None] | None = None
        self.before_write: Callable[[], None] | None = None
        self._state = _State()
        self._lock = threading.RLock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, name="fake-kube-apiserver", daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> FakeKubeApiServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    # -- test hooks --------------------------------------------------------------------------------------------

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._state.requests)

    def put(self, kind: Kind, obj: dict[str, Any]) -> dict[str, Any]:
        """Create (or replace) an object as its owner would; a new one starts at generation 1."""
        obj = copy.deepcopy(obj)
        metadata = obj.setdefault("metadata", {})
        key = (kind, metadata.get("namespace", "default"), metadata["name"])
        with self._lock:
            old = self._state.objects.get(key)
            obj["apiVersion"], obj["kind"] = kind.api_version, kind.kind
            metadata["namespace"] = key[1]
            metadata["uid"] = old["metadata"]["uid"] if old else str(uuid.uuid4())
            metadata["creationTimestamp"] = "2026-01-01T00:00:00Z"
            if kind.generation:
                metadata["generation"] = (old["metadata"]["generation"] + 1) if old else 1
            self._write(key, obj)
            return copy.deepcopy(obj)

    def get(self, kind: Kind, namespace: str, name: str) -> dict[str, Any]:
        with self._lock:
            return copy.deepcopy(self._state.objects[(kind, namespace, name)])

    def find(self, kind: Kind, namespace: str, name: str) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        with self._lock:
            obj = self._state.objects.get((kind, namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def mutate(self, kind: Kind, namespace: str, name: str, change: Callable[[dict[str, Any]], None]) -> None:
        """Another writer: `change` edits the object in place; stored with the usual write rules."""
        with self._lock:
            old = self._state.objects[(kind, namespace, name)]
            new = copy.deepcopy(old)
            change(new)
            self._store(kind, (kind, namespace, name), old, new, keep_status=False)

    def finish_rollout(self, namespace: str, name: str) -> None:
        """The Deployment controller finished: every replica updated, ready and available at the latest generation."""

        def done(deployment: dict[str, Any]) -> None:
            replicas = (deployment.get("spec") or {}).get("replicas", 1)
            deployment["status"] = {
                "observedGeneration": deployment["metadata"]["generation"],
                "replicas": replicas, "updatedReplicas": replicas, "readyReplicas": replicas,
                "availableReplicas": replicas,
                "conditions": [
                    {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"},
                    {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable",
                     "message": f'ReplicaSet "{name}-1" has successfully progressed.'},
                ],
            }

        self.mutate(DEPLOYMENTS, namespace, name, done)

    # -- storage -----------------------------------------------------------------------------------------------

    def _write(self, key: tuple[Kind, str, str], obj: dict[str, Any]) -> None:
        self._state.revision += 1
        obj["metadata"]["resourceVersion"] = str(self._state.revision)
        self._state.objects[key] = obj

    def _store(
        self, kind: Kind, key: tuple[Kind, str, str], old: dict[str, Any], new: dict[str, Any], *, keep_status: bool
    ) -> dict[str, Any]:
        for immutable in ("name", "namespace", "uid", "creationTimestamp"):
            if new.get("metadata", {}).get(immutable) != old["metadata"].get(immutable):
                raise _bad_request(f"metadata.{immutable}: field is immutable")
        new["apiVersion"], new["kind"] = kind.api_version, kind.kind
        if keep_status:  # the status subresource: the main resource cannot change it
            if "status" in old:
                new["status"] = copy.deepcopy(old["status"])
            else:
                new.pop("status", None)
        _validate(kind, new)
        if kind.generation:
            new["metadata"]["generation"] = old["metadata"]["generation"]
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        if new == old:
            return copy.deepcopy(old)  # a no-op write is not written
        if kind.generation and new.get("spec") != old.get("spec"):
            new["metadata"]["generation"] += 1
        self._write(key, new)
        return copy.deepcopy(new)

    # -- requests ----------------------------------------------------------------------------------------------

    def authenticate(self, authorization: str | None) -> str | None:
        if self.tokens is None:
            return None
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or token.strip() not in self.tokens:
            raise ApiStatusError(401, "Unauthorized", "Unauthorized")
        return self.tokens[token.strip()]

    def authorize(self, user: str | None, verb: str, kind: Kind, namespace: str, name: str) -> None:
        if self.grants is None:
            return
        for grant in self.grants:
            # A create names no object (the authorizer sees an empty name): only a grant for every name matches.
            if all(g in ("*", want) for g, want in zip(grant, (user, verb, kind.plural, name), strict=True)):
                return
        subject = f'{kind.group_resource} "{name}"' if name else kind.group_resource
        raise ApiStatusError(
            403, "Forbidden",
            f'{subject} is forbidden: User "{user}" cannot {verb} resource "{kind.plural}" in '
            f'API group "{kind.group}" in the namespace "{namespace}"',
            {"name": name, "group": kind.group, "kind": kind.plural},
        )

    def lookup(self, kind: Kind, namespace: str, name: str) -> dict[str, Any]:
        obj = self._state.objects.get((kind, namespace, name))
        if obj is None:
            raise ApiStatusError(
                404, "NotFound", f'{kind.group_resource} "{name}" not found',
                {"name": name, "group": kind.group, "kind": kind.plural},
            )
        return obj

    def patch(
        self, kind: Kind, namespace: str, name: str, content_type: str, body: bytes, *, dry_run: bool
    ) -> dict[str, Any]:
        _check_patch_type(kind, content_type)
        try:
            patch = json.loads(body)
        except json.JSONDecodeError as exc:
            raise _bad_request(f"error decoding patch: {exc}") from exc
        if self.before_patch is not None:
            hook, self.before_patch = self.before_patch, None
            hook()  # a writer that gets in between: the patch below must notice
        with self._lock:
            key = (kind, namespace, name)
            old = self.lookup(kind, namespace, name)
            new = _patched(old, content_type, patch)
            sent_version = new["metadata"].get("resourceVersion")
            if sent_version is not None and sent_version != old["metadata"]["resourceVersion"]:
                raise _conflict(kind, name)
            if dry_run:
                preview = copy.deepcopy(new)
                preview["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
                return preview
            return self._store(kind, key, old, new, keep_status=True)

    def create(self, kind: Kind, namespace: str, body: bytes) -> dict[str, Any]:
        """POST to the collection: a new object (201), or 409 AlreadyExists when its name is taken."""
        obj = self._decoded(kind, namespace, body)
        name = obj["metadata"].get("name")
        if not name:
            raise ApiStatusError(
                422, "Invalid", f"{kind.kind}.{kind.group} \"\" is invalid: metadata.name: Required value: name or "
                "generateName is required", {"group": kind.group, "kind": kind.kind},
            )
        self._before_write()
        with self._lock:
            key = (kind, namespace, name)
            if key in self._state.objects:
                raise ApiStatusError(
                    409, "AlreadyExists", f'{kind.group_resource} "{name}" already exists',
                    {"name": name, "group": kind.group, "kind": kind.plural},
                )
            return self._insert(kind, key, obj)

    def update(self, kind: Kind, namespace: str, name: str, body: bytes) -> tuple[int, dict[str, Any]]:
        """PUT of the whole object, guarded by the body's metadata.resourceVersion: (200, stored), or (201, stored)
        when a kind that allows create on update did not exist."""
        obj = self._decoded(kind, namespace, body)
        if obj["metadata"].get("name") != name:
            raise _bad_request(
                f"the name of the object ({obj['metadata'].get('name')}) does not match the name on the URL ({name})"
            )
        self._before_write()
        with self._lock:
            key = (kind, namespace, name)
            old = self._state.objects.get(key)
            if old is None:
                if not kind.create_on_update:
                    self.lookup(kind, namespace, name)  # raises the 404
                return 201, self._insert(kind, key, obj)
            sent_version = obj["metadata"].get("resourceVersion")
            if not sent_version:
                raise ApiStatusError(
                    422, "Invalid", f'{kind.kind}.{kind.group} "{name}" is invalid: metadata.resourceVersion: Invalid '
                    "value: 0x0: must be specified for an update", {"name": name, "group": kind.group,
                                                                    "kind": kind.kind},
                )
            if sent_version != old["metadata"]["resourceVersion"]:
                raise _conflict(kind, name)
            new = copy.deepcopy(obj)
            for system in ("uid", "creationTimestamp"):  # kept from the stored object when the body leaves them out
                new["metadata"].setdefault(system, old["metadata"][system])
            return 200, self._store(kind, key, old, new, keep_status=True)

    def _decoded(self, kind: Kind, namespace: str, body: bytes) -> dict[str, Any]:
        """The request body as an object of `kind` in `namespace` (400 for anything the decoder refuses)."""
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as exc:
            raise _bad_request(f"error decoding the body: {exc}") from exc
        if not isinstance(obj, dict):
            raise _bad_request(f"the body of a {kind.kind} must be a JSON object")
        if obj.get("kind", kind.kind) != kind.kind or obj.get("apiVersion", kind.api_version) != kind.api_version:
            raise _bad_request(
                f"the API version in the data ({obj.get('apiVersion')}) does not match the expected API version "
                f"({kind.api_version})" if obj.get("kind", kind.kind) == kind.kind else
                f"the kind in the data ({obj.get('kind')}) does not match the expected kind ({kind.kind})"
            )
        metadata = obj.setdefault("metadata", {})
        if not isinstance(metadata, dict):
            raise _bad_request("metadata must be an object")
        if metadata.setdefault("namespace", namespace) != namespace:
            raise _bad_request(
                "the namespace of the provided object does not match the namespace sent on the request"
            )
        if kind is LEASES:
            _decode_lease(obj)
        return obj

    def _insert(self, kind: Kind, key: tuple[Kind, str, str], obj: dict[str, Any]) -> dict[str, Any]:
        """Store a new object with the system fields a create sets (called with the lock held)."""
        obj = copy.deepcopy(obj)
        obj["apiVersion"], obj["kind"] = kind.api_version, kind.kind
        metadata = obj["metadata"]
        metadata["uid"] = str(uuid.uuid4())
        metadata["creationTimestamp"] = "2026-01-01T00:00:00Z"
        if kind.generation:
            metadata["generation"] = 1
        _validate(kind, obj)
        self._write(key, obj)
        return copy.deepcopy(obj)

    def _before_write(self) -> None:
        if self.before_write is not None:
            hook, self.before_write = self.before_write, None
            hook()  # a writer that gets in between: the write below must notice

    def record(self, request: RecordedRequest) -> None:
        with self._lock:
            self._state.requests.append(request)


def _conflict(kind: Kind, name: str) -> ApiStatusError:
    """The API server's answer to a write carrying a resourceVersion other than the stored one."""
    return ApiStatusError(
        409, "Conflict",
        f'Operation cannot be fulfilled on {kind.group_resource} "{name}": the object has been modified; '
        "please apply your changes to the latest version and try again",
        {"name": name, "group": kind.group, "kind": kind.plural},
    )


def _check_patch_type(kind: Kind, content_type: str) -> None:
    """415 unless `kind` takes patches of `content_type` (strategic merge only for built-in types)."""
    if (content_type == STRATEGIC_PATCH and not kind.strategic) or content_type not in (
        JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH
    ):
        accepted = [JSON_PATCH, MERGE_PATCH] + ([STRATEGIC_PATCH] if kind.strategic else [])
        raise ApiStatusError(
            415, "UnsupportedMediaType",
            f"the body of the request was in an unknown format - accepted media types include: "
            f"{', '.join(accepted)}",
        )


def _patched(old: dict[str, Any], content_type: str, patch: Json) -> dict[str, Any]:
    """A copy of `old` with `patch` (of an accepted `content_type`) applied, with a metadata map."""
    if content_type == JSON_PATCH:
        new = json_patch(old, patch)
    elif content_type == MERGE_PATCH:
        if not isinstance(patch, dict):
            raise _bad_request("merge patch must be a JSON object")
        new = merge_patch(old, patch)
    else:
        if not isinstance(patch, dict):
            raise _bad_request("strategic merge patch must be a JSON object")
        new = strategic_merge_patch(old, patch)
    if not isinstance(new, dict):
        raise _bad_request("the patched object is not an object")
    new = copy.deepcopy(new)
    new.setdefault("metadata", {})
    return new


# ----------------------------------------------------------------------------------------------------------------
# HTTP
# ----------------------------------------------------------------------------------------------------------------


def _resource_list(kind: Kind) -> dict[str, Any]:
    return {
        "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": kind.api_version,
        "resources": [{
            "name": kind.plural, "singularName": kind.kind.lower(), "namespaced": True, "kind": kind.kind,
            "verbs": list(kind.verbs), "shortNames": list(kind.short_names),
        }],
    }


def _group(kind: Kind) -> dict[str, Any]:
    version = {"groupVersion": kind.api_version, "version": kind.version}
    return {"name": kind.group, "versions": [version], "preferredVersion": version}


DISCOVERY: dict[str, Any] = {
    "/version": {"major": "1", "minor": "33", "gitVersion": "v1.33.0-fake", "platform": "linux/amd64"},
    "/api": {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []},
    "/api/v1": {**_resource_list(NAMESPACES), "resources": [
        {**_resource_list(NAMESPACES)["resources"][0], "namespaced": False, "verbs": ["get"]}]},
    "/apis": {"kind": "APIGroupList", "apiVersion": "v1",
              "groups": [_group(DEPLOYMENTS), _group(HTTPROUTES), _group(LEASES)]},
    "/apis/apps/v1": _resource_list(DEPLOYMENTS),
    "/apis/gateway.networking.k8s.io/v1": _resource_list(HTTPROUTES),
    "/apis/coordination.k8s.io/v1": _resource_list(LEASES),
}


def _route(path: str) -> tuple[Kind, str, str | None] | None:
    """(kind, namespace, name) of a request path; name None for a collection (where a POST creates)."""
    parts = path.strip("/").split("/")
    if len(parts) == 4 and parts[:3] == ["api", "v1", "namespaces"]:
        return NAMESPACES, parts[3], parts[3]  # kubectl asks whether the namespace exists after a 404
    # /apis/{group}/{version}/namespaces/{namespace}/{plural}[/{name}]
    if len(parts) in (6, 7) and parts[0] == "apis" and parts[3] == "namespaces":
        kind = KINDS.get((parts[1], parts[2], parts[5]))
        if kind is not None:
            return kind, parts[4], parts[6] if len(parts) == 7 else None
    return None


def _serve(
    api: FakeKubeApiServer, verb: str, target: tuple[Kind, str, str | None], body: bytes, content_type: str, *,
    dry_run: bool,
) -> tuple[int, dict[str, Any]]:
    """(status code, body) of an authorized request for `target` (kind, namespace, name; no name: the collection)."""
    kind, namespace, name = target
    if name is None:
        return 201, api.create(kind, namespace, body)
    if verb == "update":
        return api.update(kind, namespace, name, body)
    if kind is NAMESPACES:
        if verb != "get" or not any(ns == namespace for _, ns, _ in api._state.objects):
            raise ApiStatusError(404, "NotFound", f'namespaces "{name}" not found',
                                 {"name": name, "kind": "namespaces"})
        return 200, {"kind": "Namespace", "apiVersion": "v1", "metadata": {"name": name}, "status": {"phase": "Active"}}
    if verb == "get":
        with api._lock:
            return 200, copy.deepcopy(api.lookup(kind, namespace, name))
    return 200, api.patch(kind, namespace, name, content_type, body, dry_run=dry_run)


def _handler_for(api: FakeKubeApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # quiet in tests
            pass

        def _send(self, code: int, body: dict[str, Any]) -> None:
            payload = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def _body(self) -> bytes:
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length else b""

        def _handle(self, verb: str) -> None:
            url = urlsplit(self.path)
            body = self._body()
            content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip() or None
            try:
                user = api.authenticate(self.headers.get("Authorization"))
                api.record(RecordedRequest(self.command, url.path, content_type, user))
                if verb == "get" and url.path in DISCOVERY:
                    self._send(200, DISCOVERY[url.path])
                    return
                target = _route(url.path)
                if target is None:
                    raise ApiStatusError(404, "NotFound", "the server could not find the requested resource")
                kind, namespace, name = target
                if verb not in kind.verbs or (name is None) != (verb == "create"):
                    raise ApiStatusError(405, "MethodNotAllowed", f"{verb} is not supported by this test apiserver")
                api.authorize(user, verb, kind, namespace, name or "")
                dry_run = "All" in parse_qs(url.query).get("dryRun", [])
                self._send(*_serve(api, verb, (kind, namespace, name), body, content_type or "", dry_run=dry_run))
            except ApiStatusError as error:
                self._send(error.code, error.status())

        def do_GET(self) -> None:
            self._handle("get")

        def do_PATCH(self) -> None:
            self._handle("patch")

        def do_PUT(self) -> None:
            self._handle("update")

        def do_POST(self) -> None:
            self._handle("create")

        def do_DELETE(self) -> None:
            self._handle("delete")

    return Handler


def patches(requests: list[RecordedRequest]) -> Iterator[RecordedRequest]:
    """The PATCH requests among `requests`."""
    return (r for r in requests if r.method == "PATCH")
