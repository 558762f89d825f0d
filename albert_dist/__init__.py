"""albert-dist: pretrain, fine-tune and distill ALBERT models on Ray, tracked in MLflow (`albert-dist --help`)."""
