"""Models, registered by name. A model's module (and TensorFlow) loads when it is built, so
looking names up (and failing fast on bad flags) needs no TensorFlow."""

from t2t_lite.core.registry import register_model


@register_model(name="transformer")
def transformer(hparams, vocab_size: int, seed: int = 1):
  """The encoder-decoder Transformer of t2t_lite.models.transformer."""
  from t2t_lite.models.transformer import Transformer
  return Transformer(hparams, vocab_size, seed)
