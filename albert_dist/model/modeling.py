"""ALBERT in plain PyTorch, read top to bottom: embeddings, shared encoder layers, heads.

Submodule names follow transformers' ALBERT so that state_dict keys match its checkpoints without renaming.
Two things differ from transformers, for speed only: attention runs through
`torch.nn.functional.scaled_dot_product_attention`, and when MLM labels
are given the vocabulary projection runs only on the masked positions instead of on every token (or, in pretraining,
on the `mlm_positions` given: a fixed number of them, so no shape depends on the data). Pretraining can
also take packed rows (several sequences per row, `albert_dist.data.packing`): `position_ids`, `sequence_ids` and
`cls_positions` say where each sequence lies; without them nothing changes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from albert_dist.model import checkpoint as ckpt
from albert_dist.model.config import AlbertConfig

ACT2FN = {
    "gelu_new": partial(F.gelu, approximate="tanh"),  # google's "gelu" is the tanh approximation
    "gelu_pytorch_tanh": partial(F.gelu, approximate="tanh"),
    "gelu_fast": partial(F.gelu, approximate="tanh"),
    "gelu": F.gelu,
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
    "tanh": torch.tanh,
}

IGNORE_INDEX = -100


def layer_to_group(layer: int, num_hidden_layers: int, num_hidden_groups: int) -> int:
    """Index of the parameter group that layer `layer` uses.

    Written exactly as transformers computes it (float division included) because checkpoints must map the same
    way; for the usual configs (groups dividing layers) it equals layer * groups // layers.
    """
    return int(layer / (num_hidden_layers / num_hidden_groups))


# ---------------------------------------------------------------------------------------------------- outputs


@dataclass
class AlbertModelOutput:
    last_hidden_state: Tensor
    pooler_output: Tensor | None = None
    hidden_states: tuple[Tensor, ...] | None = None


@dataclass
class AlbertPreTrainingOutput:
    loss: Tensor | None = None
    mlm_loss: Tensor | None = None
    sop_loss: Tensor | None = None
    prediction_logits: Tensor | None = None  # [B, T, V] without labels; with them [N_masked or N mlm_positions, V]
    mlm_labels: Tensor | None = None  # the labels of the rows of prediction_logits
    sop_logits: Tensor | None = None
    hidden_states: tuple[Tensor, ...] | None = None


@dataclass
class AlbertMaskedLMOutput:
    loss: Tensor | None = None
    logits: Tensor | None = None  # as prediction_logits above
    mlm_labels: Tensor | None = None
    hidden_states: tuple[Tensor, ...] | None = None


@dataclass
class AlbertSequenceClassifierOutput:
    loss: Tensor | None = None
    logits: Tensor | None = None  # [B, num_labels]; token classification: [B, T, num_labels]
    hidden_states: tuple[Tensor, ...] | None = None


@dataclass
class AlbertQuestionAnsweringOutput:
    loss: Tensor | None = None
    start_logits: Tensor | None = None  # [B, T]
    end_logits: Tensor | None = None
    hidden_states: tuple[Tensor, ...] | None = None


# ---------------------------------------------------------------------------------------------------- backbone


class AlbertEmbeddings(nn.Module):
    """word (V x E) + position + token type, then LayerNorm and dropout; the E -> H mapping lives in the encoder."""

    def __init__(self, config: AlbertConfig):
        super().__init__()
        E = config.embedding_size
        self.word_embeddings = nn.Embedding(config.vocab_size, E, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, E)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, E)
        self.LayerNorm = nn.LayerNorm(E, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self, input_ids: Tensor, token_type_ids: Tensor | None = None, position_ids: Tensor | None = None
    ) -> Tensor:
        T = input_ids.shape[1]
        if T > self.position_embeddings.num_embeddings:
            raise ValueError(
                f"sequence length {T} exceeds max_position_embeddings ({self.position_embeddings.num_embeddings})"
            )
        positions = torch.arange(T, device=input_ids.device) if position_ids is None else position_ids
        x = self.word_embeddings(input_ids) + self.position_embeddings(positions)
        if token_type_ids is None:
            x = x + self.token_type_embeddings.weight[0]
        else:
            x = x + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(x))


class AlbertAttention(nn.Module):
    """Multi-head self-attention + output projection + residual + post-LayerNorm."""

    def __init__(self, config: AlbertConfig):
        super().__init__()
        H = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.query = nn.Linear(H, H)
        self.key = nn.Linear(H, H)
        self.value = nn.Linear(H, H)
        self.dense = nn.Linear(H, H)
        self.LayerNorm = nn.LayerNorm(H, eps=config.layer_norm_eps)
        self.attention_dropout_p = config.attention_probs_dropout_prob
        self.output_dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
        B, T, H = x.shape
        q, k, v = (
            proj(x).view(B, T, self.num_heads, -1).transpose(1, 2) for proj in (self.query, self.key, self.value)
        )
        dropout_p = self.attention_dropout_p if self.training else 0.0
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
        context = context.transpose(1, 2).reshape(B, T, H)
        return self.LayerNorm(x + self.output_dropout(self.dense(context)))


class AlbertLayer(nn.Module):
    """One post-LN transformer block: attention, then FFN H -> I -> H + residual + LayerNorm."""

    def __init__(self, config: AlbertConfig):
        super().__init__()
        self.attention = AlbertAttention(config)
        self.ffn = nn.Linear(config.hidden_size, config.intermediate_size)
        self.ffn_output = nn.Linear(config.intermediate_size, config.hidden_size)
        self.activation = ACT2FN[config.hidden_act]
        self.full_layer_layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
        x = self.attention(x, mask)
        return self.full_layer_layer_norm(x + self.ffn_output(self.activation(self.ffn(x))))


class AlbertLayerGroup(nn.Module):
    """A group of `inner_group_num` blocks; one group's parameters are shared by every layer mapped to it."""

    def __init__(self, config: AlbertConfig):
        super().__init__()
        self.albert_layers = nn.ModuleList(AlbertLayer(config) for _ in range(config.inner_group_num))


