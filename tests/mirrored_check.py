"""Run as a script (it must split the CPU before TensorFlow starts): 2 replicas x b x n
against 1 replica x 2b x n, with ragged batches; and the moving average of the weights on
2 replicas x n=2, 1 x n=4 and 1 x n=1 with 4 times the batch. Prints the relative
differences and the devices of the update's Adam kernels as JSON (see
equivalence.mirrored_against_single and average_on_three_layouts)."""

import json
import sys

sys.path.insert(0, sys.argv[1])  # the tests directory
from t2t_lite.distribute import split_cpu  # noqa: E402

split_cpu(2)
from conftest import tiny_hparams  # noqa: E402
from t2t_lite.equivalence import average_on_three_layouts, mirrored_against_single  # noqa: E402
from test_multistep import VOCAB  # noqa: E402

hparams = tiny_hparams(layer_prepostprocess_dropout=0.0, attention_dropout=0.0,
                       relu_dropout=0.0, learning_rate_schedule="constant",
                       learning_rate_constant=1e-4)
figures = mirrored_against_single(hparams, vocab=VOCAB)
hparams.ema_decay, hparams.ema_reference_tokens = 0.9, 1000
figures["average"] = average_on_three_layouts(hparams, updates=2, vocab=VOCAB)
print(json.dumps(figures))
