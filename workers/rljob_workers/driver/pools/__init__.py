"""The driver's clients of the pools: the rollout replicas as the controller picks them, the reward router and
its replica streams, how busy each pool is, and the elastic scaling of a pool (the pure policy and its local
applier)."""
