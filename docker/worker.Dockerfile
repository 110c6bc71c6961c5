# syntax=docker/dockerfile:1
# The worker image: `pip install '.[workers]'` - rollout, trainer, reward, the controller and the
# Ray launcher (torch, transformers, Ray). No kopf. Every pool's pod and the driver run it
# (spec.image); KubeRay starts Ray in it with `ray start`, the driver runs `rljob run --cluster`.
#
#   docker build -f docker/worker.Dockerfile -t ghcr.io/rljob/rljob-worker:0.1.0 .
#   docker build -f docker/worker.Dockerfile --build-arg EXTRAS=workers,vllm -t ...-vllm .   # heavy engines
#
# GPUs: the torch wheels bring their CUDA libraries; the node's NVIDIA container runtime brings the driver.
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS build
WORKDIR /src
COPY pyproject.toml constraints.txt README.md ./
COPY api ./api
COPY operator ./operator
COPY workers ./workers
COPY proto/gen ./proto/gen
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# The worker's runtime without its Python packages: shared by the image below and by e2e's test variant.
FROM python:${PYTHON_VERSION}-slim AS runtime
ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    RAY_USAGE_STATS_ENABLED=0
# KubeRay's probes and its wait-for-GCS init container run bash and wget inside this image.
RUN apt-get update \
    && apt-get install -y --no-install-recommends bash wget ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 1000 --create-home --shell /bin/bash ray

# Test only (e2e/images.sh, `--target worker-test`): the runtime, its Python packages in a virtual
# environment the pods mount read-only at /opt/rljob/venv (made with this image's own python3).
FROM runtime AS worker-test
ENV PATH=/opt/rljob/venv/bin:$PATH
# KubeRay runs `ray start` and its GCS wait in a login shell (`bash -lc`), whose /etc/profile resets PATH.
RUN echo 'export PATH=/opt/rljob/venv/bin:$PATH' > /etc/profile.d/rljob-venv.sh
USER 1000
WORKDIR /home/ray
CMD ["rljob", "--help"]

FROM runtime
ARG EXTRAS=workers
COPY --from=build /wheels /wheels
COPY constraints.txt /tmp/constraints.txt
RUN pip install --no-cache-dir -c /tmp/constraints.txt "$(ls /wheels/rljob-*.whl)[${EXTRAS}]" \
    && rm -rf /wheels /tmp/constraints.txt \
    && python -c "import importlib.util as u; assert u.find_spec('kopf') is None, 'kopf in the worker image'"
USER 1000
WORKDIR /home/ray
CMD ["rljob", "--help"]
