"""The cluster: tf.distribute strategies for one or several devices and workers, clusters
from TF_CONFIG or a Slurm job step, the values the chief shares with every worker, and one
worker's failure reported to all.

It may import `core` only; the training loop decides when the workers talk.
"""
