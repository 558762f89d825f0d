"""Held-out MLM and SOP accuracy of an exported model measured with transformers alone, as a user checks one:
`transformers.AlbertForPreTraining` on the prepared data's eval split, masked by transformers'
`DataCollatorForLanguageModeling` (single tokens, 15 %, 80/10/10, seeded), every masked position scored.

    python benchmarks/eval_hf_mlm.py runs/albert-tiny-zh/model data/prepared_zh
"""

from __future__ import annotations

import argparse

import pyarrow.parquet as pq
import torch

from albert_dist.data.loading import load_prepared


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a model directory (config.json, weights, tokenizer)")
    parser.add_argument("prepared", help="the prepared dataset whose eval split is scored")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(args.model)
    model = transformers.AlbertForPreTraining.from_pretrained(args.model).eval()
    collator = transformers.DataCollatorForLanguageModeling(tokenizer, mlm=True, mlm_probability=0.15)
    table = pq.read_table(load_prepared(args.prepared).shard_paths("eval"))
    rows = table.select(["input_ids", "token_type_ids", "sop_label"]).to_pylist()
    torch.manual_seed(args.seed)
    mlm_correct = mlm_count = sop_correct = 0
    for start in range(0, len(rows), args.batch_size):
        batch = collator([{"input_ids": r["input_ids"], "token_type_ids": r["token_type_ids"]}
                          for r in rows[start:start + args.batch_size]])
        with torch.no_grad():
            out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                        token_type_ids=batch["token_type_ids"])
        masked = batch["labels"] != -100
        mlm_correct += int((out.prediction_logits.argmax(-1)[masked] == batch["labels"][masked]).sum())
        mlm_count += int(masked.sum())
        sop = torch.tensor([r["sop_label"] for r in rows[start:start + args.batch_size]])
        sop_correct += int((out.sop_logits.argmax(-1) == sop).sum())
    print(f"{len(rows)} held-out sequences, {mlm_count} masked tokens (transformers {transformers.__version__}): "
          f"MLM accuracy {mlm_correct / mlm_count:.3f}, SOP accuracy {sop_correct / len(rows):.3f}")


if __name__ == "__main__":
    main()
