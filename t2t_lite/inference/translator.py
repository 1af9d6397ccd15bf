"""Inference: what every user of a trained model shares.

- `DecodeOptions`, the one set of decoding defaults, parsed from `--decode_hparams`;
- a run's model built (`build`) and a checkpoint restored into it (`restore`), two steps, so
  a program that decodes many checkpoints traces its search once (`load` does both);
- `Translator`: lines of text to output lines, with any decoder (t2t-lite's own search or a
  CTranslate2 export).

The decoder, translate-all, the exporter and evaluation during training all decode through
this module; BLEU is scored by `metrics.bleu`.
"""

from __future__ import annotations

import dataclasses

from absl import logging

from t2t_lite.core.errors import UsageError

# Source tokens per decode batch, padding included (rows x longest row), when neither
# batch_size nor batch_tokens is given: about 64 test_2016_flickr sentences, more short
# ones, fewer long ones.
DEFAULT_BATCH_TOKENS = 1024


@dataclasses.dataclass(frozen=True)
class DecodeOptions:
  """How to decode. `batch_size` counts sentences per batch, as tensor2tensor's
  decode_hparams do (0: no limit by sentences); `batch_tokens` counts source tokens per
  batch, padding included (0: no limit by tokens). With both 0, batches hold up to
  DEFAULT_BATCH_TOKENS source tokens. `return_beams` writes the beam_size best with their
  scores; `use_cache` keeps the decoder's attention keys and values between positions."""

  beam_size: int = 4
  alpha: float = 0.6
  batch_size: int = 0
  batch_tokens: int = 0
  extra_decode_length: int = 50
  use_cache: bool = True
  return_beams: bool = False
  # tensor2tensor's sampling (argmax: search by beam_size), and ours: the nucleus, the seed
  # and several draws per input (see decode.Sampling)
  sampling_method: str = "argmax"
  sampling_temp: float = 1.0
  sampling_keep_top_k: int = -1
  sampling_keep_top_p: float = 1.0
  sampling_seed: int = 1
  samples_per_input: int = 1

  def sampling(self):
    """The decode.Sampling of sampling_method=random, else None."""
    if self.sampling_method != "random":
      return None
    from t2t_lite.inference.decode import Sampling
    return Sampling(self.sampling_temp, max(self.sampling_keep_top_k, 0),
                    self.sampling_keep_top_p, self.sampling_seed, self.samples_per_input)

  @property
  def hypotheses(self) -> int:
    """The translations decoded per input: the beam's, or the draws."""
    return self.samples_per_input if self.sampling_method == "random" else self.beam_size

  def batching(self) -> tuple[int, int]:
    """(sentences, source tokens) per batch, 0 meaning no limit by that measure."""
    if not self.batch_size and not self.batch_tokens:
      return 0, DEFAULT_BATCH_TOKENS
    return self.batch_size, self.batch_tokens


def decode_options(spec: str, read: tuple[str, ...] | None = None, not_read: dict | None = None,
                   **defaults) -> tuple[DecodeOptions, set[str]]:
  """(options, the keys `spec` gave) from a `--decode_hparams` string such as
  "beam_size=8,alpha=1.0". `read` names the keys the calling program reads (all when None):
  any other key is a usage error naming the ones it reads; so is a key of `not_read` ({key:
  why the program does not read it}). `defaults` replace the defaults
  of DecodeOptions for keys `spec` does not give (an export's own search settings, say)."""
  from t2t_lite.core.hparams import HParams
  values = dataclasses.asdict(DecodeOptions())
  values.update(defaults)
  names = read if read is not None else tuple(values)
  hparams = HParams(**{name: values[name] for name in names})
  given = set(hparams.parse(spec))
  for name, why in (not_read or {}).items():  # keys the calling program refuses, and why
    if name in given:
      raise UsageError(f"--decode_hparams: {name} is not read here ({why}); drop it")
  values.update(hparams.values())
  options = DecodeOptions(**values)
  for name in ("beam_size", "batch_size", "batch_tokens", "extra_decode_length"):
    minimum = 1 if name == "beam_size" else 0
    if getattr(options, name) < minimum:
      raise UsageError(f"--decode_hparams: {name} must be at least {minimum}")
  check_sampling(options, given)
  return options, given


SAMPLING_KEYS = ("sampling_temp", "sampling_keep_top_k", "sampling_keep_top_p",
                 "sampling_seed", "samples_per_input")


