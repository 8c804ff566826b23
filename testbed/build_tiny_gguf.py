"""Build a tiny random-weight Llama as one GGUF file for llama.cpp, offline and deterministic.

Runs under the llama.cpp venv's interpreter (it needs `gguf`, `numpy` and `tokenizers`, which
scripts/install-llamacpp.sh puts there): `python build_tiny_gguf.py OUT.gguf`. The tokenizer is
the one the vLLM test model uses (testbed/build_tiny_model.py: a byte-level BPE trained on the
same word list with the same seed), so a prompt is about as many tokens on both engines. The
shape matches the vLLM model too (2 layers, hidden 128, 4 heads, 2 KV heads, FFN 256); the
weights are drawn with numpy, f32, so the file is ~2.3 MB and CPU inference is fast. Generated
text is noise: tests assert on metrics, never text.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from build_tiny_model import CHAT_TEMPLATE, SPECIAL, train_tokenizer  # noqa: E402

ARCH = "llama"
N_EMBD, N_FF, N_LAYER, N_HEAD, N_HEAD_KV, N_CTX_TRAIN = 128, 256, 2, 4, 2, 2048
RMS_EPS, ROPE_BASE = 1e-6, 10000.0


def _tokenizer_tables(seed: int) -> tuple[list[str], list[int], list[str]]:
    """(tokens by id, token types, merges "a b") of the trained byte-level BPE."""
    tok = train_tokenizer(random.Random(seed))
    spec = json.loads(tok.to_str())
    vocab: dict[str, int] = spec["model"]["vocab"]
    tokens = [""] * len(vocab)
    for piece, idx in vocab.items():
        tokens[idx] = piece
    if "" in tokens:
        raise RuntimeError("the trained vocabulary has gaps in its ids")
    special = set(SPECIAL)
    types = [3 if t in special else 1 for t in tokens]  # 3 = control, 1 = normal
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    return tokens, types, merges


def _weights(n_vocab: int, seed: int) -> list[tuple[str, object]]:
    """Llama tensors with llama.cpp's GGUF names, numpy (rows = outputs) f32."""
    import numpy as np

    rng = np.random.default_rng(seed)
    head_dim = N_EMBD // N_HEAD

    def mat(rows: int, cols: int):
        return (rng.standard_normal((rows, cols)) * 0.02).astype(np.float32)

    def ones(n: int):
        return np.ones(n, dtype=np.float32)

    out = [("token_embd.weight", mat(n_vocab, N_EMBD))]
    for i in range(N_LAYER):
        b = f"blk.{i}."
        out += [
            (b + "attn_norm.weight", ones(N_EMBD)),
            (b + "attn_q.weight", mat(N_EMBD, N_EMBD)),
            (b + "attn_k.weight", mat(N_HEAD_KV * head_dim, N_EMBD)),
            (b + "attn_v.weight", mat(N_HEAD_KV * head_dim, N_EMBD)),
            (b + "attn_output.weight", mat(N_EMBD, N_EMBD)),
            (b + "ffn_norm.weight", ones(N_EMBD)),
            (b + "ffn_gate.weight", mat(N_FF, N_EMBD)),
            (b + "ffn_up.weight", mat(N_FF, N_EMBD)),
            (b + "ffn_down.weight", mat(N_EMBD, N_FF)),
        ]
    out += [("output_norm.weight", ones(N_EMBD)), ("output.weight", mat(n_vocab, N_EMBD))]
    return out


def build(out: Path, seed: int = 0) -> dict:
    """Write the GGUF file `out`; return a summary."""
    import gguf

    tokens, types, merges = _tokenizer_tables(seed)
    tensors = _weights(len(tokens), seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(out), ARCH)
    w.add_name("tiny-llama")
    w.add_context_length(N_CTX_TRAIN)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_layer_norm_rms_eps(RMS_EPS)
    w.add_rope_freq_base(ROPE_BASE)
    w.add_vocab_size(len(tokens))
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index("<s>"))
    w.add_eos_token_id(tokens.index("</s>"))
    w.add_pad_token_id(tokens.index("<pad>"))
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
    for name, arr in tensors:
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {
        "out": str(out),
        "vocab": len(tokens),
        "merges": len(merges),
        "params": int(sum(a.size for _, a in tensors)),
        "bytes": out.stat().st_size,
    }


if __name__ == "__main__":
    print(json.dumps(build(Path(sys.argv[1]))))
