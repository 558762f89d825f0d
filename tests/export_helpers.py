"""What every exported pretraining model must give in transformers: our tokenizer's ids through `AutoTokenizer`
and our model's MLM and SOP logits through `AlbertForPreTraining`."""

from __future__ import annotations

from pathlib import Path

import torch


def assert_transformers_reads_export(model_dir: Path | str, tokenizer, text: str, pair: str):
    """Load `model_dir` in transformers and assert it encodes (`text`, `pair`) as `tokenizer` (ours) does and gives
    our model's logits for it; returns transformers' tokenizer and model for further checks."""
    import transformers

    from albert_dist.model import AlbertForPreTraining

    hf_tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    hf_model = transformers.AlbertForPreTraining.from_pretrained(model_dir).eval()
    ours = tokenizer.encode_pair(text, pair)
    assert hf_tok(text, pair, return_tensors="pt")["input_ids"][0].tolist() == ours["input_ids"]
    model = AlbertForPreTraining.from_pretrained(model_dir)
    ids, types = torch.tensor([ours["input_ids"]]), torch.tensor([ours["token_type_ids"]])
    with torch.no_grad():
        mine, hf = model(input_ids=ids, token_type_ids=types), hf_model(input_ids=ids, token_type_ids=types)
    torch.testing.assert_close(mine.prediction_logits, hf.prediction_logits, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(mine.sop_logits, hf.sop_logits, atol=1e-4, rtol=1e-4)
    return hf_tok, hf_model
