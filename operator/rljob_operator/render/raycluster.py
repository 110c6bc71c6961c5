"""The KubeRay RayCluster of an RLJob: a CPU head and one worker group per pool it runs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from rljob_api import RLJob
from rljob_api.placement import Placement, Resources, default_shm_size
from rljob_api.workercfg import (
    ELASTIC_POOLS,
    TOKEN_FILE_ENV,
    Pool,
    cluster_pools,
    pool_resource,
    ray_system_config_env,
)
from rljob_operator.names import JOB_TOKEN_FILE, component_labels, pool_labels, ray_cluster_name, token_secret_name
from rljob_operator.options import ElasticGroups, RenderOptions
from rljob_operator.render.environment_pod import environment_container
from rljob_operator.render.group_sizing import clamp_replicas, elastic_bounds
from rljob_operator.render.pods import (
    TMP_VOLUME,
    WRITABLE_ENV,
    code_env,
    code_mounts,
    code_volumes,
    container,
    pod_template,
    pool_resources,
    ray_cpus,
    shm_mount,
    shm_volume,
    volume_mounts,
    volumes,
)

RAY_API_VERSION = "ray.io/v1"
# Ray pods hold nothing to save (the driver writes the checkpoints), and KubeRay's `bash -lc` as the
# container's PID 1 ignores SIGTERM: a deleted pod would sit out the default 30 s with its Ray node
# still up. A short grace lets the pool replace it sooner.
RAY_POD_GRACE_SECONDS = 5
# The pools whose processes import the user's code: reward functions, environment classes.
CODE_POOLS = ("reward", "environment")


@dataclass(frozen=True)
class PoolShape:
    """One pool as KubeRay sees it: pods, Ray actors per pod, and each pod's GPUs and CPUs."""

    pool: Pool
    placement: Placement
    replicas: int
    min_replicas: int
    max_replicas: int
    actors_per_pod: int
    gpus: int
    cpus_per_actor: float


def _elastic_shape(job: RLJob, pool: Pool, placement: Placement, gpus: int, groups: ElasticGroups) -> PoolShape:
    bounds = elastic_bounds(job, pool)
    replicas = clamp_replicas(job, pool, groups.of(pool).replicas)
    return PoolShape(pool, placement, replicas, bounds.min, bounds.max, 1, gpus, placement.cpus)


def pool_shapes(job: RLJob, groups: ElasticGroups) -> list[PoolShape]:
    """The job's worker groups (workercfg.cluster_pools), the elastic ones at their decided sizes."""
    spec = job.spec
    trainer_ranks = max(spec.trainer.gpus_per_node, 1)  # one rank per GPU, or one per node on CPU
    rollout, trainer = spec.rollout, spec.trainer
    shapes = [
        PoolShape(
            "rollout",
            rollout,
            rollout.replicas,
            rollout.replicas,
            rollout.replicas,
            1,
            rollout.gpus_per_replica,
            rollout.cpus,
        ),
        PoolShape(
            "trainer",
            trainer,
            trainer.nodes,
            trainer.nodes,
            trainer.nodes,
            trainer_ranks,
            trainer.gpus_per_node,
            trainer.cpus,
        ),
    ]
    pools = cluster_pools(spec)
    if "reward" in pools:
        shapes.append(_elastic_shape(job, "reward", spec.reward, spec.reward.gpus_per_replica, groups))
    if "environment" in pools and spec.environment is not None:
        environment = spec.environment
        shapes.append(_elastic_shape(job, "environment", environment, environment.gpus_per_replica, groups))
    return shapes


def _env(job: RLJob, pool: str) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": "RLJOB_JOB", "value": job.metadata.name},
        {"name": "RLJOB_POOL", "value": pool},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        *WRITABLE_ENV,
        *({"name": name, "value": value} for name, value in ray_system_config_env().items()),
    ]
    if pool != "head":  # the pools' servers check the job's token; the head serves none of ours
        env.append({"name": TOKEN_FILE_ENV, "value": JOB_TOKEN_FILE})
    return env


def ray_pod_account(job: RLJob) -> dict[str, Any]:
    """Ray pods never call the Kubernetes API: no token. They run as the spec's account when it names one
    (e.g. for cloud storage identity), else the namespace's default, so they need nothing the operator
    creates and the RayCluster can be created first."""
    account: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": RAY_POD_GRACE_SECONDS,
    }
    if job.spec.service_account_name:
        account["serviceAccountName"] = job.spec.service_account_name
    return account


def shm_size(job: RLJob, shape: PoolShape) -> str:
    """The pool's /dev/shm size: the spec's, else sized for its GPUs and (rollout) its engine."""
    engine = job.spec.rollout.engine if shape.pool == "rollout" else None
    return shape.placement.shm_size or default_shm_size(shape.gpus, engine)


