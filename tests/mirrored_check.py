"""Run as a script (it must split the CPU before TensorFlow starts): the weights and their
moving average on 2 replicas x n=2, 1 x n=4 and 1 x n=1 with 4 times the batch, on ragged
batches. Prints the relative differences and the devices of the mirrored update's Adam
kernels as JSON (see equivalence.average_on_three_layouts)."""

import json
import sys

sys.path.insert(0, sys.argv[1])  # the tests directory
from t2t_lite.cluster.distribute import split_cpu  # noqa: E402

split_cpu(2)
from conftest import tiny_hparams  # noqa: E402
from t2t_lite.training.equivalence import average_on_three_layouts  # noqa: E402
from test_multistep import VOCAB  # noqa: E402

hparams = tiny_hparams(layer_prepostprocess_dropout=0.0, attention_dropout=0.0,
                       relu_dropout=0.0, learning_rate_schedule="constant",
                       learning_rate_constant=1e-4)
hparams.ema_decay, hparams.ema_reference_tokens = 0.9, 1000
print(json.dumps(average_on_three_layouts(hparams, vocab=VOCAB)))
