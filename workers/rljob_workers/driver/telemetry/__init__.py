"""What a run reports: Prometheus metrics, metrics.jsonl and the sample and eval logs, the experiment
trackers, the live table, the pools' idle fractions, and the ledger read back from a run's files."""