def worker_group(job: RLJob, shape: PoolShape, groups: ElasticGroups) -> dict[str, Any]:
    """One worker group: the pool's placement, GPUs, CPUs, /dev/shm, and the Ray resource its actors require."""
    cpus = shape.cpus_per_actor * shape.actors_per_pod
    resources = pool_resources(shape.placement, cpus=cpus, gpus=shape.gpus)
    tokens = shape.pool == "reward"
    imports_code = shape.pool in CODE_POOLS  # they import the user's functions and classes (spec.code)
    mounts = [*volume_mounts(job, tokens=tokens), *(code_mounts(job) if imports_code else []), shm_mount()]
    security = shape.placement.security_context or job.spec.security_context
    # The rollout pool runs its engine's own image (vLLM pins its own torch), the other pools the worker image.
    image = job.spec.rollout.image_or(job.spec.image) if shape.pool == "rollout" else job.spec.image
    env = [*_env(job, shape.pool), *(code_env(job) if imports_code else [])]
    own = environment_container(job) if shape.pool == "environment" else None
    if own is not None:  # the environment's own container takes spec.environment.resources; the actor its CPUs
        resources = pool_resources(shape.placement.model_copy(update={"resources": Resources()}), cpus=cpus, gpus=0)
    main = container(job, "ray-worker", security, image, env=env, resources=resources, volumeMounts=mounts)
    template = pod_template(
        pool_labels(job, shape.pool),
        main,
        account=ray_pod_account(job),
        security=security,
        volumes=[
            *volumes(job, tokens=tokens),
            *(code_volumes(job) if imports_code else []),
            shm_volume(shm_size(job, shape)),
        ],
        node_selector=shape.placement.node_selector,
        tolerations=[t.to_wire() for t in shape.placement.tolerations],
        pull_secrets=job.spec.image_pull_secrets,
    )
    if own is not None:
        template["spec"]["containers"].append(own)  # after the Ray container: KubeRay's is the first
    group: dict[str, Any] = {
        "groupName": shape.pool,
        "replicas": shape.replicas,
        "minReplicas": shape.min_replicas,
        "maxReplicas": shape.max_replicas,
        "rayStartParams": {
            "num-cpus": str(ray_cpus(resources, cpus)),
            "num-gpus": str(shape.gpus),
            # JSON in single quotes: KubeRay puts the value in `ray start --resources=...` under `bash -lc`,
            # and parses it itself after trimming the quotes (the form it writes, too).
            "resources": f"'{json.dumps({pool_resource(shape.pool): shape.actors_per_pod})}'",
        },
        "template": template,
    }
    if shape.pool in ELASTIC_POOLS:
        # Scale-down removes exactly the replicas the controller drained (see render/group_sizing.py).
        group["scaleStrategy"] = {"workersToDelete": list(groups.of(shape.pool).workers_to_delete)}
    return group


def head_group(job: RLJob, options: RenderOptions) -> dict[str, Any]:
    """The head: GCS and dashboard only (num-cpus 0), so no pool actor lands on it."""
    main = container(
        job,
        "ray-head",
        job.spec.security_context,
        env=_env(job, "head"),
        resources={
            "requests": {"cpu": options.head_cpu, "memory": options.head_memory},
            "limits": {"memory": options.head_memory},
        },
        ports=[
            {"name": "gcs", "containerPort": 6379},
            {"name": "dashboard", "containerPort": 8265},
            {"name": "client", "containerPort": 10001},
        ],
        volumeMounts=[{"name": TMP_VOLUME, "mountPath": "/tmp"}],
    )
    return {
        "serviceType": "ClusterIP",
        "rayStartParams": {"dashboard-host": "0.0.0.0", "num-cpus": "0", "num-gpus": "0"},
        "template": pod_template(
            component_labels(job, "head"),
            main,
            account=ray_pod_account(job),
            security=job.spec.security_context,
            volumes=[{"name": TMP_VOLUME, "emptyDir": {}}],
            node_selector=options.system_node_selector,
            tolerations=options.system_tolerations,
            pull_secrets=job.spec.image_pull_secrets,
        ),
    }


def render_ray_cluster(job: RLJob, options: RenderOptions, groups: ElasticGroups) -> dict[str, Any]:
    """The RayCluster (metadata without owner; `render` adds it)."""
    return {
        "apiVersion": RAY_API_VERSION,
        "kind": "RayCluster",
        "metadata": {
            "name": ray_cluster_name(job),
            "namespace": job.metadata.namespace,
            "labels": component_labels(job, "pools"),
        },
        "spec": {
            "rayVersion": options.ray_version,
            "enableInTreeAutoscaling": False,  # the operator sizes the elastic groups, not Ray's autoscaler
            # Ray's token authentication with the job's token on every Ray process KubeRay starts (it sets
            # RAY_AUTH_MODE and RAY_AUTH_TOKEN from the Secret): the dashboard, job submission, GCS and the
            # client port refuse a caller without it, whatever the network lets through.
            "authOptions": {"mode": "token", "secretName": token_secret_name(job)},
            "headGroupSpec": head_group(job, options),
            "workerGroupSpecs": [worker_group(job, shape, groups) for shape in pool_shapes(job, groups)],
        },
    }
