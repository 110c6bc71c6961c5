"""Pure builders: an RLJob (with its worker configs, the operator's options and decisions) -> the Kubernetes
objects that run it, as plain dicts. No I/O, no clock, no environment: everything is an argument."""
