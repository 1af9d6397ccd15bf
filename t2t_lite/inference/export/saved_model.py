"""SavedModel export: raw sentences in, translations out, for TensorFlow Serving or Python.

Signatures:
- `serving_default`: `inputs` tf.string [batch] -> `translations` tf.string [batch] (or
  [batch, beam] with return_beams) and `scores` float32 (length-normalised log-probabilities,
  0 for an empty input). Sentences are stripped, tokenized by tensorflow-text's
  SentencepieceTokenizer, truncated to the model's max_length as t2t-lite-decoder does, and
  decoded with the search and settings fixed at export.
- `translate_ids`: `ids` int32 [batch, length] (0-padded, each ending in EOS = 1) -> `ids`
  int32 [batch, length'] (or [batch, beam, length']; EOS-terminated, 0-padded) and `scores`.

The sentencepiece model is held by the tokenizer op inside the graph and copied to
`assets/sentencepiece.model`, so the directory works once the run is deleted. Loading it
needs `import tensorflow_text` (it registers the SentencePiece ops, which TensorFlow checks
for every function of the graph, whichever signature is called) and nothing from t2t_lite.

For servers without tensorflow-text, `ids_only/` inside the export is a second SavedModel
with the same weights and search and no SentencePiece ops: `translate_ids`, also as
`serving_default`. Plain TensorFlow (or `saved_model_cli run`) loads it.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import tensorflow as tf
from absl import logging

from t2t_lite.core.errors import UsageError
from t2t_lite.inference.export import VOCAB_FILE
from t2t_lite.data.vocab import EOS_ID


def check_expressible(hparams) -> None:
  if hparams.model != "transformer":
    raise UsageError(f"model={hparams.model} cannot be exported as a SavedModel; only "
                     "model=transformer can")


def truncate(ids, max_length: int):
  """0-padded ids [B, S] -> [B, min(S', max_length)]: rows longer than max_length keep their
  first max_length - 1 ids and EOS (as the decoder does); S' = the longest row (at least 1)."""
  ids = tf.pad(ids, [[0, 0], [0, 1]])  # at least one column, even for an empty batch
  lengths = tf.reduce_sum(tf.cast(tf.not_equal(ids, 0), tf.int32), axis=1)
  width = tf.clip_by_value(tf.reduce_max(tf.concat([lengths, [1]], 0)), 1, max_length)
  ids = ids[:, :width]
  last = tf.where(lengths > max_length, EOS_ID, ids[:, -1])
  return tf.concat([ids[:, :-1], last[:, None]], axis=1)


def _text_mask(ids):
  """True at the ids of a hypothesis [..., T] before its first EOS, padding excluded."""
  before_eos = tf.equal(tf.cumsum(tf.cast(tf.equal(ids, EOS_ID), tf.int32), axis=-1), 0)
  return before_eos & tf.not_equal(ids, 0)


IDS_ONLY_DIR = "ids_only"


class IdsServing(tf.Module):
  """The model and its search: ids in, ids out (no tokenizer, so no tensorflow-text ops)."""

  def __init__(self, model, max_length: int, options, never=()):
    super().__init__(name="t2t_lite_serving")
    from t2t_lite.inference import decode
    self.model = model
    self._search = decode.Decoder(model, max_length, options.extra_decode_length,
                                  never).search_fn(options.beam_size, options.alpha)
    self._max_length = max_length
    self._extra_length = options.extra_decode_length
    self._return_beams = options.return_beams

  @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32)])
  def _decode(self, ids):
    """(ids [B, K, T], scores [B, K]); one traced search that both signatures call."""
    ids = truncate(ids, self._max_length)
    return self._search(ids, tf.shape(ids)[1] + self._extra_length)

  @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32, name="ids")])
  def translate_ids(self, ids):
    out, scores = self._decode(ids)
    if not self._return_beams:
      out, scores = out[:, 0], scores[:, 0]
    return {"ids": out, "scores": scores}


class Serving(IdsServing):
  """IdsServing plus the tokenizer, for the strings-in, strings-out signature."""

  def __init__(self, model, vocab_file: str, max_length: int, options):
    from t2t_lite.data.vocab import SubwordVocab
    super().__init__(model, max_length, options, SubwordVocab(vocab_file).reserved_ids())
    import tensorflow_text as tf_text
    self.vocabulary = tf.saved_model.Asset(vocab_file)
    with open(vocab_file, "rb") as f:
      self.tokenizer = tf_text.SentencepieceTokenizer(model=f.read(), add_eos=True)

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")])
  def translate(self, inputs):
    text = tf.strings.strip(inputs)
    ids = self.tokenizer.tokenize(text).to_tensor()
    out, scores = self._decode(ids)
    batch, beam = tf.shape(out)[0], tf.shape(out)[1]
    flat = tf.reshape(out, [batch * beam, -1])
    pieces = tf.ragged.boolean_mask(flat, _text_mask(flat))
    translations = tf.reshape(self.tokenizer.detokenize(pieces), [batch, beam])
    empty = tf.equal(text, "")[:, None]  # an empty line translates to an empty line
    translations = tf.where(empty, "", translations)
    scores = tf.where(empty, 0.0, scores)
    if not self._return_beams:
      translations, scores = translations[:, 0], scores[:, 0]
    return {"translations": translations, "scores": scores}


def export(model, hparams, vocab_file: str, directory: str, options) -> None:
  """Writes the SavedModel into `directory` (which exists and is empty)."""
  with tempfile.TemporaryDirectory() as staging:
    # Staged under the name a CTranslate2 export uses too (the saver keeps file names).
    asset = os.path.join(staging, VOCAB_FILE)
    shutil.copyfile(vocab_file, asset)
    serving = Serving(model, asset, hparams.max_length, options)
    ids = serving.translate_ids.get_concrete_function()
    _save(serving, directory, {"serving_default": serving.translate.get_concrete_function(),
                               "translate_ids": ids})
  _save(IdsOnly(model, serving.translate_ids), os.path.join(directory, IDS_ONLY_DIR),
        {"serving_default": ids, "translate_ids": ids})


class IdsOnly(tf.Module):
  """The ids-only SavedModel: the search traced for the full one (`translate_ids`), saved
  without the tokenizer, which it does not capture; the model is all it needs."""

  def __init__(self, model, translate_ids):
    super().__init__(name="t2t_lite_serving")
    self.model, self.translate_ids = model, translate_ids


def _save(serving, directory: str, signatures: dict) -> None:
  # The saver logs every renamed function input at INFO; keep the exporter's output readable.
  verbosity = logging.get_verbosity()
  logging.set_verbosity(logging.WARNING)
  try:
    tf.saved_model.save(serving, directory, signatures=signatures)
  finally:
    logging.set_verbosity(verbosity)
