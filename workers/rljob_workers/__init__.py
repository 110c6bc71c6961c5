"""rljob workers: rollout, reward, trainer, controller, checkpoint engine, local launcher, CLI."""
