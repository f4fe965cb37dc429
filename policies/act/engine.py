"""Does the engine the advice was priced for run in the Deployment? Pure.

The cost model prices a tensor-parallel degree and, where set, the step's sequence and token limits
(`ModelContext`); the managed container's args say what vLLM runs (`EngineFlags`). Advice priced for another
engine is not advice about this one: the gate holds a change back while they differ (`gate.SkipReason.
ENGINE_MISMATCH`). Compared:
- tensor parallelism always: args without --tensor-parallel-size (or -tp) run vLLM's default, 1;
- --max-num-seqs and --max-num-batched-tokens where both sides give one (args without them run vLLM's default,
  which depends on its version and the GPU, so a setting cannot be checked against it; a setting left unset prices
  no limit, an approximation rather than a different engine).
"""

from __future__ import annotations

from policies.act.deployment import EngineFlags
from policies.model.costmodel import ModelContext

VLLM_DEFAULT_TENSOR_PARALLEL = 1  # vLLM's --tensor-parallel-size default


def priced_engine(context: ModelContext) -> EngineFlags:
    """The engine limits `context` prices, as flags. Example: tensor_parallel 2, step_token_budget 8192,
    max_num_seqs None -> EngineFlags(2, None, 8192)."""
    return EngineFlags(
        tensor_parallel_size=context.tensor_parallel,
        max_num_seqs=None if context.max_num_seqs is None else round(context.max_num_seqs),
        max_num_batched_tokens=None if context.step_token_budget is None else round(context.step_token_budget),
    )


def engine_mismatch(running: EngineFlags, priced: EngineFlags) -> str | None:
    """What differs between the engine the args run and the one the advice prices (module docstring), naming the
    setting to change; None when nothing does. Example: running EngineFlags(8, None, None), priced EngineFlags(1,
    256, None) -> "the Deployment runs --tensor-parallel-size 8, the advice is priced for 1 (set the target's
    tensor_parallel to 8)"."""
    differences: list[str] = []
    tp = running.tensor_parallel_size or VLLM_DEFAULT_TENSOR_PARALLEL
    if priced.tensor_parallel_size is not None and tp != priced.tensor_parallel_size:
        differences.append(f"the Deployment runs --tensor-parallel-size {tp}, the advice is priced for "
                           f"{priced.tensor_parallel_size} (set the target's tensor_parallel to {tp})")
    for flag, setting, run, price in (
        ("--max-num-seqs", "max_num_seqs", running.max_num_seqs, priced.max_num_seqs),
        ("--max-num-batched-tokens", "max_num_batched_tokens", running.max_num_batched_tokens,
         priced.max_num_batched_tokens),
    ):
        if run is not None and price is not None and run != price:
            differences.append(f"the Deployment runs {flag} {run}, the advice is priced for {price} (set the "
                               f"target's {setting} to {run})")
    return "; ".join(differences) if differences else None
