# The streaming worker: `docker compose up -d` builds and runs it (see docker-compose.yml).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
# Only what the package needs: tests, infra and docs stay out of the image. devtools
# (`compactor dev`/`demo`) is part of the package; the worker never imports it.
# Dependencies first, each at the version and hash pinned in requirements.lock (its
# own layer, rebuilt only when the lock changes); then the package without deps.
COPY requirements.lock ./
RUN pip install --require-hashes -r requirements.lock
COPY pyproject.toml README.md ./
COPY core ./core
COPY streams ./streams
COPY devtools ./devtools
RUN pip install --no-deps . \
    && useradd --system --uid 10001 --create-home --home-dir /var/lib/compactor compactor \
    && rm -rf /src

# The worker's table store and any embedded state live in the worker-state volume.
USER compactor
WORKDIR /var/lib/compactor
EXPOSE 6066
ENTRYPOINT ["compactor"]
CMD ["worker"]
