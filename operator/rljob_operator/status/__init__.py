"""Pure status: the children as read back and the controller's report -> the RLJob's status (phase,
conditions, pools, progress, restarts), and the operator's own decisions about the pools (`desired`).
No I/O: `now` is an argument."""
