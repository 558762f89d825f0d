"""The Hugging Face Hub: model ids resolved to cached snapshots (download), the model card every published model
carries (card), and `albert-dist push` (push)."""
