"""Runs t2t-lite-trainer in this process with the given arguments, counting the files it
opens by name (builtins.open, which json, numpy and our code use); prints the counts of the
data manifest and the run record as one JSON line at exit (tests/test_train.py)."""

import atexit
import builtins
import json
import os
import sys

opened = {}
real_open = builtins.open


def counting_open(file, *args, **kwargs):
  name = os.path.basename(os.fspath(file)) if isinstance(file, (str, os.PathLike)) else ""
  opened[name] = opened.get(name, 0) + 1
  return real_open(file, *args, **kwargs)


builtins.open = counting_open
atexit.register(lambda: print(json.dumps(
    {"manifest": sum(n for name, n in opened.items() if name.endswith(".manifest.json")),
     "record": opened.get("hparams.json", 0)}), flush=True))
sys.argv = ["t2t-lite-trainer", *sys.argv[1:]]
from t2t_lite.cli import trainer  # noqa: E402  (after open is wrapped

trainer.run()
