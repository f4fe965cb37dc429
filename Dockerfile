# spec-advisor sidecar image: slim Python, non-root, runs on a read-only root filesystem, no build tools at run time.
#
#   docker build -t spec-advisor:0.1.0 .
#   docker run --read-only --tmpfs /tmp -p 8321:8321 -v "$PWD/config.yaml:/etc/spec-advisor/config.yaml:ro" spec-advisor:0.1.0
#   docker run --read-only --tmpfs /tmp -p 8321:8321 spec-advisor:0.1.0 serve --target http://vllm:8000
#
# tests/deploy/test_dockerfile.py lints this file and replays the build stage (its ENV, COPY and RUN lines, with the
# absolute paths moved into a temp dir) into a fresh venv here, so keep every path in the build stage's RUN lines
# behind an ENV variable.
#
# The base is pinned by tag and digest: the tag says what it is, the digest (of the tag's multi-arch index) is what is
# pulled, so every build gets the same base until this line changes. To move to a newer one, read
# `docker buildx imagetools inspect python:3.11-slim-trixie` (its "Digest:" line) and replace the digest here, as a
# reviewed change. `--build-arg PYTHON_IMAGE=...` overrides it for one build.
ARG PYTHON_IMAGE=python:3.11-slim-trixie@sha256:9c900dea9e8fb7e16277c179b555cc72d29a352dbc33cff48ad5a0412fd5bfc7

FROM ${PYTHON_IMAGE} AS build
ENV VENV=/opt/venv \
    TOOLS=/tmp/build-tools \
    DIST=/tmp/dist \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
# Dependencies first (their own layer, rebuilt only when the lock changes). The runtime venv is made without pip or
# setuptools; a throwaway tools venv with pinned pip/setuptools installs into it, and only hash-checked wheels go in.
COPY requirements.lock ./
RUN python -m venv "$TOOLS" \
 && "$TOOLS/bin/pip" install --no-cache-dir pip==26.3 setuptools==84.2.1 \
 && python -m venv --without-pip "$VENV" \
 && "$TOOLS/bin/pip" --python "$VENV/bin/python" install --no-cache-dir --require-hashes --only-binary=:all: \
      -r requirements.lock
COPY pyproject.toml README.md ./
COPY policies ./policies
COPY service ./service
# The project itself: built into a wheel with the pinned setuptools (no build isolation: nothing unpinned is fetched),
# installed without dependencies (the lock already put them in). pip compiles the bytecode at install time, so the
# read-only image never needs to write a .pyc.
RUN "$TOOLS/bin/pip" wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir "$DIST" . \
 && "$TOOLS/bin/pip" --python "$VENV/bin/python" install --no-cache-dir --no-deps "$DIST"/spec_advisor-*.whl

FROM ${PYTHON_IMAGE}
ARG PYTHON_IMAGE
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="spec-advisor" \
      org.opencontainers.image.description="Sidecar that tells vLLM operators whether speculative decoding should be on, and with which number of draft tokens" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"
# Nothing installs packages at run time: drop the base image's own pip/setuptools. The user owns no file in the
# image; its home is /tmp, the one writable place (an emptyDir or --tmpfs under readOnlyRootFilesystem).
RUN python -m pip uninstall --yes pip setuptools wheel \
 && groupadd --system --gid 10001 advisor \
 && useradd --system --uid 10001 --gid 10001 --home-dir /tmp --no-create-home --shell /usr/sbin/nologin advisor
COPY --from=build /opt/venv /opt/venv
# PYTHONDONTWRITEBYTECODE: never try to write next to the code (read-only); HOME/TMPDIR: anything a library caches
# goes to /tmp. SPEC_ADVISOR_HOST: in a container the sidecar must listen beyond loopback for Prometheus and the
# kubelet's probes (env beats the settings file; a --host flag beats env).
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    TMPDIR=/tmp \
    SPEC_ADVISOR_HOST=0.0.0.0
USER 10001:10001
WORKDIR /tmp
EXPOSE 8321
HEALTHCHECK --interval=15s --timeout=3s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import sys, urllib.request as u; sys.exit(0 if u.urlopen('http://127.0.0.1:8321/healthz', timeout=2).status == 200 else 1)"]
ENTRYPOINT ["spec-advisor"]
CMD ["serve", "--config", "/etc/spec-advisor/config.yaml"]
