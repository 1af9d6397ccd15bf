"""t2t-lite: a Transformer NMT trainer on TensorFlow 2 with exact multistep Adam."""

__version__ = "0.1.0"
