"""A pretrained encoder as an MLflow pyfunc model: one embedding per text."""

from __future__ import annotations

import numpy as np
import pandas as pd

from albert_dist.data import batching
from albert_dist.tracking.models import BATCH_SIZE, MODEL_ARTIFACT, TEXT, DataFrameModel


class EncoderModel(DataFrameModel):
    """A pretrained ALBERT: one embedding per text (mean of the last hidden states over its tokens)."""

    def load_context(self, context) -> None:
        from albert_dist.model import AlbertForPreTraining
        from albert_dist.tokenizer.albert_tokenizer import load_tokenizer

        directory = context.artifacts[MODEL_ARTIFACT]
        self.model = AlbertForPreTraining.from_pretrained(directory).eval()
        self.tokenizer = load_tokenizer(directory)

    def predict(self, context, model_input, params=None):
        import torch

        texts = ["" if v is None else str(v) for v in model_input[TEXT]]
        arrays = batching.encode_texts(self.tokenizer, texts, None, self.model.config.max_position_embeddings)
        embeddings = []
        with torch.no_grad():
            for batch in batching.batches(batching.EncodedSplit(arrays), BATCH_SIZE, 8):
                hidden = self.model.albert(
                    batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]
                ).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).float()
                embeddings.extend(((hidden * mask).sum(1) / mask.sum(1)).numpy().astype(np.float32))
        return pd.DataFrame({"embedding": embeddings})
