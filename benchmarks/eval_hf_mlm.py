"""Held-out MLM (and SOP) accuracy of an exported model measured with transformers alone, as a user checks one:
`transformers.AlbertForPreTraining` (or `AlbertForMaskedLM`), positions drawn by transformers'
`DataCollatorForLanguageModeling` (single tokens, 15 %, seeded) and every one of them shown as [MASK] (fill-mask as
papers measure it: a token left visible would be scored by copying it), next to the unigram baseline of the same
positions (always predicting their most frequent token).

Either the prepared data's eval split (ids as `data prepare` wrote them), or with `--text` raw text (one paragraph a
line, blank lines skipped) through the export's `AutoTokenizer`, each line cut at `--max-length` tokens:

    python benchmarks/eval_hf_mlm.py runs/albert-tiny-zh/model data/prepared_zh
    python benchmarks/eval_hf_mlm.py runs/albert-tiny-zh/model --text heldout.txt
"""

from __future__ import annotations

import argparse
from collections import Counter


def score(model, tokenizer, rows: list[dict], batch_size: int = 32, seed: int = 0) -> dict[str, float]:
    """MLM accuracy with every masked position [MASK] and the unigram baseline of those positions; SOP accuracy
    when the rows have `sop_label`. `rows`: dicts of `input_ids` (and `token_type_ids`, `sop_label`)."""
    import torch
    import transformers

    collator = transformers.DataCollatorForLanguageModeling(tokenizer, mlm=True, mlm_probability=0.15)
    torch.manual_seed(seed)
    correct = sop_correct = 0
    labels_seen: Counter = Counter()
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        batch = collator([{k: r[k] for k in ("input_ids", "token_type_ids") if k in r} for r in chunk])
        masked = batch["labels"] != -100
        batch["input_ids"][masked] = tokenizer.mask_token_id  # no random or kept token: nothing to copy
        with torch.no_grad():
            out = model(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                **({"token_type_ids": batch["token_type_ids"]} if "token_type_ids" in batch else {}),
            )
        logits = out.prediction_logits if hasattr(out, "prediction_logits") else out.logits
        correct += int((logits.argmax(-1)[masked] == batch["labels"][masked]).sum())
        labels_seen.update(batch["labels"][masked].tolist())
        if "sop_label" in chunk[0] and hasattr(out, "sop_logits"):
            sop_correct += int((out.sop_logits.argmax(-1) == torch.tensor([r["sop_label"] for r in chunk])).sum())
    count = max(1, sum(labels_seen.values()))
    metrics = {
        "sequences": len(rows),
        "masked": count,
        "mlm_accuracy": correct / count,
        "unigram_baseline": max(labels_seen.values(), default=0) / count,
    }
    if rows and "sop_label" in rows[0]:
        metrics["sop_accuracy"] = sop_correct / len(rows)
    return metrics


def text_rows(tokenizer, path: str, max_length: int = 128) -> list[dict]:
    """Raw text, one paragraph a line, through `tokenizer` as a user's text reaches the model."""
    with open(path, encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()]
    encoded = tokenizer(lines, truncation=True, max_length=max_length)
    return [{"input_ids": ids} for ids in encoded["input_ids"] if len(ids) > 2]


def prepared_rows(prepared: str) -> list[dict]:
    import pyarrow.parquet as pq

    from albert_dist.data.loading import load_prepared

    table = pq.read_table(load_prepared(prepared).shard_paths("eval"))
    return table.select(["input_ids", "token_type_ids", "sop_label"]).to_pylist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a model directory (config.json, weights, tokenizer)")
    parser.add_argument("prepared", nargs="?", help="the prepared dataset whose eval split is scored")
    parser.add_argument("--text", help="score raw text (one paragraph a line) instead of a prepared eval split")
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if (args.prepared is None) == (args.text is None):
        parser.error("give a prepared dataset or --text, one of them")

    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(args.model)
    model = transformers.AlbertForPreTraining.from_pretrained(args.model).eval()
    rows = text_rows(tokenizer, args.text, args.max_length) if args.text else prepared_rows(args.prepared)
    m = score(model, tokenizer, rows, args.batch_size, args.seed)
    sop = f", SOP accuracy {m['sop_accuracy']:.3f}" if "sop_accuracy" in m else ""
    print(
        f"{m['sequences']} held-out sequences, {m['masked']} masked tokens, every one [MASK] (transformers "
        f"{transformers.__version__}): MLM accuracy {m['mlm_accuracy']:.3f} (unigram baseline "
        f"{m['unigram_baseline']:.3f}){sop}"
    )


if __name__ == "__main__":
    main()
