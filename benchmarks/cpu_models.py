"""The tiny local models of the CPU crossover benchmark (benchmarks/cpu_crossover.py), built on this machine.

Two variants of the random-weight Llama that the real-vLLM e2e tests serve (tests/e2e/build_tiny_model.py; its
logic is copied here, not imported, so the e2e model can change without moving these figures):

- `tied`: input and output embeddings shared (`tie_word_embeddings=True`), as in the catalog's `tiny-llama`
  profile (590k parameters). The residual stream of a random 2-layer model stays close to the last token's
  embedding, so the tied head predicts that token again: greedy decoding falls into loops at once and n-gram
  drafts are nearly always accepted (~96% of draft tokens in a transformers replay of the prompt mix).
- `untied`: a separate random `lm_head` (852k parameters), exactly the e2e builder's model (same config and
  seed). The next token is then a pseudo-random function of the context, loops take a while to form, and
  n-gram acceptance is partial (~55-60% of draft tokens in the same replay).

Nothing is downloaded: the byte-level BPE tokenizer (vocab 2048) is trained on the Python standard library's own
sources; weights are random with a fixed seed. The build needs torch, transformers and tokenizers, which only the
vLLM venv has (they are imported lazily, so the project venv can import this module), and `ensure_model` (called
from the project venv) runs this file there:

    $VLLM_VENV/bin/python benchmarks/cpu_models.py {tied,untied} OUT_DIR
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

VARIANTS = ("tied", "untied")
VOCAB_SIZE = 2048
MAX_POSITIONS = 1024
SEED = 1234
MAX_CORPUS_BYTES = 4_000_000
SPECIAL_TOKENS = ["<s>", "</s>", "<pad>", "<unk>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
BUILD_TIMEOUT_S = 600.0


def _corpus() -> Iterator[str]:
    """Stdlib source texts in a fixed order, so the tokenizer is the same on every run of one Python."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    total = 0
    for path in sorted(stdlib.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        total += len(text)
        yield text
        if total >= MAX_CORPUS_BYTES:
            return


def _build_tokenizer(out: Path) -> None:
    tokenizers = importlib.import_module("tokenizers")
    transformers = importlib.import_module("transformers")
    pre_tokenizers = tokenizers.pre_tokenizers
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    tok.post_processor = tokenizers.processors.ByteLevel(trim_offsets=False)
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        model_max_length=MAX_POSITIONS,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))


def _build_model(out: Path, *, tied: bool) -> None:
    torch = importlib.import_module("torch")
    transformers = importlib.import_module("transformers")
    torch.manual_seed(SEED)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        tie_word_embeddings=tied,
        torch_dtype="bfloat16",
    )
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(str(out), safe_serialization=True)


def build(variant: str, out: Path) -> None:
    """Build `variant` into a sibling temp dir and rename it to `out`, so a killed build never leaves half a model."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose one of {VARIANTS}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".tmp-", dir=out.parent))
    try:
        _build_tokenizer(tmp)
        _build_model(tmp, tied=variant == "tied")
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def model_dir(cache: Path, variant: str) -> Path:
    """Where `variant` lives in `cache`: keyed by this file's hash, so a changed builder builds anew."""
    digest = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]
    return cache / f"tiny-{variant}-{digest}"


def ensure_model(variant: str, *, cache: Path, vllm_python: Path, env: Mapping[str, str]) -> Path:
    """The built model directory for `variant`, building it with the vLLM venv's python when it is missing.

    Raises RuntimeError with the builder's output tail when the build fails or takes over BUILD_TIMEOUT_S.
    """
    out = model_dir(cache, variant)
    if (out / "config.json").is_file() and (out / "tokenizer.json").is_file():
        return out
    try:
        result = subprocess.run(
            [str(vllm_python), str(Path(__file__).resolve()), variant, str(out)],
            env=dict(env),
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"building the {variant} model took over {BUILD_TIMEOUT_S:.0f} s") from exc
    if result.returncode != 0:
        tail = (result.stdout + result.stderr)[-4000:]
        raise RuntimeError(f"building the {variant} model failed (exit {result.returncode}):\n{tail}")
    return out


def describe(path: Path) -> dict[str, Any]:
    """The fields of a built model's config.json that tell the variants apart (for the benchmark's JSON)."""
    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "head_dim", "vocab_size")
    described: dict[str, Any] = {key: config.get(key) for key in keys}
    described["tie_word_embeddings"] = bool(config.get("tie_word_embeddings"))
    return described


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("variant", choices=VARIANTS)
    parser.add_argument("out", type=Path, help="directory to write the model and tokenizer into")
    args = parser.parse_args(argv)
    build(args.variant, args.out)
    print(f"{args.variant} tiny model written to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