def check_sampling(options: DecodeOptions, given: set[str]) -> None:
  """A usage error, in one line, for sampling settings that mean nothing or are out of
  range."""
  bad = lambda text: UsageError(f"--decode_hparams: {text}")  # noqa: E731
  if options.sampling_method not in ("argmax", "random"):
    raise bad(f"sampling_method={options.sampling_method}: choose argmax (search by "
              "beam_size) or random (draw each token from the model's distribution)")
  if options.sampling_method == "argmax":
    unread = sorted(given & set(SAMPLING_KEYS))
    if unread:
      raise bad(f"{unread[0]} is read only with sampling_method=random; set that too, or "
                f"drop {unread[0]}")
    return
  if "beam_size" in given and options.beam_size != 1:
    raise bad("sampling_method=random draws one token at a time (beam_size=1, as in "
              "tensor2tensor); for several translations per input set samples_per_input")
  checks = ((options.sampling_temp >= 0, "sampling_temp must be at least 0 (0: argmax)"),
            (options.sampling_keep_top_k == -1 or options.sampling_keep_top_k >= 1,
             "sampling_keep_top_k must be -1 (every token) or at least 1"),
            (0 < options.sampling_keep_top_p <= 1, "sampling_keep_top_p must be in (0, 1]"),
            (options.samples_per_input >= 1, "samples_per_input must be at least 1"),
            (options.samples_per_input == 1 or options.return_beams,
             "samples_per_input > 1 writes the draws as return_beams writes a beam: set "
             "return_beams=true"))
  for holds, text in checks:
    if not holds:
      raise bad(text)


@dataclasses.dataclass
class RunModel:
  """A run's model (weights as restored last), its vocabulary and settings."""

  model: object
  vocab: object
  hparams: object
  problem: object
  meta: dict | None
  data_dir: str
  weights: str = ""  # of the checkpoint restored last: "ema" or "raw" (see t2t_lite.runs.ema)
  weights_read: str = ""  # ... and what they are, for a program to print

  def restore(self, path: str, weights: str = "auto") -> None:
    """Restores checkpoint `path` into the model (see the module's `restore`), and records
    which weights it read."""
    self.weights, self.weights_read = _restore(self.model, path, weights)

  def decoder(self, options: DecodeOptions):
    from t2t_lite.inference import decode
    return decode.Decoder(self.model, self.hparams.max_length, options.extra_decode_length,
                          never=self.vocab.reserved_ids())

  def translator(self, options: DecodeOptions) -> "Translator":
    return Translator(self.decoder(options), self.vocab, self.hparams.max_length, options)


def build(output_dir: str | None, hparams_set: str | None = None, overrides: str = "",
          problem_name: str | None = None, data_dir: str | None = None,
          what: str | None = None) -> RunModel:
  """The model of a run directory (its recorded hparams, problem and data directory unless
  given), with its vocabulary checked against the run's record; no weights restored yet.
  `what` names the model in messages (default: output_dir)."""
  from t2t_lite.core import registry
  from t2t_lite.runs import rundir
  # The run's recorded values, under its set or another one; --hparams may change them.
  hparams, meta, _ = rundir.resolve(hparams_set, overrides, output_dir, allow_change=True)
  if not hparams_set and meta is None:
    raise UsageError(f"give --output_dir of a training run (with its {rundir.META_FILE}) or "
                     "--hparams_set")
  problem = registry.problem(problem_name or (meta or {}).get("problem") or "")
  data_dir = data_dir or (meta or {}).get("data_dir")
  if not data_dir:
    raise UsageError("--data_dir is required, e.g. --data_dir=data/multi30k_ende")
  snapshot = problem.snapshot(data_dir, vocab_only=True)
  rundir.check_data(meta, snapshot, what or output_dir)
  vocab = snapshot.vocab()
  model = registry.model(hparams.model)(hparams, vocab.size)
  return RunModel(model, vocab, hparams, problem, meta, data_dir)


def restore(model, path: str, weights: str = "auto") -> str:
  """Restores checkpoint `path` into `model`: its moving average of the weights or its raw
  weights, as `weights` (t2t_lite.runs.ema.CHOICES: auto takes the average where the checkpoint
  holds one) chooses; which one it read ("ema" or "raw"). A checkpoint written from chosen
  weights (an average's, a kept best one) holds those alone, as its folder's record says.
  A usage error for weights the checkpoint does not hold; TensorFlow's own error when it
  does not fit."""
  return _restore(model, path, weights)[0]


def _restore(model, path: str, weights: str) -> tuple[str, str]:
  """`restore`, and what the weights read are."""
  from t2t_lite.core.runtime import import_tensorflow
  tf = import_tensorflow()
  from t2t_lite.runs import ema
  recorded = _recorded_weights(path)
  if recorded is not None:
    chosen, what = recorded
    if weights not in ("auto", chosen):
      raise UsageError(f"--weights={weights}: checkpoint {path} holds {what} only; use "
                       f"--weights=auto, or choose the weights where it was made")
  else:
    chosen = ema.resolve(path, weights)
    what = ema.describe(chosen)
  tf.train.Checkpoint(model=model).read(path).expect_partial() \
      .assert_existing_objects_matched()
  if recorded is None and chosen == ema.EMA:
    ema.restore_averages(model, path)
  logging.info("restored %s: %s", path, what)
  return chosen, what


def describe_weights(path: str, chosen: str) -> str:
  """What `restore` read from `path` (for a program to print)."""
  from t2t_lite.runs import ema
  recorded = _recorded_weights(path)
  return recorded[1] if recorded is not None else ema.describe(chosen)


