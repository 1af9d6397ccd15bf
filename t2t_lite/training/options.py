"""A training run's options, in groups: how it checkpoints, evaluates and stops, and the
whole `RunOptions` the trainer program builds from its flags. Plain dataclasses, no
TensorFlow: `decide`, the checkpoints, the evaluation and the trainer read them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Checkpointing:
  save_steps: int = 1000          # every this many updates; 0 = at stops (and evaluations)
  save_secs: float = 0.0          # also once this long after the last save; 0 = not
  keep_max: int = 20              # checkpoints kept; 0 = all
  keep_every_n_hours: float = 0.0  # of those rotated away, keep one per this many hours


@dataclass(frozen=True)
class Evaluation:
  frequency: int = 1000           # every this many updates; 0 = no evaluation
  steps: int = 100                # dev batches for the dev loss; 0 = the whole dev set
  bleu_sentences: int = 500       # dev sentences decoded for the decoded metrics; 0 = none
  beam_size: int = 1
  # the figures measured (see t2t_lite.training.evaluation.METRICS)
  metrics: tuple = ("dev_loss", "dev_perplexity", "dev_bleu", "dev_chrf", "dev_ter")
  keep_best: int = 1              # the best evaluated checkpoints kept in output_dir/best
  weights: str = "auto"           # evaluate the moving average (auto, ema) or not (raw)


@dataclass(frozen=True)
class Stopping:
  train_minutes: float = 0.0      # wall-clock budget; 0 = none
  early_stopping_steps: int = 0   # updates without improvement; 0 = no early stopping
  early_stopping_metric: str = ""  # also ranks the best checkpoints; "": dev_loss with
                                  # early stopping, else dev_bleu if measured
  early_stopping_delta: float = 0.1


@dataclass
class RunOptions:
  output_dir: str
  data_dir: str
  seed: int = 1
  checkpointing: Checkpointing = Checkpointing()
  evaluation: Evaluation = Evaluation()
  stopping: Stopping = Stopping()
  log_every: int = 100                  # updates; 0 = only the last update
  warm_start_from: str = ""             # a run or checkpoint whose weights a new run starts from
  warm_start_optimizer: bool = False    # ... and its Adam slots
  warm_start_vocab: str = ""            # the source's vocabulary, where it is another one
  warm_start_vocab_rows: str = "pieces"  # ... and how its rows are mapped (vocab_map)
  allow_hparams_change: bool = False    # resume on a layout with other tokens per update
  allow_stream_change: bool = False     # resume a checkpoint of an older data position on
                                        # the planned stream
  xla_compile: bool = False             # XLA for the forward and backward pass; batches
                                        # padded to their bucket's boundary (a shape each)
