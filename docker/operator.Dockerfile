# syntax=docker/dockerfile:1
# The operator image: `pip install '.[operator]'` - kopf, the Kubernetes client, prometheus-client,
# the schema and the gRPC stubs. No torch, no Ray (tests/test_packaging.py keeps it that way).
#
#   docker build -f docker/operator.Dockerfile -t ghcr.io/rljob/rljob-operator:0.1.0 .
#
# Run by the Helm chart (charts/rljob-operator) as `python -m rljob_operator`, as user 65532 with a
# read-only root filesystem.
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS build
WORKDIR /src
# Only what the package build reads: metadata, pins, and the source folders setuptools finds packages in.
COPY pyproject.toml constraints.txt README.md ./
COPY api ./api
COPY operator ./operator
COPY workers ./workers
COPY proto/gen ./proto/gen
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:${PYTHON_VERSION}-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=build /wheels /wheels
COPY constraints.txt /tmp/constraints.txt
RUN pip install --no-cache-dir -c /tmp/constraints.txt "$(ls /wheels/rljob-*.whl)[operator]" \
    && rm -rf /wheels /tmp/constraints.txt \
    && python -c "import sys, rljob_operator.process.handlers; assert not {'torch', 'ray'} & set(sys.modules)"
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["python", "-m", "rljob_operator"]