class AlbertTransformer(nn.Module):
    """E -> H mapping, then `num_hidden_layers` applications of the shared layer groups."""

    def __init__(self, config: AlbertConfig):
        super().__init__()
        self.config = config
        self.embedding_hidden_mapping_in = nn.Linear(config.embedding_size, config.hidden_size)
        self.albert_layer_groups = nn.ModuleList(AlbertLayerGroup(config) for _ in range(config.num_hidden_groups))
        self.gradient_checkpointing = False

    def forward(self, x: Tensor, mask: Tensor | None, output_hidden_states: bool = False):
        x = self.embedding_hidden_mapping_in(x)
        hidden_states = [x] if output_hidden_states else None
        L, G = self.config.num_hidden_layers, self.config.num_hidden_groups
        recompute = self.gradient_checkpointing and self.training and torch.is_grad_enabled()
        for i in range(L):
            for layer in self.albert_layer_groups[layer_to_group(i, L, G)].albert_layers:
                if recompute:
                    # Recompute the block in backward instead of storing its activations (RNG state is replayed).
                    x = checkpoint(layer, x, mask, use_reentrant=False)
                else:
                    x = layer(x, mask)
                if hidden_states is not None:  # one per block, as transformers records them
                    hidden_states.append(x)
        return x, tuple(hidden_states) if hidden_states is not None else None


def padding_mask(attention_mask: Tensor | None) -> Tensor | None:
    """Boolean [B, 1, 1, T] key mask for SDPA (True = attend), or None without `attention_mask` (SDPA's unmasked
    fast path).

    The mask's values are not looked at: telling "nothing padded" from them would make the host wait for the
    device at every forward, and break torch.compile's graph. A row with no real token at all would produce NaNs;
    batches are never built that way.
    """
    if attention_mask is None:
        return None
    return attention_mask.bool()[:, None, None, :]


def sequence_mask(sequence_ids: Tensor) -> Tensor:
    """Boolean [B, 1, T, T] mask for packed rows: a token attends only to the tokens of its own sequence.

    Padding (sequence id 0) forms a block of its own, so no query row is empty (no NaN) and no real token sees it.
    """
    return (sequence_ids[:, :, None] == sequence_ids[:, None, :])[:, None]


# ---------------------------------------------------------------------------------------------------- models


