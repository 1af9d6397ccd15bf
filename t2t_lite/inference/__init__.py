"""Inference: a trained model in use. Greedy and beam search with a key/value cache,
decoding batches, building a run's model and restoring a checkpoint into it, the
`Translator` (lines of text in, translations out), BLEU, chrF and TER, and the exports for
serving (`export/`: SavedModel and CTranslate2).

It may import `core`, `configs`, `data`, `models` and `runs`; training's evaluation and the
programs use it.
"""
