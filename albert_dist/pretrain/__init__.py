"""Pretraining: `albert-dist pretrain` (job, config), the MLM + SOP task its workers run, the learning-rate range test
(`albert-dist lr-range`) and the pretrained encoder as an MLflow model."""
