"""Run as a script (it must split the CPU before TensorFlow starts): 2 replicas x b x n
against 1 replica x 2b x n, with ragged batches. Prints the relative difference and the
devices of the update's Adam kernels as JSON (see equivalence.mirrored_against_single)."""

import json
import sys

sys.path.insert(0, sys.argv[1])  # the tests directory
from t2t_lite.distribute import split_cpu  # noqa: E402

split_cpu(2)
from conftest import tiny_hparams  # noqa: E402
from t2t_lite.equivalence import mirrored_against_single  # noqa: E402
from test_multistep import VOCAB  # noqa: E402

hparams = tiny_hparams(layer_prepostprocess_dropout=0.0, attention_dropout=0.0,
                       relu_dropout=0.0, learning_rate_schedule="constant",
                       learning_rate_constant=1e-4)
print(json.dumps(mirrored_against_single(hparams, vocab=VOCAB)))
