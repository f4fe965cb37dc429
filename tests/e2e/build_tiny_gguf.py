"""Build a tiny random-weight Llama model as one GGUF file, with its own SentencePiece-style vocab, for llama.cpp.

Run with the llama.cpp venv's python (it has `gguf`, llama.cpp's gguf-py, which the project venv lacks):

    $LLAMACPP_VENV/bin/python tests/e2e/build_tiny_gguf.py OUT.gguf

Nothing is downloaded and no weights are committed. The vocab is built here: llama.cpp's "llama" (SPM) tokenizer
with byte fallback: the control tokens, the 256 `<0xXX>` byte tokens, the printable ASCII characters and `▁`
(SentencePiece's space), then pieces merged BPE-style from a fixed text, scored so that earlier merges win. Any
UTF-8 text tokenizes (unknown characters fall back to bytes). The weights are random (fixed seed, so the file is
byte-identical on every run), f32: 2 layers, hidden 128, 4 heads of 32, vocab 589, ~0.5 M parameters, ~1.9 MB.
Greedy decoding of a random model falls into repetition loops, so n-gram drafts get accepted (about 60% of the
draft tokens under e2e_llamacpp's load).
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path

# Only the llama.cpp venv has gguf; the project venv (which type-checks this file) does not.
import gguf  # type: ignore[import-not-found, unused-ignore]
import numpy as np
import numpy.typing as npt

SEED = 1234
N_EMBD = 128
N_FF = 256
N_LAYER = 2
N_HEAD = 4
N_HEAD_KV = 4
CONTEXT_LENGTH = 2048
RMS_EPS = 1e-5
WEIGHT_STD = 0.5
N_MERGES = 256
Weights = npt.NDArray[np.float32]

SPACE = "\u2581"  # SentencePiece's visible space: llama.cpp's SPM tokenizer writes spaces as this character
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
FIRST_CHAR_ID = 3 + 256  # after the control tokens and the byte tokens
# Text the merges are learned from: plain English and a little code, enough for a few hundred common pieces.
MERGE_TEXT = """
the cat sat on the mat and the dog sat on the log. once upon a time in a land far away there lived a king
who had three daughters. the quick brown fox jumps over the lazy dog. a b c d a b c d a b c d.
for i in range(10): print(i)
import os
import sys
def main():
    parser = argparse.ArgumentParser()
class Foo(object):
    def __init__(self, x, y):
        self.x = x
        self.y = y
def fibonacci(n): return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)
SELECT name, price FROM items WHERE price > 10 ORDER BY price;
"""


def _learn_merges(text: str, count: int) -> list[str]:
    """BPE over the words of `text` (each prefixed with SPACE): the `count` most frequent merged pieces, in order."""
    words = Counter(SPACE + word for word in text.split())
    splits = {word: list(word) for word in words}
    pieces: list[str] = []
    while len(pieces) < count:
        pairs: Counter[tuple[str, str]] = Counter()
        for word, freq in words.items():
            symbols = splits[word]
            for left, right in itertools.pairwise(symbols):
                pairs[(left, right)] += freq
        if not pairs:
            break
        # Most frequent first; ties broken by the pair itself, so the order is the same on every run.
        (left, right), _ = min(pairs.items(), key=lambda item: (-item[1], item[0]))
        merged = left + right
        pieces.append(merged)
        for word in words:
            symbols, out, i = splits[word], [], 0
            while i < len(symbols):
                if i + 1 < len(symbols) and symbols[i] == left and symbols[i + 1] == right:
                    out.append(merged)
                    i += 2
                else:
                    out.append(symbols[i])
                    i += 1
            splits[word] = out
    return pieces


def vocab() -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and token types of the SPM vocab (ids: <unk> 0, <s> 1, </s> 2, then bytes, chars, pieces)."""
    tokens = ["<unk>", "<s>", "</s>"]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    tokens += [f"<0x{byte:02X}>" for byte in range(256)]
    types += [gguf.TokenType.BYTE] * 256
    chars = [SPACE] + [chr(code) for code in range(0x21, 0x7F)]
    merges = [piece for piece in _learn_merges(MERGE_TEXT, N_MERGES) if piece not in chars]
    tokens += chars + merges
    types += [gguf.TokenType.NORMAL] * (len(chars) + len(merges))
    # SPM merges the adjacent pair whose merged piece scores highest: earlier (more frequent) merges score higher.
    scores = [0.0] * FIRST_CHAR_ID + [-1.0] * len(chars) + [-2.0 - rank for rank in range(len(merges))]
    return tokens, scores, [int(kind) for kind in types]


def _tensors(n_vocab: int) -> dict[str, Weights]:
    """Random weights in the (out, in) layout gguf-py expects (it writes dims reversed); RMS-norm weights are 1."""
    rng = np.random.default_rng(SEED)

    def normal(rows: int, cols: int, std: float) -> Weights:
        weights: Weights = (rng.standard_normal((rows, cols)) * std).astype(np.float32)
        return weights

    def dense(rows: int, cols: int) -> Weights:
        return normal(rows, cols, WEIGHT_STD / math.sqrt(cols))

    head_dim = N_EMBD // N_HEAD
    ones = np.ones(N_EMBD, dtype=np.float32)
    tensors = {"token_embd.weight": normal(n_vocab, N_EMBD, WEIGHT_STD)}
    for layer in range(N_LAYER):
        blk = f"blk.{layer}"
        tensors[f"{blk}.attn_norm.weight"] = ones
        tensors[f"{blk}.attn_q.weight"] = dense(N_HEAD * head_dim, N_EMBD)
        tensors[f"{blk}.attn_k.weight"] = dense(N_HEAD_KV * head_dim, N_EMBD)
        tensors[f"{blk}.attn_v.weight"] = dense(N_HEAD_KV * head_dim, N_EMBD)
        tensors[f"{blk}.attn_output.weight"] = dense(N_EMBD, N_HEAD * head_dim)
        tensors[f"{blk}.ffn_norm.weight"] = ones
        tensors[f"{blk}.ffn_gate.weight"] = dense(N_FF, N_EMBD)
        tensors[f"{blk}.ffn_up.weight"] = dense(N_FF, N_EMBD)
        tensors[f"{blk}.ffn_down.weight"] = dense(N_EMBD, N_FF)
    tensors["output_norm.weight"] = ones
    output = dense(n_vocab, N_EMBD)
    # Zero logits for <unk>, <s>, </s> and the byte tokens: some other token always scores higher, so greedy
    # decoding never stops early and never writes a lone byte (the server rejects output that is not valid UTF-8).
    output[:FIRST_CHAR_ID] = 0.0
    tensors["output.weight"] = output
    return tensors


def _write(path: Path) -> None:
    tokens, scores, types = vocab()
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("spec-advisor tiny random llama")
    writer.add_context_length(CONTEXT_LENGTH)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_rope_dimension_count(N_EMBD // N_HEAD)
    writer.add_layer_norm_rms_eps(RMS_EPS)
    writer.add_vocab_size(len(tokens))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(UNK_ID)
    writer.add_bos_token_id(BOS_ID)
    writer.add_eos_token_id(EOS_ID)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_add_space_prefix(True)
    for name, data in _tensors(len(tokens)).items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def build(out: Path) -> None:
    """Write to a sibling temp file and rename, so a killed build never leaves a half model at `out`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=out.name + ".tmp-", dir=out.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        _write(tmp)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the .gguf file to write")
    args = parser.parse_args(argv)
    build(args.out)
    print(f"tiny GGUF written to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
