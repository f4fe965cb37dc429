"""Build a tiny random-weight Llama model and a local byte-level BPE tokenizer for the real-vLLM e2e test.

Run with the vLLM venv's python (it needs torch, transformers and tokenizers, which the project venv lacks):

    $VLLM_VENV/bin/python tests/e2e/build_tiny_model.py OUT_DIR

Nothing is downloaded and no weights are committed: the tokenizer is trained on the Python standard library's own
sources and the weights are random (fixed seed). Greedy decoding of a random model falls into repetition loops, so
n-gram drafts are often accepted; the test mixes prompts to get partial acceptance.

Sizes follow the recipe that is known to work with vLLM 0.32 on CPU: 2 layers, hidden 128, 2 heads of head_dim 64
(a head size the CPU attention kernels support), vocab 2048, bf16.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

# Only the vLLM venv has these; the project venv (which type-checks this file) does not.
import torch  # type: ignore[import-not-found]
from tokenizers import (  # type: ignore[import-not-found]
    Tokenizer,
    decoders,
    models,
    pre_tokenizers,
    processors,
    trainers,
)
from transformers import (  # type: ignore[import-not-found]
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

VOCAB_SIZE = 2048
MAX_POSITIONS = 1024
SEED = 1234
# Enough text for a 2k-token BPE without making training slow on 2 cores.
MAX_CORPUS_BYTES = 4_000_000
SPECIAL_TOKENS = ["<s>", "</s>", "<pad>", "<unk>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def _corpus() -> Iterator[str]:
    """Yield stdlib source texts in a fixed order so the tokenizer is the same on every run of one Python."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    total = 0
    for path in sorted(stdlib.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        total += len(text)
        yield text
        if total >= MAX_CORPUS_BYTES:
            return


def _build_tokenizer(out: Path) -> None:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        model_max_length=MAX_POSITIONS,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))


def _build_model(out: Path) -> None:
    torch.manual_seed(SEED)
    config = LlamaConfig(
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
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(str(out), safe_serialization=True)


def build(out: Path) -> None:
    """Build into a sibling temp dir and rename, so a killed build never leaves a half model at `out`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".tmp-", dir=out.parent))
    try:
        _build_tokenizer(tmp)
        _build_model(tmp)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="directory to write the model and tokenizer into")
    args = parser.parse_args(argv)
    build(args.out)
    print(f"tiny model written to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
