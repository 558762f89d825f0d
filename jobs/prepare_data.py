"""Ray job: prepare a corpus: Parquet shards of SOP instances, tokenizer, manifest."""

from jobs._entry import run

if __name__ == "__main__":
    run(__doc__, "prepare_data", "albert_dist.config:DataJobConfig",
        "albert_dist.data.prepare:run_prepare")
