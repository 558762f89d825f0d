"""Pretraining data: corpus → sentences → SOP instances in Parquet shards (prepare), read back (loading), masked at
training time (masking)."""
