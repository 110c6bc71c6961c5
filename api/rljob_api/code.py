"""spec.code: the user's own Python (reward functions, environment classes, the helpers they import) on the
import path of the driver and of the pools that run it, without building an image.

On one machine `rljob run` puts the job file's folder there, and `paths` (relative to the job file) after it.
On a cluster the operator mounts a ConfigMap's files (`configMap`, `kubectl create configmap --from-file`) or a
claim's folder (`volume`) into the driver, the reward pods and the environment pods, and puts the mount on their
PYTHONPATH. Python packages the code needs come with the image.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from .base import FieldRuleError, Model

# Where a cluster's code sources are mounted in the pods that import user code.
CODE_CONFIG_MAP_DIR = "/opt/rljob/code/configmap"
CODE_VOLUME_DIR = "/opt/rljob/code/volume"


class CodeVolume(Model):
    """A PersistentVolumeClaim holding the code, mounted read-only."""

    claim_name: str = Field(description="Name of the PersistentVolumeClaim.", min_length=1, max_length=253)
    sub_path: str | None = Field(
        None, description="Folder inside the claim to mount (its root when unset).", min_length=1, max_length=4096
    )


class CodeSpec(Model):
    """Where the job's own Python comes from, besides the image."""

    paths: list[str] = Field(
        default_factory=list,
        description=(
            "On one machine (rljob run): folders, relative to the job file, put on the import path after the job "
            "file's own folder."
        ),
        max_length=16,
    )
    config_map: str | None = Field(
        None,
        description=(
            f"On a cluster: a ConfigMap in the job's namespace whose files (flat; 1 MiB in all) are mounted at "
            f"{CODE_CONFIG_MAP_DIR} in the driver, reward and environment pods and put on their PYTHONPATH."
        ),
        min_length=1,
        max_length=253,
    )
    volume: CodeVolume | None = Field(
        None,
        description=(
            f"On a cluster: a claim's folder, mounted read-only at {CODE_VOLUME_DIR} in the driver, reward and "
            "environment pods and put on their PYTHONPATH."
        ),
    )

    @model_validator(mode="after")
    def _relative_paths(self) -> CodeSpec:
        for index, path in enumerate(self.paths):
            if path.startswith("/"):
                raise FieldRuleError(f"paths[{index}]", f"{path} is absolute; give it relative to the job file")
        return self

    @property
    def on_cluster(self) -> bool:
        """Whether it names a source only a cluster mounts."""
        return self.config_map is not None or self.volume is not None

    def cluster_path(self) -> list[str]:
        """The folders the operator mounts, in PYTHONPATH order."""
        return [
            *([CODE_CONFIG_MAP_DIR] if self.config_map is not None else []),
            *([CODE_VOLUME_DIR] if self.volume is not None else []),
        ]
