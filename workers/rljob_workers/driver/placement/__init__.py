"""Where the pools run: the local Ray node, the launcher that starts each pool's actors on Ray (locally or on
a KubeRay cluster), and the Python runtime a pool's replicas run with."""