class AlbertPreTrainedModel(nn.Module):
    """Weight init as transformers, checkpoint I/O and activation checkpointing shared by all ALBERT models."""

    # Parameters a checkpoint may lack without harm: heads are newly initialised, not silently broken.
    head_prefixes: tuple[str, ...] = ()
    architecture = "AlbertModel"

    def __init__(self, config: AlbertConfig):
        super().__init__()
        self.config = config

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            module.weight.normal_(0.0, std)
            if module.bias is not None:
                module.bias.zero_()
        elif isinstance(module, nn.Embedding):
            module.weight.normal_(0.0, std)
            if module.padding_idx is not None:
                module.weight[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            module.weight.fill_(1.0)
            module.bias.zero_()
        elif isinstance(module, AlbertMLMHead):
            module.bias.zero_()

    def init_weights(self) -> None:
        self.apply(self._init_weights)

    @property
    def backbone(self) -> AlbertModel:
        return getattr(self, "albert", self)

    @property
    def gradient_checkpointing(self) -> bool:
        return self.backbone.encoder.gradient_checkpointing

    @gradient_checkpointing.setter
    def gradient_checkpointing(self, enabled: bool) -> None:
        self.backbone.encoder.gradient_checkpointing = bool(enabled)

    def gradient_checkpointing_enable(self) -> None:
        self.gradient_checkpointing = True

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def effective_parameters(self) -> int:
        """Parameters counted once per use: a shared layer group counts once for every layer that applies it."""
        c = self.config
        group_params = sum(p.numel() for p in self.backbone.encoder.albert_layer_groups.parameters())
        uses_per_group = c.num_hidden_layers / c.num_hidden_groups
        return self.num_parameters() - group_params + int(group_params * uses_per_group)

    def flops_per_token(self, seq_len: int, training: bool = True) -> float:
        """≈ 2·N_eff + 4·L·H·T per token forward (the matmuls, plus attention scores and values over T positions);
        a training step (forward and backward) is three times that: 6·N_eff + 12·L·H·T."""
        c = self.config
        forward = 2 * self.effective_parameters() + 4 * c.num_hidden_layers * c.hidden_size * seq_len
        return 3 * forward if training else forward

    def save_pretrained(self, directory: str | os.PathLike) -> None:
        ckpt.save_pretrained(self, directory)

    @classmethod
    def from_pretrained(cls, directory: str | os.PathLike, **config_overrides):
        return ckpt.from_pretrained(cls, directory, **config_overrides)


class AlbertModel(AlbertPreTrainedModel):
    """The backbone; checkpoint keys have no prefix (`embeddings.*`, `encoder.*`, `pooler.*`)."""

    def __init__(self, config: AlbertConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = AlbertEmbeddings(config)
        self.encoder = AlbertTransformer(config)
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size) if add_pooling_layer else None
        self.init_weights()

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        output_hidden_states: bool = False,
        *,
        position_ids: Tensor | None = None,
        sequence_ids: Tensor | None = None,
        cls_positions: Tensor | None = None,
    ) -> AlbertModelOutput:
        """Packed rows give `sequence_ids` (attention stays within each sequence; they replace `attention_mask`),
        `position_ids` and `cls_positions`, the flat indices into B × T of each sequence's [CLS]: the pooler then
        reads those, one output per sequence, instead of each row's first token."""
        x = self.embeddings(input_ids, token_type_ids, position_ids)
        mask = padding_mask(attention_mask) if sequence_ids is None else sequence_mask(sequence_ids)
        x, hidden_states = self.encoder(x, mask, output_hidden_states)
        first = x[:, 0] if cls_positions is None else x.flatten(0, 1)[cls_positions]
        pooled = torch.tanh(self.pooler(first)) if self.pooler is not None else None
        return AlbertModelOutput(last_hidden_state=x, pooler_output=pooled, hidden_states=hidden_states)


class AlbertMLMHead(nn.Module):
    """dense H -> E, activation, LayerNorm, then the decoder E -> V whose weight is the word embedding matrix."""

    def __init__(self, config: AlbertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.embedding_size)
        self.LayerNorm = nn.LayerNorm(config.embedding_size, eps=config.layer_norm_eps)
        self.activation = ACT2FN[config.hidden_act]
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, x: Tensor, decoder_weight: Tensor) -> Tensor:
        return F.linear(self.LayerNorm(self.activation(self.dense(x))), decoder_weight, self.bias)


