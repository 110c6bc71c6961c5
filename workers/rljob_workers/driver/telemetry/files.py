"""The files a run writes into its output folder, by name."""

METRICS_JSONL = "metrics.jsonl"  # one line per train step
REWARD_CURVE = "reward-curve.png"
EVAL_JSONL = "eval.jsonl"  # one line per held-out eval round (spec.data.eval)
