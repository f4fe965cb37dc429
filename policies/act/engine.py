"""Does the engine the advice was priced for run in the Deployment? Pure.

The cost model prices a tensor-parallel degree, one pipeline stage and, where set, the step's sequence and token
limits (`ModelContext`); the managed container's args say what vLLM runs (`EngineFlags`). Advice priced for another
engine is not advice about this one: the gate holds a change back while they differ (`gate.SkipReason.
ENGINE_MISMATCH`). Compared:
- tensor parallelism always (args without --tensor-parallel-size or -tp run vLLM's default, 1), and pipeline
  parallelism (more than one stage is not priced);
- --max-num-seqs and --max-num-batched-tokens where both sides give one (args without them run vLLM's default,
  which depends on its version and the GPU, so a setting cannot be checked against it; a setting left unset prices
  no limit, an approximation rather than a different engine);
- a flag whose value cannot be read (an unset `$(VAR)`, a word that is not an integer) differs from any price
  where the flag matters: tensor and pipeline parallelism always, a step limit when the setting gives one.
"""

from __future__ import annotations

from policies.act.deployment import EngineFlags
from policies.model.costmodel import ModelContext

VLLM_DEFAULT_TENSOR_PARALLEL = 1  # vLLM's --tensor-parallel-size default
_FLAGS = {  # EngineFlags field -> (vLLM flag, the targets[] setting that prices it)
    "tensor_parallel_size": ("--tensor-parallel-size", "tensor_parallel"),
    "pipeline_parallel_size": ("--pipeline-parallel-size", ""),
    "max_num_seqs": ("--max-num-seqs", "max_num_seqs"),
    "max_num_batched_tokens": ("--max-num-batched-tokens", "max_num_batched_tokens"),
}


def priced_engine(context: ModelContext) -> EngineFlags:
    """The engine limits `context` prices, as flags (one pipeline stage; a limit that is not a whole number is left
    out: no setting gives one). Example: tensor_parallel 2, step_token_budget 8192, max_num_seqs None ->
    EngineFlags(tensor_parallel_size=2, max_num_batched_tokens=8192, pipeline_parallel_size=1)."""
    return EngineFlags(
        tensor_parallel_size=context.tensor_parallel,
        max_num_seqs=_whole(context.max_num_seqs),
        max_num_batched_tokens=_whole(context.step_token_budget),
        pipeline_parallel_size=1,
    )


def engine_mismatch(running: EngineFlags, priced: EngineFlags) -> str | None:
    """What differs between the engine the args run and the one the advice prices (module docstring), naming the
    setting to change; None when nothing does. Example: running EngineFlags(tensor_parallel_size=8), priced
    EngineFlags(tensor_parallel_size=1) -> "the Deployment runs --tensor-parallel-size 8, the advice is priced for
    1 (set the target's tensor_parallel to 8)"."""
    unreadable = dict(running.unreadable)
    differences = [
        f"cannot read {_FLAGS[field][0]} from the Deployment's args ({text!r}): what runs is unknown (write it as a "
        "literal integer, or as a $(NAME) whose env value is a literal)"
        for field, text in running.unreadable
        if field in ("tensor_parallel_size", "pipeline_parallel_size") or getattr(priced, field) is not None
    ]
    if "tensor_parallel_size" not in unreadable:
        tp, priced_tp = running.tensor_parallel_size, priced.tensor_parallel_size
        runs_tp = tp if tp is not None else VLLM_DEFAULT_TENSOR_PARALLEL
        if priced_tp is not None and runs_tp != priced_tp:
            runs = f"--tensor-parallel-size {tp}" if tp is not None else "without --tensor-parallel-size (vLLM's 1)"
            differences.append(f"the Deployment runs {runs}, the advice is priced for {priced_tp} (set the "
                               f"target's tensor_parallel to {runs_tp})")
    pp = running.pipeline_parallel_size
    if pp is not None and pp > 1:
        differences.append(f"the Deployment runs --pipeline-parallel-size {pp}: pipeline parallelism is not priced, "
                           "so no advice is about this engine")
    for field in ("max_num_seqs", "max_num_batched_tokens"):
        run, price = getattr(running, field), getattr(priced, field)
        if run is not None and price is not None and run != price:
            flag, setting = _FLAGS[field]
            differences.append(f"the Deployment runs {flag} {run}, the advice is priced for {price} (set the "
                               f"target's {setting} to {run})")
    return "; ".join(differences) if differences else None


def _whole(value: float | None) -> int | None:
    return int(value) if value is not None and float(value).is_integer() and value >= 1 else None
