"""The RLJob operator: kopf handlers over pure rendering and status. Never imports torch or Ray.

Its rooms, from the ground up; each imports only the ones below it (tests/test_layout.py):
`names`, `options`, `config` (pure values every room shares), `render/` (pure: an RLJob -> its children),
`status/` (pure: the children and the controller's report -> the job's status and the operator's decisions),
`kube/` (I/O: the Kubernetes API, kopf's caches of the children, the controller's ControlService),
`reconcile/` (the operator's actions over them: write the children, refresh status, post Events) and
`process/` (the process: kopf's handlers, the poller, the flags, the entry point).
"""
