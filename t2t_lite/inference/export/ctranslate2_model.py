"""CTranslate2 export: the Transformer's weights in ctranslate2's own TransformerSpec.

What maps onto the spec, and how:
- pre-norm blocks (preprocess "n", postprocess "da") with the final layer norm of each stack:
  `pre_norm=True`; post-norm blocks (preprocess "none", postprocess "dan", no final norms):
  `pre_norm=False`. Any other sequence is refused.
- embeddings: one table for source, target and softmax when shared (the target table and a
  bias-free softmax otherwise), scaled by sqrt(hidden) (`scale_embeddings`).
- positions: tensor2tensor's sinusoids ([sin, cos], from position 0) written out as an
  explicit table, so nothing depends on ctranslate2's own layout or position offset.
- attention without biases (the spec's biases stay unset), queries scaled by depth^-0.5 as
  ctranslate2 does; the self-attention projection is already fused as q, k, v.
- vocabulary: the sentencepiece pieces in id order; piece 0 (padding) is the decoder start
  token, piece 1 the end of sentence, piece 2 the unknown token; ctranslate2 appends the
  end-of-sentence piece to each source (`add_source_eos`), as our encoder inputs end in EOS.
"""

from __future__ import annotations

import numpy as np

from t2t_lite.core.errors import UsageError
from t2t_lite.inference.export import VOCAB_FILE
from t2t_lite.data.vocab import EOS_ID, PAD_ID, UNK_ID

QUANTIZATIONS = ("none", "int8", "int16", "float16")
# Rows of the explicit position table beyond max_length: the longest decode it allows is
# max_length + this many tokens.
EXTRA_POSITIONS = 1024


def check_expressible(hparams) -> bool:
  """pre_norm for the spec, or a usage error naming what the spec cannot express."""
  from t2t_lite.core.hparams_check import norm_placement
  if hparams.model != "transformer":
    raise UsageError(f"model={hparams.model} cannot be exported to CTranslate2; only "
                     "model=transformer can")
  # Both placements we build map onto the spec: pre-norm with final stack norms, and the
  # paper's post-norm without (anything else is refused by norm_placement).
  return norm_placement(hparams) == "pre_norm"


def _numpy(variable) -> np.ndarray:
  return np.ascontiguousarray(variable.numpy().astype(np.float32))


def _linear(spec, dense) -> None:
  # Our kernels are [in, out]; ctranslate2 stores [out, in].
  spec.weight = np.ascontiguousarray(_numpy(dense.kernel).T)
  if dense.bias is not None:
    spec.bias = _numpy(dense.bias)


def _norm(spec, norm) -> None:
  spec.gamma = _numpy(norm.scale)
  spec.beta = _numpy(norm.bias)


def _attention(spec, attention, norm) -> None:
  if attention.self_attention:
    _linear(spec.linear[0], attention.qkv)
  else:
    _linear(spec.linear[0], attention.q)
    _linear(spec.linear[1], attention.kv)
  _linear(spec.linear[-1], attention.output)
  _norm(spec.layer_norm, norm)


def _ffn(spec, block) -> None:
  _linear(spec.linear_0, block.ffn.inner)
  _linear(spec.linear_1, block.ffn.outer)
  _norm(spec.layer_norm, block.ffn_norm)


def position_table(rows: int, hidden: int) -> np.ndarray:
  """The model's own timing signal for positions 0 .. rows-1."""
  from t2t_lite.models.layers import timing_signal
  import tensorflow as tf
  return np.ascontiguousarray(timing_signal(tf.range(rows), hidden).numpy().astype(np.float32))


def vocabulary_pieces(vocab_file: str) -> list[str]:
  import sentencepiece as spm
  processor = spm.SentencePieceProcessor(model_file=vocab_file)
  return [processor.id_to_piece(i) for i in range(processor.get_piece_size())]


def build_spec(model, hparams, vocab_file: str):
  """A validated-to-be ctranslate2 TransformerSpec holding the model's weights."""
  from ctranslate2.specs import transformer_spec
  pre_norm = check_expressible(hparams)
  encoder = transformer_spec.TransformerEncoderSpec(
      len(model.encoder), hparams.num_heads, pre_norm=pre_norm)
  decoder = transformer_spec.TransformerDecoderSpec(
      len(model.decoder), hparams.num_heads, pre_norm=pre_norm)
  spec = transformer_spec.TransformerSpec(encoder, decoder)

  embedding = _numpy(model.embedding)
  target_embedding = _numpy(model._target_table())  # noqa: SLF001 (the tied table, as is)
  positions = position_table(hparams.max_length + EXTRA_POSITIONS, hparams.hidden_size)
  encoder.embeddings[0].weight = embedding
  encoder.position_encodings.encodings = positions
  for layer_spec, block in zip(encoder.layer, model.encoder):
    _attention(layer_spec.self_attention, block.self_attention, block.self_norm)
    _ffn(layer_spec.ffn, block)
  decoder.embeddings.weight = target_embedding
  decoder.position_encodings.encodings = positions
  for layer_spec, block in zip(decoder.layer, model.decoder):
    _attention(layer_spec.self_attention, block.self_attention, block.self_norm)
    _attention(layer_spec.attention, block.cross_attention, block.cross_norm)
    _ffn(layer_spec.ffn, block)
  if pre_norm:
    _norm(encoder.layer_norm, model.encoder_norm)
    _norm(decoder.layer_norm, model.decoder_norm)
  if model.shared:
    decoder.projection.weight = embedding
  else:
    _linear(decoder.projection, model.softmax)

  pieces = vocabulary_pieces(vocab_file)
  if len(pieces) != embedding.shape[0]:
    raise UsageError(f"the vocabulary {vocab_file} has {len(pieces)} pieces but the model "
                     f"{embedding.shape[0]}; pass the run's own --data_dir")
  spec.register_source_vocabulary(pieces)
  spec.register_target_vocabulary(pieces)
  spec.config.unk_token = pieces[UNK_ID]
  spec.config.eos_token = pieces[EOS_ID]
  # No beginning-of-sentence piece exists: padding starts the decoder, as in training.
  spec.config.bos_token = pieces[PAD_ID]
  spec.config.decoder_start_token = pieces[PAD_ID]
  spec.config.add_source_bos = False
  spec.config.add_source_eos = True
  spec.config.layer_norm_epsilon = float(hparams.norm_epsilon)
  spec.register_file(vocab_file, VOCAB_FILE)
  return spec


def export(model, hparams, vocab_file: str, directory: str, quantization: str) -> dict:
  """Writes the ctranslate2 model into `directory` (replaced); returns facts for the info file."""
  from ctranslate2.converters.converter import Converter

  class _SpecConverter(Converter):
    def _load(self):
      return build_spec(model, hparams, vocab_file)

  _SpecConverter().convert(directory, quantization=None if quantization == "none" else
                           quantization, force=True)
  return {"quantization": quantization,
          "max_positions": hparams.max_length + EXTRA_POSITIONS}
