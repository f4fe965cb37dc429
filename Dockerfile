# spec-advisor sidecar image: slim Python, non-root, nothing to compile in the final stage.
# Build: docker build -t spec-advisor .   Run: docker run -p 8000:8000 spec-advisor serve --target http://vllm:8000
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md requirements.lock ./
COPY policies ./policies
COPY service ./service
# Wheels only: the runtime stage copies a finished venv and never sees pip's build tools.
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir -r requirements.lock \
 && /opt/venv/bin/pip install --no-cache-dir --no-deps .

FROM python:3.11-slim
LABEL org.opencontainers.image.title="spec-advisor" \
      org.opencontainers.image.description="Advises whether speculative decoding should be on, and with which gamma" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/venv /opt/venv
RUN useradd --system --uid 10001 --no-create-home advisor
USER 10001
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=3s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2).status == 200 else 1)"]
ENTRYPOINT ["spec-advisor"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000", "--target", "http://127.0.0.1:8080"]
