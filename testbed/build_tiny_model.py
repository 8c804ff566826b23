"""Build a tiny random-weight Llama and a locally trained byte-level BPE tokenizer, offline.

Runs under the vLLM venv's interpreter (it needs torch, transformers and tokenizers, which the
kvscope venv does not carry): `python build_tiny_model.py OUT_DIR`. Deterministic for a given
seed. The weights are random, so generated text is noise: tests assert on metrics, never text.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

WORDS = (
    "the a an of to in is it that for on with as was at by be this from or have not are "
    "system user assistant hello world request token cache prefix metric trace span latency "
    "queue model server time count value error ok yes no one two three four five six seven "
    "eight nine ten red green blue fast slow big small tenant policy refund order invoice "
    "support agent code review search answer summary document table chart report"
).split()
SPECIAL = ["<unk>", "<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def train_tokenizer(rng: random.Random):
    """A byte-level BPE trained on generated sentences over WORDS (so most words are 1 token)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    sentences = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 40))) for _ in range(4000)]
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        sentences,
        trainers.BpeTrainer(
            vocab_size=1024,
            special_tokens=SPECIAL,
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def build(out: Path, seed: int = 0) -> dict:
    """Write tokenizer + config + safetensors weights into `out`; return a summary."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    tok = train_tokenizer(random.Random(seed))
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        additional_special_tokens=SPECIAL[4:],
    )
    hf_tok.chat_template = CHAT_TEMPLATE
    hf_tok.model_max_length = 2048
    hf_tok.save_pretrained(out)
    vocab = tok.get_vocab_size()
    cfg = LlamaConfig(
        vocab_size=(vocab + 63) // 64 * 64,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        bos_token_id=hf_tok.bos_token_id,
        eos_token_id=hf_tok.eos_token_id,
        pad_token_id=hf_tok.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    return {"out": str(out), "vocab": vocab, "params": sum(p.numel() for p in model.parameters())}


if __name__ == "__main__":
    print(json.dumps(build(Path(sys.argv[1]))))
