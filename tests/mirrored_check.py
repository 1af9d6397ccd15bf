"""Run as a script (it must split the CPU before TensorFlow starts): 2 replicas x b x n
against 1 replica x 2b x n, with ragged batches. Prints the relative difference and the
devices of the update's Adam kernels as JSON."""

import json
import sys

import tensorflow as tf

sys.path.insert(0, sys.argv[1])  # the tests directory
from t2t_lite.distribute import split_cpu  # noqa: E402

split_cpu(2)
from conftest import tiny_hparams  # noqa: E402
from t2t_lite.learner import Learner, apply_ops_by_device  # noqa: E402
from t2t_lite.equivalence import concat, ragged_batches, relative_difference  # noqa: E402
from test_multistep import VOCAB  # noqa: E402

hparams = tiny_hparams(layer_prepostprocess_dropout=0.0, attention_dropout=0.0,
                       relu_dropout=0.0, learning_rate_schedule="constant",
                       learning_rate_constant=1e-4)
accumulate_steps, updates = 2, 3
micro = ragged_batches(2 * accumulate_steps * updates, seed=8)
devices = [d.name for d in tf.config.list_logical_devices("CPU")]
strategy = tf.distribute.MirroredStrategy(devices)
two = Learner(hparams, VOCAB, accumulate_steps, seed=4, strategy=strategy)
one = Learner(hparams, VOCAB, accumulate_steps, seed=4)
for step in range(accumulate_steps * updates):
  pair = micro[2 * step:2 * step + 2]
  two.step(strategy.experimental_distribute_values_from_function(
      lambda context: pair[context.replica_id_in_sync_group]))
  one.step(concat(pair))
print(json.dumps({"replicas": two.replicas, "updates": int(two.update_step.numpy()),
                  "relative_difference": relative_difference(two, one),
                  "variables": len(two.variables),
                  "apply_ops": apply_ops_by_device(two.update_fn.get_concrete_function())}))
