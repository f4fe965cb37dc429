"""Measure a real step-time surface: one forward of a Llama-shaped model (random weights, KV cache in place) per
(batch B, verified tokens per sequence q, context ctx), timed on the machine it runs on. Figures, not assertions.

Run on a GPU machine with PyTorch (it is not a project dependency: the cost model never needs it):

    python -m benchmarks.gpu_step_surface --out surface.csv               # Llama-3.1-8B shape, CUDA graphs
    python -m benchmarks.gpu_step_surface --out s.csv --device cpu --layers 2 --hidden 256 --heads 4 --kv-heads 2 \\
        --intermediate 512 --vocab 1024 --batches 1,4 --tokens 1,4 --contexts 64,256   # a CPU smoke run

It writes the CSV (gpu, batch, tokens_per_seq, context_tokens, step_ms median, p10, p90, repeats) and, beside it,
`<out>.config.json`: the model's config.json, so that `benchmarks.compare_surface` prices the very same shape.

What one step is: the target's verification forward as a serving engine runs it, without the engine around it
(no scheduler, sampling or host work: those are the cost model's overhead terms, compared separately). Each of B
sequences holds ctx tokens of KV per layer and appends q new ones; every layer does RMSNorm, the QKV projection
(GQA), attention of the q new tokens over ctx + q keys (causal among the new ones; PyTorch's SDPA), the output
projection, the SwiGLU MLP; then the final norm and the lm_head over all B x q positions (verification needs a
logit per position). Weights bf16 (fp32 on CPU), KV bf16, random. On CUDA each shape is captured in a CUDA graph
and replayed, as vLLM replays its decode graphs, so kernel launches cost what they cost there (`--eager` times
launches one by one). Points whose weights + KV do not fit in `--memory-fraction` of the device are skipped and
listed. `--max-seconds` bounds the whole sweep: points not reached are reported, never silently dropped.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Shape:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    def config_json(self, dtype: str) -> dict[str, object]:
        return {
            "_name_or_path": f"random-llama-{self.layers}l-{self.hidden}h",
            "architectures": ["LlamaForCausalLM"], "hidden_size": self.hidden,
            "intermediate_size": self.intermediate, "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads, "num_key_value_heads": self.kv_heads, "head_dim": self.head_dim,
            "vocab_size": self.vocab, "tie_word_embeddings": False, "torch_dtype": dtype,
        }

    def weight_bytes(self, element: int) -> int:
        per_layer = (
            self.hidden * self.heads * self.head_dim * 2  # q and o
            + self.hidden * self.kv_heads * self.head_dim * 2  # k and v
            + self.hidden * self.intermediate * 3  # gate, up, down
        )
        return (per_layer * self.layers + self.vocab * self.hidden * 2) * element

    def kv_bytes(self, batch: int, tokens: int) -> int:
        return 2 * self.layers * batch * self.kv_heads * self.head_dim * tokens * 2  # bf16 K and V


def _parse_ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--intermediate", type=int, default=14336)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=0, help="0: hidden / heads")
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--batches", default="1,2,4,8,16,32,64,128,256")
    parser.add_argument("--tokens", default="1,2,4,8", help="verified tokens per sequence (q = gamma + 1)")
    parser.add_argument("--contexts", default="512,2048,8192,32768")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--memory-fraction", type=float, default=0.85)
    parser.add_argument("--max-seconds", type=float, default=240.0)
    parser.add_argument("--eager", action="store_true", help="no CUDA graphs")
    return parser.parse_args(argv)


@dataclass(frozen=True, slots=True)
class Torch:
    """PyTorch (imported by `main` only: it is not a project dependency), its functional API, and the device the
    sweep runs on; on CUDA weights and KV are bf16 and shapes run as CUDA graphs unless `eager`."""

    torch: Any
    functional: Any
    device: Any
    eager: bool

    @property
    def cuda(self) -> bool:
        return bool(self.device.type == "cuda")

    @property
    def dtype(self) -> Any:
        return self.torch.bfloat16 if self.cuda else self.torch.float32

    @property
    def element_bytes(self) -> int:
        return 2 if self.cuda else 4

    @property
    def graphs(self) -> bool:
        """Whether each shape is captured in a CUDA graph and replayed (module docstring)."""
        return self.cuda and not self.eager


class RandomLlama:
    """A Llama-shaped model of `shape` with random weights (scaled by 1/sqrt(fan-in)) on the runtime's device."""

    def __init__(self, rt: Torch, shape: Shape) -> None:
        self.rt = rt
        self.shape = shape
        hd, heads, kv_heads = shape.head_dim, shape.heads, shape.kv_heads
        self.layers = [
            {
                "qkv": self._weight(shape.hidden, (heads + 2 * kv_heads) * hd),
                "o": self._weight(heads * hd, shape.hidden),
                "gate_up": self._weight(shape.hidden, 2 * shape.intermediate),
                "down": self._weight(shape.intermediate, shape.hidden),
            }
            for _ in range(shape.layers)
        ]
        self.lm_head = self._weight(shape.hidden, shape.vocab)

    def _weight(self, rows: int, cols: int) -> Any:
        torch = self.rt.torch
        return (torch.randn(rows, cols, device=self.rt.device, dtype=self.rt.dtype) / math.sqrt(rows)).contiguous()

    def forward(self, x: Any, caches: list[tuple[Any, Any]], mask: Any, ctx: int) -> Any:
        """Logits of the `q` new tokens of each of `batch` sequences (x: batch x q x hidden) over `ctx` cached ones;
        their K and V are written into `caches` at positions ctx..ctx+q."""
        nnf, shape = self.rt.functional, self.shape
        hd, heads, kv_heads = shape.head_dim, shape.heads, shape.kv_heads
        batch, q, _ = x.shape
        for layer, (k_cache, v_cache) in zip(self.layers, caches, strict=True):
            h = nnf.rms_norm(x, (shape.hidden,))
            qkv = h @ layer["qkv"]
            query, key, value = qkv.split([heads * hd, kv_heads * hd, kv_heads * hd], dim=-1)
            query = query.view(batch, q, heads, hd).transpose(1, 2)
            k_cache[:, :, ctx:] = key.view(batch, q, kv_heads, hd).transpose(1, 2)
            v_cache[:, :, ctx:] = value.view(batch, q, kv_heads, hd).transpose(1, 2)
            attended = nnf.scaled_dot_product_attention(query, k_cache, v_cache, attn_mask=mask, enable_gqa=True)
            x = x + attended.transpose(1, 2).reshape(batch, q, heads * hd) @ layer["o"]
            gate, up = (nnf.rms_norm(x, (shape.hidden,)) @ layer["gate_up"]).chunk(2, dim=-1)
            x = x + (nnf.silu(gate) * up) @ layer["down"]
        return nnf.rms_norm(x, (shape.hidden,)) @ self.lm_head


