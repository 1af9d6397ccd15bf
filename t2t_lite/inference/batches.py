"""Decoding batches, shared by our search and the CTranslate2 engine (no TensorFlow here)."""

from __future__ import annotations


def decode_batches(sources, max_length: int = 0, batch_size: int = 32,
                   batch_tokens: int = 0) -> list[list[int]]:
  """Index lists of `sources` in length order, each a batch of at most batch_size sentences
  and batch_tokens source tokens counting padding (rows x longest row); 0: no limit. Lengths
  are capped at max_length (0: no cap), as long sources are truncated before decoding. A
  sentence longer than batch_tokens is a batch of its own."""
  order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
  batches, current = [], []
  for i in order:
    length = min(len(sources[i]), max_length) if max_length else len(sources[i])
    full = batch_size and len(current) >= batch_size
    if current and (full or (batch_tokens and (len(current) + 1) * length > batch_tokens)):
      batches.append(current)
      current = []
    current.append(i)
  return batches + ([current] if current else [])