def masked_lm(model: AlbertPreTrainedModel, sequence: Tensor, labels: Tensor | None, positions: Tensor | None = None):
    """(logits, labels of those rows, loss). With labels, only the positions to predict reach the V-way decoder:
    `positions` (flat indices into B × T; those labelled IGNORE_INDEX add nothing to the loss), or else every
    labelled position."""
    decoder_weight = model.albert.embeddings.word_embeddings.weight
    if labels is None:
        return model.predictions(sequence, decoder_weight), None, None
    if positions is None:
        masked = labels != IGNORE_INDEX
        rows, mlm_labels = sequence[masked], labels[masked]
    else:
        rows, mlm_labels = sequence.flatten(0, 1)[positions], labels.flatten()[positions]
    logits = model.predictions(rows, decoder_weight)
    return logits, mlm_labels, F.cross_entropy(logits.float(), mlm_labels, ignore_index=IGNORE_INDEX)


class AlbertSOPHead(nn.Module):
    def __init__(self, config: AlbertConfig):
        super().__init__()
        self.dropout = nn.Dropout(config.classifier_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, 2)

    def forward(self, pooled: Tensor) -> Tensor:
        return self.classifier(self.dropout(pooled))


class AlbertForPreTraining(AlbertPreTrainedModel):
    """Masked LM + sentence-order prediction; loss = mlm_loss + sop_loss."""

    head_prefixes = ("predictions.", "sop_classifier.")
    architecture = "AlbertForPreTraining"

    def __init__(self, config: AlbertConfig):
        super().__init__(config)
        self.albert = AlbertModel(config)
        self.predictions = AlbertMLMHead(config)
        self.sop_classifier = AlbertSOPHead(config)
        self.init_weights()

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        labels: Tensor | None = None,
        sentence_order_label: Tensor | None = None,
        output_hidden_states: bool = False,
        mlm_positions: Tensor | None = None,
        **packed: Tensor | None,
    ) -> AlbertPreTrainingOutput:
        """`mlm_positions`: the flat indices into B × T of the positions the MLM head predicts (default: those with
        a label; see `masked_lm`). `packed`: `position_ids`, `sequence_ids`, `cls_positions` of packed rows (see
        `AlbertModel.forward`)."""
        out = self.albert(input_ids, attention_mask, token_type_ids, output_hidden_states, **packed)
        logits, mlm_labels, mlm_loss = masked_lm(self, out.last_hidden_state, labels, mlm_positions)
        sop_logits = self.sop_classifier(out.pooler_output)
        sop_loss = None
        if sentence_order_label is not None:
            sop_loss = F.cross_entropy(sop_logits.float(), sentence_order_label.view(-1))
        losses = [l for l in (mlm_loss, sop_loss) if l is not None]
        return AlbertPreTrainingOutput(
            loss=sum(losses) if losses else None,
            mlm_loss=mlm_loss,
            sop_loss=sop_loss,
            prediction_logits=logits,
            mlm_labels=mlm_labels,
            sop_logits=sop_logits,
            hidden_states=out.hidden_states,
        )


class AlbertForMaskedLM(AlbertPreTrainedModel):
    head_prefixes = ("predictions.",)
    architecture = "AlbertForMaskedLM"

    def __init__(self, config: AlbertConfig):
        super().__init__(config)
        self.albert = AlbertModel(config, add_pooling_layer=False)
        self.predictions = AlbertMLMHead(config)
        self.init_weights()

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        labels: Tensor | None = None,
        output_hidden_states: bool = False,
    ) -> AlbertMaskedLMOutput:
        out = self.albert(input_ids, attention_mask, token_type_ids, output_hidden_states)
        logits, mlm_labels, loss = masked_lm(self, out.last_hidden_state, labels)
        return AlbertMaskedLMOutput(loss=loss, logits=logits, mlm_labels=mlm_labels, hidden_states=out.hidden_states)


