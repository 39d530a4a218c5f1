"""Write a Llama-architecture GGUF with random weights, of a chosen shape.

For timing an engine where no real model can be carried: prefill and decode
cost depend on the shape and the weight bytes, not on the values, so the
timings are real and the answers are noise. The tokenizer and chat template
are SmolLM2's (read once from the bundled GGUF with ``extract``), so
prompts tokenize and render as a real chat model's do.

    python tests/gpu/make_model.py extract SmolLM2.gguf tokenizer.json
    python tests/gpu/make_model.py write model.gguf --tokenizer tokenizer.json --shape 8b
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

# name: (layers, dim, heads, kv_heads, ffn); vocab is the tokenizer's.
SHAPES = {
    "tiny": (2, 256, 4, 2, 512),        # for checking this script on a CPU
    "1b": (16, 2048, 32, 8, 8192),      # Llama-3.2-1B's shape
    "8b": (32, 4096, 32, 8, 14336),     # Llama-3.1-8B's shape
}
TOKENIZER_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                  "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                  "tokenizer.ggml.padding_token_id", "tokenizer.chat_template")


def extract(source: Path, out: Path) -> None:
    """Save the tokenizer fields of ``source`` as JSON."""
    from gguf import GGUFReader

    reader = GGUFReader(str(source))
    found = {}
    for key in TOKENIZER_KEYS:
        field = reader.fields.get(key)
        if field is not None:
            found[key] = field.contents()
    out.write_text(json.dumps(found), encoding="utf-8")
    print(f"{out}: {len(found['tokenizer.ggml.tokens'])} tokens, {len(found.get('tokenizer.ggml.merges', []))} merges")


def write(out: Path, tokenizer: Path, shape: str, n_ctx_train: int) -> None:
    """Write the model: f16 weights, one random block per tensor shape
    (reused across layers, so memory stays small whatever the size)."""
    import gguf

    layers, dim, heads, kv_heads, ffn = SHAPES[shape]
    tok = json.loads(tokenizer.read_text(encoding="utf-8"))
    vocab = len(tok["tokenizer.ggml.tokens"])
    head_dim = dim // heads
    writer = gguf.GGUFWriter(str(out), "llama")
    writer.add_name(f"random-llama-{shape} (random weights: timings only)")
    writer.add_block_count(layers)
    writer.add_context_length(n_ctx_train)
    writer.add_embedding_length(dim)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(500000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_tokenizer_model(tok["tokenizer.ggml.model"])
    if "tokenizer.ggml.pre" in tok:
        writer.add_tokenizer_pre(tok["tokenizer.ggml.pre"])
    writer.add_token_list(tok["tokenizer.ggml.tokens"])
    writer.add_token_types(tok["tokenizer.ggml.token_type"])
    if "tokenizer.ggml.merges" in tok:
        writer.add_token_merges(tok["tokenizer.ggml.merges"])
    writer.add_bos_token_id(int(tok["tokenizer.ggml.bos_token_id"]))
    writer.add_eos_token_id(int(tok["tokenizer.ggml.eos_token_id"]))
    if "tokenizer.ggml.padding_token_id" in tok:
        writer.add_pad_token_id(int(tok["tokenizer.ggml.padding_token_id"]))
    writer.add_chat_template(tok["tokenizer.chat_template"])

    rng = np.random.default_rng(0)
    blocks: dict[tuple[int, ...], np.ndarray] = {}

    def random(*shape_: int, scale: float = 0.02) -> np.ndarray:
        if shape_ not in blocks:
            blocks[shape_] = (rng.standard_normal(shape_, dtype=np.float32) * scale).astype(np.float16)
        return blocks[shape_]

    ones = np.ones(dim, dtype=np.float32)
    writer.add_tensor("token_embd.weight", random(vocab, dim))
    for i in range(layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", ones)
        writer.add_tensor(f"blk.{i}.attn_q.weight", random(dim, dim))
        writer.add_tensor(f"blk.{i}.attn_k.weight", random(kv_heads * head_dim, dim))
        writer.add_tensor(f"blk.{i}.attn_v.weight", random(kv_heads * head_dim, dim))
        writer.add_tensor(f"blk.{i}.attn_output.weight", random(dim, dim))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", ones)
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", random(ffn, dim))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", random(ffn, dim))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", random(dim, ffn))
    writer.add_tensor("output_norm.weight", ones)
    writer.add_tensor("output.weight", random(vocab, dim))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file(progress=False)
    writer.close()
    params = vocab * dim * 2 + layers * (2 * dim * dim + 2 * kv_heads * head_dim * dim + 3 * ffn * dim)
    print(f"{out}: random-weight llama-{shape}, {layers} layers, dim {dim}, {heads}/{kv_heads} heads, ffn {ffn}, "
          f"vocab {vocab}, {params / 1e9:.2f} B parameters, {out.stat().st_size / 2**30:.2f} GiB f16. "
          "Its timings are real; its answers are noise.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    e = sub.add_parser("extract", help="save a GGUF's tokenizer as JSON")
    e.add_argument("source", type=Path)
    e.add_argument("out", type=Path)
    w = sub.add_parser("write", help="write a random-weight model")
    w.add_argument("out", type=Path)
    w.add_argument("--tokenizer", type=Path, required=True)
    w.add_argument("--shape", choices=sorted(SHAPES), default="8b")
    w.add_argument("--n-ctx-train", type=int, default=8192)
    args = parser.parse_args(argv)
    if args.command == "extract":
        extract(args.source, args.out)
    else:
        write(args.out, args.tokenizer, args.shape, args.n_ctx_train)
    return 0


if __name__ == "__main__":
    sys.exit(main())
