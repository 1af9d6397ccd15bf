"""Training: the loop and what it runs. The step arithmetic, Adam and the learning-rate
schedules, the learner (compiled micro-steps and exact multistep updates), the run's plan
(its last update, the time budget, the segmentation switch), what follows each update,
checkpoints and resuming, recovering from a divergence, progress lines and summaries,
evaluation and the best checkpoints, and the `Trainer` that wires them.

It may import every package below it (core, configs, data, models, cluster, runs,
inference, adapting); only `cli` imports it.
"""
