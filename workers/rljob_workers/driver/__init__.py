"""The driver: the one process that runs a job. The `rljob` CLI and `rljob run`, the Ray launcher
and its actors, the controller (batches, staleness, dispatch), the clients of the pools (rollout
clients, reward router, weight sync), elastic scaling, metrics and the display.

It may import the pool servers' entry points to start them in Ray actors; no pool server imports it.
"""
