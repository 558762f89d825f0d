"""A fine-tuned or distilled classifier as an MLflow pyfunc model."""

from __future__ import annotations

import pandas as pd

from albert_dist.tracking.models import BATCH_SIZE, MODEL_ARTIFACT, TEXT, TEXT_PAIR, DataFrameModel


class SequenceClassifierModel(DataFrameModel):
    """A fine-tuned or distilled classifier (or regressor), predicting through `albert-dist predict`'s
    predictor."""

    def __init__(self, pair: bool = False):
        self.pair = pair

    def load_context(self, context) -> None:
        from albert_dist.finetune.predict import Predictor

        self.predictor = Predictor(
            context.artifacts[MODEL_ARTIFACT], TEXT, TEXT_PAIR if self.pair else None, BATCH_SIZE
        )

    def predict(self, context, model_input, params=None):
        inputs = [TEXT, TEXT_PAIR] if self.pair else [TEXT]
        rows = {name: model_input[name].to_numpy() for name in inputs}
        out = self.predictor(rows)
        return pd.DataFrame({name: values for name, values in out.items() if name not in rows})
