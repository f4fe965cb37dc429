"""Several replicas, one actor: leader election on a coordination.k8s.io/v1 Lease with nothing faked but the
Kubernetes API server (tests/integration/kube_apiserver.py: real HTTP, a bearer token per replica, the RBAC of
deploy/kubernetes/rbac-lease plus the Deployment's get/patch). Each replica is a real LeaseElector and a real
ActuationRunner with a DeploymentActuator on its own lightkube client and its own audit log, ticking like the
advisor loop; the last tests run two whole sidecars (build_sidecar) instead.

Durations are short (lease 1 s, renew deadline 0.6 s, retry 0.2 s) and every wait is a bounded poll on behaviour;
what is asserted is who acted and how often (the PATCHes the API server received, the audit logs, the Lease), never
how long anything took. Where a takeover must come from a release, the lease lasts 30 s: longer than any poll here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from actuation_fakes import make_evidence
from kube_apiserver import DEPLOYMENTS, LEASES, FakeKubeApiServer, patches
from sidecar_http import FIXTURES, CaptureServer, serving, wait_for
from test_actuation_end_to_end import advisor_settings

from policies.act.deployment import ApplyResult, DeploymentObservation, SpeculationSetting
from policies.act.gate import ActuationConfig
from policies.act.leader import ElectionConfig
from policies.types import DataState, Decision
from service.actuators.audit import AuditLog, read_tail
from service.actuators.base import Actuator
from service.actuators.kube_client import kube_client
from service.actuators.kubernetes import DeploymentActuator
from service.actuators.leader import LeaseElector, LeaseName
from service.actuators.runner import ActuationRunner, RunnerOptions
from service.app import build_sidecar
from service.board import Board
from service.sources.gpu import NoGpuSource
from service.tasks import cancel_and_wait

NS = "llm-serving"
NAME = "vllm-llama-8b"
LEASE = "spec-advisor-actuation"
DEPLOYMENT_PATH = f"/apis/apps/v1/namespaces/{NS}/deployments/{NAME}"
LEASE_PATH = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{LEASE}"
DEPLOYED = {"method": "eagle", "model": "yuhuili/EAGLE-LLaMA3.1-Instruct-8B", "num_speculative_tokens": 7}
FAST = {"lease_duration_s": 1, "renew_deadline_s": 0.6, "retry_period_s": 0.2}
RELEASE_ONLY = {"lease_duration_s": 30, "renew_deadline_s": 0.6, "retry_period_s": 0.2}  # expiry beyond any poll
GATE = ActuationConfig(dwell_s=0, cooldown_s=0, max_actions_per_hour=60, max_actions_per_day=1000)


def user(replica: str) -> str:
    return f"system:serviceaccount:{NS}:{replica}"


def grants_for(*replicas: str) -> set[tuple[str, str, str, str]]:
    """deploy/kubernetes/rbac-lease (create on any name: RBAC cannot name it; get/update on the one Lease) and
    deploy/kubernetes/rbac (get/patch on the one Deployment), per replica."""
    grants: set[tuple[str, str, str, str]] = set()
    for replica in replicas:
        grants |= {(user(replica), "create", "leases", "*"), (user(replica), "get", "leases", LEASE),
                   (user(replica), "update", "leases", LEASE), (user(replica), "get", "deployments", NAME),
                   (user(replica), "patch", "deployments", NAME)}
    return grants


def vllm_deployment() -> dict[str, Any]:
    args = ["meta-llama/Llama-3.1-8B-Instruct", "--port", "8000", "--speculative-config", json.dumps(DEPLOYED)]
    return {
        "metadata": {"name": NAME, "namespace": NS},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "vllm"}}, "template": {
            "metadata": {"labels": {"app": "vllm"}},
            "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.32.0", "command": ["vllm", "serve"],
                                     "args": args}]}}},
    }


def deployed_k(api: FakeKubeApiServer) -> int | None:
    (container,) = api.get(DEPLOYMENTS, NS, NAME)["spec"]["template"]["spec"]["containers"]
    args: list[str] = container["args"]
    k: int = json.loads(args[args.index("--speculative-config") + 1])["num_speculative_tokens"]
    return k


def deployment_patches(api: FakeKubeApiServer) -> list[str | None]:
    """The user of every PATCH of the Deployment the API server received, in order."""
    return [r.user for r in patches(api.requests) if r.path == DEPLOYMENT_PATH]


def api_server(*replicas: str) -> FakeKubeApiServer:
    server = FakeKubeApiServer(tokens={f"token-{r}": user(r) for r in replicas}, grants=grants_for(*replicas))
    server.put(DEPLOYMENTS, vllm_deployment())
    server.finish_rollout(NS, NAME)
    return server


def a_decision(k: int = 3) -> Decision:
    return Decision(target="llama", model="m", state=DataState.OK, enabled=k > 0, num_speculative_tokens=k,
                    expected_speedup=1.4, expected_speedup_low=1.3, expected_speedup_high=1.5, reason="on",
                    evaluated_at_s=time.time(), objective="latency")


async def until(condition: Callable[[], bool], what: str, *, deadline_s: float = 15.0) -> None:
    """Poll `condition` until it holds; fail after `deadline_s` (a bound on waiting, not a timing assertion)."""
    give_up = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > give_up:
            raise AssertionError(f"never happened: {what}")
        await asyncio.sleep(0.02)


class HeldPreview:
    """A real DeploymentActuator whose dry-run apply (the preview computed before a live patch) waits for `go`:
    a pass that has decided to act, stopped right before it records and sends the patch."""

    def __init__(self, inner: DeploymentActuator) -> None:
        self._inner = inner
        self.go = asyncio.Event()
        self.previewing = False
        self.mode = inner.mode
        self.target_ref = inner.target_ref

    async def observe(self, now_s: float) -> DeploymentObservation:
        return await self._inner.observe(now_s)

    async def apply(self, desired: SpeculationSetting, observed: DeploymentObservation, *, dry_run: bool
                    ) -> ApplyResult:
        if dry_run:
            self.previewing = True
            await self.go.wait()
        return await self._inner.apply(desired, observed, dry_run=dry_run)


@dataclass
class Replica:
    """One advisor replica: its elector and runner on its own client and audit log, and its tick loop."""

    name: str
    elector: LeaseElector
    runner: ActuationRunner
    board: Board
    audit: AuditLog
    actuator: Actuator
    close_client: Callable[[], Any]
    ticking: asyncio.Task[None] | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def start(self) -> None:
        self.elector.start()
        self.ticking = asyncio.create_task(self._tick_forever())

    async def _tick_forever(self) -> None:
        while True:  # what the advisor loop does after each iteration
            await self.runner.after_iteration(time.time())
            await asyncio.sleep(0.05)

    async def _stop_ticking(self) -> None:
        if self.ticking is not None:
            await cancel_and_wait(self.ticking)
        await self.runner.aclose(grace_s=0)

    async def die(self) -> None:
        """Stop like a killed pod: no more ticks or attempts, and the lease is not given back."""
        await self._stop_ticking()
        await self.elector.stop()

    async def shut_down(self) -> None:
        """Stop like a clean shutdown: the last pass ends, then the lease is released."""
        await self._stop_ticking()
        await self.elector.aclose()

    def records(self, kind: str | None = None) -> list[dict[str, Any]]:
        return [r for r in read_tail(self.audit.path).records if kind is None or r["kind"] == kind]

    def skipped(self, reason: str) -> int:
        (status,) = self.runner.statuses(time.time())
        return status.skipped.get(reason, 0)


@contextlib.asynccontextmanager
async def replicas(
    api: FakeKubeApiServer, tmp_path: Path, names: tuple[str, ...], *, timing: dict[str, Any] = FAST,
    wrap: Callable[[DeploymentActuator], Actuator] | None = None, advised: bool = True,
) -> AsyncIterator[dict[str, Replica]]:
    """Replicas `names` on `api`, each with a board that recommends k 3 (none yet unless `advised`)."""
    built: dict[str, Replica] = {}
    for name in names:
        token_file = tmp_path / f"token-{name}"
        token_file.write_text(f"token-{name}", encoding="utf-8")
        client = kube_client(api_url=api.url, kubeconfig=None, token_file=token_file, namespace=NS, timeout_s=5.0)
        elector = LeaseElector(client, lease=LeaseName(NS, LEASE),
                               config=ElectionConfig(identity=f"{name}_0001", **timing))
        board = Board([("llama", None)], started_at_s=time.time())
        if advised:
            board.publish("llama", evidence=make_evidence("llama", time.time()), decision=a_decision(),
                          good_scrape_s=time.time())
        deployment = DeploymentActuator(client, namespace=NS, deployment=NAME, container=None, schedule_mode=False,
                                        speculative_config=None)
        actuator: Actuator = wrap(deployment) if wrap is not None else deployment
        audit = AuditLog(tmp_path / name / "actions.jsonl")
        (tmp_path / name).mkdir()
        audit.open()
        runner = ActuationRunner(board, {"llama": actuator}, options=RunnerOptions(mode="kubernetes", config=GATE),
                                 audit=audit, leadership=elector)
        built[name] = Replica(name, elector, runner, board, audit, actuator, client.close)
    try:
        yield built
    finally:
        for replica in built.values():
            await replica.die()
            await replica.close_client()
            replica.audit.close()


def leader_of(group: dict[str, Replica]) -> list[Replica]:
    return [r for r in group.values() if r.elector.leading()]


def test_two_replicas_race_and_exactly_one_acts(tmp_path: Path) -> None:
    async def scenario(api: FakeKubeApiServer) -> None:
        async with replicas(api, tmp_path, ("a", "b")) as group:
            for replica in group.values():
                replica.start()
            await until(lambda: deployed_k(api) == 3, "the deployment runs the recommended k")
            (leader,) = leader_of(group)
            (follower,) = [r for r in group.values() if r is not leader]
            api.finish_rollout(NS, NAME)
            await until(lambda: leader.skipped("already_applied") >= 3, "the leader sees its change applied")
            await until(lambda: any(f"held by {leader.elector.identity}" in r["detail"]
                                    for r in follower.records("skip")), "the follower says who leads")
            await until(lambda: follower.skipped("not_leader") >= 10, "the follower keeps skipping")

            assert deployment_patches(api) == [user(leader.name)]  # one PATCH, the leader's
            assert [r["result"] for r in leader.records("action")] == ["applied"]
            assert follower.records("action") == [] and follower.records("action_started") == []
            # The follower never read the Deployment, and said why it held back, without a line per tick.
            follower_reads = [r for r in api.requests if r.path == DEPLOYMENT_PATH and r.user == user(follower.name)]
            assert follower_reads == []
            skips = [r for r in follower.records("skip") if r["reason"] == "not_leader"]
            assert 1 <= len(skips) <= 2 < follower.skipped("not_leader")
            assert f"held by {leader.elector.identity}" in skips[-1]["detail"]
            (status,) = follower.runner.statuses(time.time())
            assert status.last_plan is not None and status.last_plan.skip is not None
            assert status.last_plan.skip.value == "not_leader"
            # The Lease names the leader; it was created, never taken over.
            spec = api.get(LEASES, NS, LEASE)["spec"]
            assert spec["holderIdentity"] == leader.elector.identity and spec["leaseTransitions"] == 0
            assert spec["leaseDurationSeconds"] == 1
            assert leader.elector.transitions == 1 and follower.elector.transitions == 0

    with api_server("a", "b") as api:
        asyncio.run(scenario(api))


def test_a_dead_leader_is_taken_over_and_the_change_is_not_applied_twice(tmp_path: Path) -> None:
    async def scenario(api: FakeKubeApiServer) -> None:
        async with replicas(api, tmp_path, ("a", "b")) as group:
            for replica in group.values():
                replica.start()
            await until(lambda: deployed_k(api) == 3, "the first leader acts")
            (first,) = leader_of(group)
            (second,) = [r for r in group.values() if r is not first]
            await until(lambda: bool(first.records("action")), "the first leader recorded its action")
            await first.die()  # no release: the others must wait for the lease to expire on their clocks
            await until(second.elector.leading, "the other replica takes over")
            await until(lambda: second.skipped("rollout_in_progress") >= 1, "the new leader observes the rollout")
            api.finish_rollout(NS, NAME)
            await until(lambda: second.skipped("already_applied") >= 3, "the new leader finds nothing to do")

            assert deployment_patches(api) == [user(first.name)]
            assert [r["result"] for r in first.records("action")] == ["applied"]
            assert second.records("action") == [] and second.records("action_started") == []
            spec = api.get(LEASES, NS, LEASE)["spec"]
            assert spec["holderIdentity"] == second.elector.identity
            assert spec["leaseTransitions"] == 1  # one takeover

    with api_server("a", "b") as api:
        asyncio.run(scenario(api))


def test_a_clean_shutdown_releases_and_the_other_takes_over_without_waiting_for_expiry(tmp_path: Path) -> None:
    async def scenario(api: FakeKubeApiServer) -> None:
        async with replicas(api, tmp_path, ("a", "b"), timing=RELEASE_ONLY) as group:
            group["a"].start()
            await until(lambda: bool(group["a"].records("action")), "the first replica leads and acts")
            group["b"].start()
            await until(lambda: group["b"].skipped("not_leader") >= 3, "the second one follows")
            await group["a"].shut_down()
            released = api.get(LEASES, NS, LEASE)["spec"]
            # What the release left, unless b was already faster: no holder, a 1 s lease (client-go's release).
            if released["holderIdentity"] == "":
                assert released["leaseDurationSeconds"] == 1 and released["leaseTransitions"] == 0
            await until(group["b"].elector.leading, "the second replica takes over (the lease would last 30 s)")
            spec = api.get(LEASES, NS, LEASE)["spec"]
            assert spec["holderIdentity"] == group["b"].elector.identity and spec["leaseTransitions"] == 1
            await until(lambda: group["b"].skipped("rollout_in_progress") + group["b"].skipped("already_applied")
                        >= 1, "the new leader acts on the deployment's state")
            assert deployment_patches(api) == [user("a")]  # the first leader's one change, not repeated

    with api_server("a", "b") as api:
        asyncio.run(scenario(api))


def test_a_conflict_on_renew_makes_the_leader_step_down(tmp_path: Path) -> None:
    async def scenario(api: FakeKubeApiServer) -> None:
        async with replicas(api, tmp_path, ("a",), advised=False) as group:  # nothing to do yet
            (replica,) = group.values()
            replica.start()
            await until(replica.elector.leading, "the replica leads")
            hooked: list[int] = []

            def intruder() -> None:  # another writer takes the lease between the renewal's arrival and its write
                hooked.append(1)
                api.mutate(LEASES, NS, LEASE, lambda lease: lease["spec"].update(
                    holderIdentity="intruder_9", leaseTransitions=lease["spec"]["leaseTransitions"] + 1))

            api.before_write = intruder
            await until(lambda: bool(hooked), "the next renewal met the intruder")
            await until(lambda: not replica.elector.leading(), "the leader steps down at once")
            await until(lambda: replica.elector.holder == "intruder_9", "its next read shows the new holder")
            replica.board.publish("llama", evidence=make_evidence("llama", time.time()), decision=a_decision(),
                                  good_scrape_s=time.time())
            await until(lambda: replica.skipped("not_leader") >= 5, "it keeps advising without acting")
            assert deployment_patches(api) == []
            assert api.get(LEASES, NS, LEASE)["spec"]["holderIdentity"] == "intruder_9"  # not overwritten
            assert replica.elector.transitions == 2  # started, then stopped acting

    with api_server("a") as api:
        asyncio.run(scenario(api))


def test_a_leader_that_loses_the_lease_mid_pass_does_not_send_its_patch(tmp_path: Path) -> None:
    async def scenario(api: FakeKubeApiServer) -> None:
        held: list[HeldPreview] = []

        def hold(inner: DeploymentActuator) -> Actuator:
            held.append(HeldPreview(inner))
            return held[-1]

        async with replicas(api, tmp_path, ("a",), wrap=hold) as group:
            (replica,) = group.values()
            (preview,) = held
            replica.start()
            await until(lambda: preview.previewing, "the leader decided to act and computes the patch")
            api.before_write = lambda: api.mutate(LEASES, NS, LEASE, lambda lease: lease["spec"].update(
                holderIdentity="intruder_9"))
            await until(lambda: not replica.elector.leading(), "the leader lost the lease meanwhile")
            preview.go.set()
            await until(lambda: bool(replica.records("action")), "the pass ends")
            (action,) = replica.records("action")
            assert action["result"] == "failed" and "stopped leading before the patch went out" in action["detail"]
            assert deployment_patches(api) == [] and deployed_k(api) == 7

    with api_server("a") as api:
        asyncio.run(scenario(api))


# ----------------------------------------------------------------------------------------------------------------
# Two whole sidecars (settings -> build_sidecar -> lifespan), acting on one Deployment
# ----------------------------------------------------------------------------------------------------------------


def metric(text: str, name: str) -> float:
    (line,) = [line for line in text.splitlines() if line.startswith(name + " ")]
    return float(line.split()[1])


def test_two_sidecars_one_actor_and_a_clean_shutdown_hands_over(tmp_path: Path) -> None:
    async def scenario(api: FakeKubeApiServer) -> None:
        capture = CaptureServer(FIXTURES / "synthetic-eagle-k3.txt")
        async with serving(capture) as capture_url, httpx.AsyncClient(timeout=5.0) as http:
            stacks: dict[str, contextlib.AsyncExitStack] = {}
            urls: dict[str, str] = {}
            for name in ("a", "b"):
                token_file = tmp_path / f"token-{name}"
                token_file.write_text(f"token-{name}", encoding="utf-8")
                settings = advisor_settings(capture_url, api.url, token_file, tmp_path / name,
                                            api={"write_endpoints": False},
                                            leader_election={"enabled": True, **RELEASE_ONLY})
                sidecar = build_sidecar(settings, gpu_source=NoGpuSource(), environ={"POD_NAME": f"advisor-{name}"})
                stacks[name] = contextlib.AsyncExitStack()
                urls[name] = await stacks[name].enter_async_context(serving(sidecar.app))
            try:
                await until(lambda: len(deployment_patches(api)) == 1, "one sidecar acts")
                (leader,) = [n for n in urls if deployment_patches(api) == [user(n)]]
                (follower,) = [n for n in urls if n != leader]
                pages = {n: (await http.get(urls[n] + "/metrics")).text for n in urls}
                assert metric(pages[leader], "specadvisor_actuation_leader") == 1
                assert metric(pages[follower], "specadvisor_actuation_leader") == 0
                assert metric(pages[leader], "specadvisor_actuation_leader_transitions_total") == 1
                await wait_for(http, urls[follower] + "/v1/actions",
                               lambda r: r.json()["targets"][0]["last_skip_reason"] == "not_leader")
                holder = api.get(LEASES, NS, LEASE)["spec"]["holderIdentity"]
                assert holder.startswith(f"advisor-{leader}_")  # the pod's name plus a random suffix

                await stacks[leader].aclose()  # SIGTERM: the lifespan ends, the lease is given back
                await wait_for(http, urls[follower] + "/metrics",
                               lambda r: metric(r.text, "specadvisor_actuation_leader") == 1)
                spec = api.get(LEASES, NS, LEASE)["spec"]
                assert spec["holderIdentity"].startswith(f"advisor-{follower}_") and spec["leaseTransitions"] == 1
                api.finish_rollout(NS, NAME)
                await wait_for(http, urls[follower] + "/v1/actions",
                               lambda r: r.json()["targets"][0]["skipped"].get("already_applied", 0) >= 2)
                assert deployment_patches(api) == [user(leader)]  # applied once, by the first leader
                actions = (await http.get(urls[follower] + "/v1/actions")).json()
                assert actions["targets"][0]["actions"] == {}
            finally:
                for stack in stacks.values():
                    await stack.aclose()

    with api_server("a", "b") as api:
        asyncio.run(scenario(api))


def test_without_the_lease_rbac_a_replica_never_acts_and_says_why(tmp_path: Path) -> None:
    async def scenario(api: FakeKubeApiServer) -> None:
        async with replicas(api, tmp_path, ("a",)) as group:
            (replica,) = group.values()
            replica.start()
            await until(lambda: replica.skipped("not_leader") >= 10, "it keeps advising without acting")
            assert not replica.elector.leading() and replica.elector.last_error is not None
            assert replica.elector.last_error.startswith("forbidden: ")
            (skip, *_) = [r for r in replica.records("skip") if r["reason"] == "not_leader"]
            assert "forbidden" in skip["detail"] or "no replica holds the lease yet" in skip["detail"]
            assert deployment_patches(api) == [] and api.find(LEASES, NS, LEASE) is None

    deployment_only = {g for g in grants_for("a") if g[2] == "deployments"}  # the rbac component without rbac-lease
    with FakeKubeApiServer(tokens={"token-a": user("a")}, grants=deployment_only) as api:
        api.put(DEPLOYMENTS, vllm_deployment())
        api.finish_rollout(NS, NAME)
        asyncio.run(scenario(api))
