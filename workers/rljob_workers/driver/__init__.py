"""The driver process: the `rljob` command line and everything that runs in the process that drives a job
(your shell under `rljob run`, or the KubeRay driver pod). Its rooms, from the ground up: `pools` (the
clients of the pools), `controller` (the RL loop), `telemetry` (what a run reports), `placement` (Ray),
`run` (a run's lifecycle), `commands` (the shell commands besides the run) and `cli`.

It may import every pool server's package (its actors start them); no pool server imports it.
"""
