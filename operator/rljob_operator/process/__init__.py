"""The operator process: kopf's handlers and the poller, the command-line flags, and the entry point that
runs them (or, with `render`, prints an RLJob's children without a cluster)."""