def timed(rt: Torch, fn: Any, repeats: int) -> list[float]:
    """`fn`'s wall time (ms) over `repeats` calls after 3 warm-up calls: CUDA events on CUDA, perf_counter else."""
    torch = rt.torch
    for _ in range(3):
        fn()
    samples = []
    for _ in range(repeats):
        if rt.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
        else:
            began = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - began) * 1e3)
    return samples


def step_samples(model: RandomLlama, batch: int, q: int, ctx: int, *, repeats: int) -> list[float]:
    """Step times (ms) of one forward at (batch, q new tokens per sequence, ctx cached tokens): fresh zero KV
    caches, a causal mask among the new tokens, random inputs; as a replayed CUDA graph when `model.rt.graphs`."""
    rt, shape = model.rt, model.shape
    torch, device, dtype = rt.torch, rt.device, rt.dtype
    caches = [
        (torch.zeros(batch, shape.kv_heads, ctx + q, shape.head_dim, device=device, dtype=dtype),
         torch.zeros(batch, shape.kv_heads, ctx + q, shape.head_dim, device=device, dtype=dtype))
        for _ in range(shape.layers)
    ]
    mask = torch.ones(q, ctx + q, device=device, dtype=torch.bool)
    mask[:, ctx:] = torch.ones(q, q, device=device, dtype=torch.bool).tril()
    x = torch.randn(batch, q, shape.hidden, device=device, dtype=dtype)
    with torch.inference_mode():
        if not rt.graphs:
            return timed(rt, lambda: model.forward(x, caches, mask, ctx), repeats)
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            model.forward(x, caches, mask, ctx)  # warm the allocator and kernels before capture
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(graph):
            model.forward(x, caches, mask, ctx)
        return timed(rt, graph.replay, repeats)


