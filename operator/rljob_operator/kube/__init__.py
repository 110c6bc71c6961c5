"""I/O with the cluster: the Kubernetes API (server-side apply, reads, deletes, status, Events), kopf's
in-memory caches of the children, ownership checks before a write, the claims' reads, the controller's
ControlService client, and the API rights all of it needs."""