def _recorded_weights(path: str) -> tuple[str, str] | None:
  """(weights, what they are) of a checkpoint written from chosen weights: an average of
  checkpoints (averaged.json beside it) or a kept best one (best.json); None for a training
  checkpoint. Records from before the moving average hold raw weights."""
  import json
  import os
  folder = os.path.dirname(path)
  for name in ("averaged.json", "best.json"):
    record_path = os.path.join(folder, name)
    if not os.path.isfile(record_path):
      continue
    try:
      with open(record_path) as f:
        record = json.load(f)
      kind = record.get("weights", "raw") if isinstance(record, dict) else "raw"
      if name == "best.json":  # the weights that evaluation of this checkpoint read
        kind = next((entry.get("weights", kind) for entry in record.get("kept") or []
                     if isinstance(entry, dict) and entry.get("checkpoint")
                     == os.path.basename(path)), kind)
    except (OSError, ValueError, AttributeError):
      return None
    from t2t_lite.runs import ema
    if name == "averaged.json":
      count = len(record.get("checkpoints", [])) if isinstance(record, dict) else 0
      return kind, f"the mean of {count} checkpoints' {ema.describe(kind)[4:]}"
    return kind, f"{ema.describe(kind)} as its evaluation read them (a kept best checkpoint)"
  return None


def newest_checkpoint(output_dir: str | None, checkpoint_path: str | None = None) -> str:
  """`checkpoint_path`, else the newest checkpoint of `output_dir`; resolved once by each
  command, so what it records is what it read."""
  from t2t_lite.core.runtime import import_tensorflow
  import_tensorflow()
  from t2t_lite.runs.checkpoints import newest_first
  path = checkpoint_path or (next(iter(newest_first(output_dir)), None) if output_dir else None)
  if not path:
    raise UsageError(f"no checkpoint found in {output_dir}; pass --checkpoint_path")
  return path


def load(output_dir: str | None, checkpoint_path: str | None = None,
         hparams_set: str | None = None, overrides: str = "",
         problem_name: str | None = None, data_dir: str | None = None,
         weights: str = "auto") -> RunModel:
  """`build`, then `restore` the given checkpoint or the run's newest (the `weights` of it,
  see restore); a checkpoint that does not fit the model is a usage error naming it."""
  run = build(output_dir, hparams_set, overrides, problem_name, data_dir,
              what=output_dir or checkpoint_path)
  path = newest_checkpoint(output_dir, checkpoint_path)
  from t2t_lite.core.runtime import import_tensorflow
  tf = import_tensorflow()
  try:
    run.restore(path, weights)
  except (tf.errors.OpError, ValueError, AssertionError) as err:
    raise UsageError(f"cannot restore {path}: {str(err).splitlines()[0][:200]}") from None
  return run


class Translator:
  """Lines of text -> output lines (one best, or the n-best with scores), empty for empty.

  `decoder` is anything with `translate_nbest(sources, beam_size, alpha, batch_size,
  use_cache, batch_tokens)`: t2t-lite's `decode.Decoder` or a CTranslate2 export's."""

  def __init__(self, decoder, vocab, max_length: int, options: DecodeOptions):
    self.decoder, self.vocab, self.max_length, self.options = decoder, vocab, max_length, options

  def __call__(self, lines: list[str], first_line: int = 1) -> list[str]:
    options = self.options
    sources, positions = [], []
    for index, line in enumerate(lines):
      if line.strip():  # an empty line translates to an empty line
        ids = self.vocab.encode(line.strip())
        if len(ids) > self.max_length:
          logging.warning("line %d has %d tokens; only the first %d are translated",
                          first_line + index, len(ids), self.max_length)
        sources.append(ids)
        positions.append(index)
    nbests = self._nbest(sources)
    beams = options.hypotheses if options.return_beams else 1
    out = [self._format([([], 0.0)] * beams)] * len(lines)
    for index, nbest in zip(positions, nbests):
      out[index] = self._format(nbest[:beams])
    return out

  def best(self, sources: list[list[int]]) -> list[str]:
    """The best translation's text of each source given as ids (ending in EOS)."""
    return [self.vocab.decode(nbest[0][0]) for nbest in self._nbest(sources)]

  def _nbest(self, sources):
    batch_size, batch_tokens = self.options.batching()
    sampling = self.options.sampling()
    beam_size = 1 if sampling is not None else self.options.beam_size
    return self.decoder.translate_nbest(sources, beam_size, self.options.alpha,
                                        batch_size=batch_size, use_cache=self.options.use_cache,
                                        batch_tokens=batch_tokens, sampling=sampling)

  def _format(self, nbest) -> str:
    texts = [self.vocab.decode(ids).replace("\n", " ").replace("\t", " ") for ids, _ in nbest]
    if not self.options.return_beams:
      return texts[0]
    return "\t".join(f"{text}\t{score:.4f}" for text, (_, score) in zip(texts, nbest))

  def score(self, pairs: list[tuple[str, str]]) -> list[float]:
    """Forced decoding: log p(target | source) of each (source, target) pair of lines."""
    batch_size, batch_tokens = self.options.batching()
    return self.decoder.score([self.vocab.encode(source) for source, _ in pairs],
                              [self.vocab.encode(target) for _, target in pairs],
                              batch_size=batch_size, batch_tokens=batch_tokens)
