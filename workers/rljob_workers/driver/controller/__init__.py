"""The RL controller: keeps rollout busy, streams samples to reward, feeds the trainer fresh-enough batches."""
