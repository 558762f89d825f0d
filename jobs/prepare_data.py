"""Ray job: prepare a corpus: Parquet shards of SOP instances, tokenizer, manifest."""

from jobs._entry import run

if __name__ == "__main__":
    run("prepare_data")