class AlbertForSequenceClassification(AlbertPreTrainedModel):
    """`classifier` on dropout(pooled output). Loss as transformers: MSE when num_labels == 1, CE for integer
    labels, BCE-with-logits for multi-label float targets (or whatever config.problem_type says)."""

    head_prefixes = ("classifier.", "albert.pooler.")
    architecture = "AlbertForSequenceClassification"

    def __init__(self, config: AlbertConfig):
        super().__init__(config)
        self.albert = AlbertModel(config)
        self.dropout = nn.Dropout(config.classifier_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.init_weights()

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        labels: Tensor | None = None,
        output_hidden_states: bool = False,
    ) -> AlbertSequenceClassifierOutput:
        out = self.albert(input_ids, attention_mask, token_type_ids, output_hidden_states)
        logits = self.classifier(self.dropout(out.pooler_output))
        loss = None if labels is None else self.loss(logits, labels)
        return AlbertSequenceClassifierOutput(loss=loss, logits=logits, hidden_states=out.hidden_states)

    def loss(self, logits: Tensor, labels: Tensor) -> Tensor:
        problem_type = self.config.problem_type
        if problem_type is None:
            if self.config.num_labels == 1:
                problem_type = "regression"
            elif labels.dtype in (torch.long, torch.int):
                problem_type = "single_label_classification"
            else:
                problem_type = "multi_label_classification"
        logits = logits.float()
        if problem_type == "regression":
            if self.config.num_labels == 1:
                return F.mse_loss(logits.squeeze(-1), labels.squeeze(-1).float())
            return F.mse_loss(logits, labels.float())
        if problem_type == "single_label_classification":
            return F.cross_entropy(logits.view(-1, self.config.num_labels), labels.view(-1))
        return F.binary_cross_entropy_with_logits(logits, labels.float())


class AlbertForTokenClassification(AlbertPreTrainedModel):
    """`classifier` on dropout(every position's hidden state), as transformers' (no pooler). Labels -100 (pieces
    after a word's first, special tokens, padding) are left out of the loss."""

    head_prefixes = ("classifier.",)
    architecture = "AlbertForTokenClassification"

    def __init__(self, config: AlbertConfig):
        super().__init__(config)
        self.albert = AlbertModel(config, add_pooling_layer=False)
        self.dropout = nn.Dropout(config.classifier_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.init_weights()

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        labels: Tensor | None = None,
        output_hidden_states: bool = False,
    ) -> AlbertSequenceClassifierOutput:
        out = self.albert(input_ids, attention_mask, token_type_ids, output_hidden_states)
        logits = self.classifier(self.dropout(out.last_hidden_state))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.float().flatten(0, 1), labels.long().flatten(), ignore_index=IGNORE_INDEX)
        return AlbertSequenceClassifierOutput(loss=loss, logits=logits, hidden_states=out.hidden_states)


class AlbertForQuestionAnswering(AlbertPreTrainedModel):
    """`qa_outputs` (H → 2) on every position: start and end logits of the answer span, as transformers'. The loss
    is the mean of the start and end cross-entropies; positions outside the row (clamped to T) are ignored."""

    head_prefixes = ("qa_outputs.",)
    architecture = "AlbertForQuestionAnswering"

    def __init__(self, config: AlbertConfig):
        super().__init__(config)
        self.albert = AlbertModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, config.num_labels)  # 2, as transformers sizes it
        self.init_weights()

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        start_positions: Tensor | None = None,
        end_positions: Tensor | None = None,
        output_hidden_states: bool = False,
    ) -> AlbertQuestionAnsweringOutput:
        out = self.albert(input_ids, attention_mask, token_type_ids, output_hidden_states)
        start_logits, end_logits = self.qa_outputs(out.last_hidden_state).float().unbind(-1)[:2]
        loss = None
        if start_positions is not None and end_positions is not None:
            width = start_logits.shape[1]
            start = start_positions.long().clamp(0, width)
            end = end_positions.long().clamp(0, width)
            loss = (
                F.cross_entropy(start_logits, start, ignore_index=width)
                + F.cross_entropy(end_logits, end, ignore_index=width)
            ) / 2
        return AlbertQuestionAnsweringOutput(loss, start_logits, end_logits, out.hidden_states)


def head_task(config) -> str:
    """The task a model's config.json was trained for, from its architectures: token_classification,
    question_answering, or classification for a sequence head (and anything else)."""
    architectures = config.architectures or []
    tasks = {
        AlbertForTokenClassification.architecture: "token_classification",
        AlbertForQuestionAnswering.architecture: "question_answering",
    }
    return tasks.get(architectures[0], "classification") if len(architectures) == 1 else "classification"
