"""What an actuator reads from and writes to a deployment, as frozen values the pure actuation gate can reason about.

An actuator (`service.actuators`) turns a live Kubernetes object into a `DeploymentObservation` and a
`SpeculationSetting` into a patch; `policies.act.gate` decides, from a `Decision` and an observation, whether to
act. Neither side sees the other's I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class ActuatorError(StrEnum):
    """Why an actuator could not read or change the deployment: a closed set, used as a metric label and in the
    audit log. Anything not listed is `UNEXPECTED` (with the detail in the log)."""

    UNREACHABLE = "unreachable"  # API server did not answer (connect error, timeout, 5xx)
    UNAUTHORIZED = "unauthorized"  # 401: no or bad credentials
    FORBIDDEN = "forbidden"  # 403: RBAC does not grant the verb on the object
    NOT_FOUND = "not_found"  # 404: no such Deployment / HTTPRoute
    CONFLICT = "conflict"  # 409, or the object changed since it was read (another writer)
    NO_VLLM_CONTAINER = "no_vllm_container"  # the pod template has no container we can identify as vLLM
    MALFORMED_ARGS = "malformed_args"  # args/command in a form we cannot edit safely (e.g. one shell string)
    NO_SPECULATIVE_CONFIG = "no_speculative_config"  # asked to turn on, but no speculative config is known
    NO_BACKEND = "no_backend"  # routing: the HTTPRoute lacks the speculation-on or -off backendRef
    INVALID = "invalid"  # 422 / 400 / 415: the API server rejected the patch
    UNEXPECTED = "unexpected"


@dataclass(frozen=True, slots=True)
class SpeculationSetting:
    """What the engine runs (or should run).

    `num_speculative_tokens` 0 means speculation off. `schedule` is vLLM Dynamic SD's
    `num_speculative_tokens_per_batch_size` as ascending (max batch size, k) bands; empty for a fixed k. Example:
    SpeculationSetting(3, schedule=((8, 3), (32, 1), (256, 0))) = k 3 up to batch 8, 1 up to 32, off above.
    """

    num_speculative_tokens: int
    schedule: tuple[tuple[int, int], ...] = ()

    @property
    def enabled(self) -> bool:
        return self.num_speculative_tokens > 0 or any(k > 0 for _, k in self.schedule)


@dataclass(frozen=True, slots=True)
class EngineFlags:
    """vLLM's parallelism and scheduler limits as the managed container's args give them; None where the args leave a
    flag out (vLLM's default applies, which the args do not show). Each given value is an integer >= 1.

    `tensor_parallel_size` (--tensor-parallel-size / -tp): GPUs one replica's layers are sharded over;
    `pipeline_parallel_size` (--pipeline-parallel-size / -pp): stages its layers are split into; `max_num_seqs`
    (--max-num-seqs): the most sequences a step runs; `max_num_batched_tokens` (--max-num-batched-tokens): the most
    tokens a step computes. `unreadable`: (field, text) of each flag given a value that could not be read (an
    unset `$(VAR)`, a word that is not an integer). Example: args [..., "-tp", "2", "--max-num-seqs=128"] ->
    EngineFlags(tensor_parallel_size=2, max_num_seqs=128).
    """

    tensor_parallel_size: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    pipeline_parallel_size: int | None = None
    unreadable: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        for name in ("tensor_parallel_size", "max_num_seqs", "max_num_batched_tokens", "pipeline_parallel_size"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be an integer >= 1 or None, got {value!r}")


@dataclass(frozen=True, slots=True)
class DeploymentObservation:
    """One read of the object the actuator manages, at `at_s` (Unix seconds).

    `setting` is None when it could not be read; then `error` says why and `detail` says what. For routing,
    `setting` is the pool that carries the traffic (num_speculative_tokens of the on-pool when its weight share is
    at least half, else 0) and `on_weight_share` the on-pool's share of the weights in [0, 1]. `engine`: the vLLM
    container's parallelism and scheduler flags (a Deployment's; None where they were not read);
    `engine_mismatch`: how they differ from the engine the advice was priced for (policies/act/engine.py), filled
    in by whoever knows both (the actuation runner); None when they agree or were not compared (no flags read, as
    in routing and shadow modes, or no priced context yet).
    """

    at_s: float
    setting: SpeculationSetting | None
    rollout_in_progress: bool
    resource_version: str | None = None
    on_weight_share: float | None = None
    error: ActuatorError | None = None
    detail: str = ""
    engine: EngineFlags | None = None
    engine_mismatch: str | None = None


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """The outcome of one attempted change. `patch` is the exact body sent (or, in dry run, that would be sent),
    None when nothing needed sending; `patch_type` its content type: "application/strategic-merge-patch+json" for
    a Deployment (a patch naming the vLLM container, with `metadata.resourceVersion` so a concurrent writer gets a
    409), "application/merge-patch+json" for an HTTPRoute. `error` is None when it was accepted."""

    applied: bool
    dry_run: bool
    patch: object | None
    patch_type: str | None
    error: ActuatorError | None = None
    detail: str = ""
    resource_version: str | None = None  # of the object after the patch, when applied