def surface_row(gpu: str, point: tuple[int, int, int], samples: list[float], *, cuda_graphs: bool) -> dict[str, object]:
    """One CSV row: the point, the median, 10th and 90th percentile step (ms, 4 decimals) and the repeats."""
    batch, q, ctx = point
    ordered = sorted(samples)
    return {
        "gpu": gpu, "batch": batch, "tokens_per_seq": q, "context_tokens": ctx,
        "step_ms": round(statistics.median(samples), 4),
        "p10_ms": round(ordered[len(ordered) // 10], 4), "p90_ms": round(ordered[(len(ordered) * 9) // 10], 4),
        "repeats": len(samples), "cuda_graphs": cuda_graphs,
    }


def sweep(rt: Torch, shape: Shape, args: argparse.Namespace) -> tuple[list[dict[str, object]], list[str]]:
    """Time every (batch, q, ctx) point of the arguments, contexts outermost: the rows measured and the points
    skipped (past `--max-seconds`, or weights + KV + logits over `--memory-fraction` of the device), printing a
    line per point."""
    torch, device, cuda = rt.torch, rt.device, rt.cuda
    gpu = torch.cuda.get_device_name(device) if cuda else "cpu"
    total = torch.cuda.get_device_properties(device).total_memory if cuda else 8 * 2**30
    budget = args.memory_fraction * total - shape.weight_bytes(rt.element_bytes)
    torch.manual_seed(0)
    model = RandomLlama(rt, shape)
    points = [(b, q, c) for c in _parse_ints(args.contexts) for q in _parse_ints(args.tokens)
              for b in _parse_ints(args.batches)]
    rows: list[dict[str, object]] = []
    skipped: list[str] = []
    began = time.monotonic()
    for index, (batch, q, ctx) in enumerate(points):
        if time.monotonic() - began > args.max_seconds:
            skipped += [f"B={b} q={t} ctx={c} (time budget)" for b, t, c in points[index:]]
            break
        if shape.kv_bytes(batch, ctx + q) + 4 * batch * q * shape.vocab > budget:
            skipped.append(f"B={batch} q={q} ctx={ctx} (memory)")
            continue
        samples = step_samples(model, batch, q, ctx, repeats=args.repeats)
        row = surface_row(gpu, (batch, q, ctx), samples, cuda_graphs=rt.graphs)
        rows.append(row)
        print(f"B={batch:4d} q={q} ctx={ctx:6d}: {row['step_ms']:9.3f} ms", flush=True)
        if cuda:
            torch.cuda.empty_cache()
    return rows, skipped


def write_surface(out: Path, rows: list[dict[str, object]], shape: Shape, *, cuda: bool) -> Path:
    """Write the CSV to `out` and the model's config.json beside it (`<out>.config.json`); returns the latter."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]) if rows else ["gpu"])
        writer.writeheader()
        writer.writerows(rows)
    config_path = out.with_suffix(".config.json")
    config_path.write_text(json.dumps(shape.config_json("bfloat16" if cuda else "float32"), indent=1) + "\n")
    return config_path


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    try:
        import torch  # noqa: PLC0415  (optional: only this benchmark needs it)
        import torch.nn.functional as F  # noqa: N812, PLC0415
    except ImportError:
        print("this benchmark needs PyTorch (pip install torch); the project itself does not", file=sys.stderr)
        return 2
    rt = Torch(torch=torch, functional=F, device=torch.device(args.device), eager=args.eager)
    if rt.cuda and not torch.cuda.is_available():
        print("no CUDA device: run with --device cpu (and a small shape) to try the script", file=sys.stderr)
        return 2
    shape = Shape(
        hidden=args.hidden, intermediate=args.intermediate, layers=args.layers, heads=args.heads,
        kv_heads=args.kv_heads, head_dim=args.head_dim or args.hidden // args.heads, vocab=args.vocab,
    )
    rows, skipped = sweep(rt, shape, args)
    config_path = write_surface(args.out, rows, shape, cuda=rt.cuda)
    print(f"{len(rows)} points -> {args.out}, config -> {config_path}; skipped {len(skipped)}")
    for line in skipped:
        print(f"  skipped {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
