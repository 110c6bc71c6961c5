"""A run's lifecycle in the driver process: its plan, the set-up checks, the run folder, the session that
starts and stops the pools, supervision, stopping on a signal, and the summary it ends with."""
