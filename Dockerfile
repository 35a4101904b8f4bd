# The streaming worker: `docker compose up -d` builds and runs it (see docker-compose.yml).
#
# Reproducible: the base image by digest (the multi-platform index of
# python:3.11.14-slim; refresh it with `docker buildx imagetools inspect
# python:3.11.14-slim`), every Python distribution at the version and hash of
# requirements.lock, setuptools (what builds the package) included, and the
# package built without build isolation, so nothing unpinned is downloaded.
# tests/unit/test_dockerfile.py holds this file to it.
FROM python:3.11.14-slim@sha256:c8271b1f627d0068857dce5b53e14a9558603b527e46f1f901722f935b786a39

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
# Only what the package needs: tests, infra and docs stay out of the image. devtools
# (`compactor dev`/`demo`) is part of the package; the worker never imports it.
# Dependencies first, each at the version and hash pinned in requirements.lock (its
# own layer, rebuilt only when the lock changes), setuptools among them; then the
# package without deps, built by that setuptools (--no-build-isolation: pip
# fetches no build requirements of its own).
COPY requirements.lock ./
RUN pip install --require-hashes -r requirements.lock
COPY pyproject.toml README.md ./
COPY core ./core
COPY streams ./streams
COPY devtools ./devtools
RUN pip install --no-index --no-deps --no-build-isolation . \
    && useradd --system --uid 10001 --create-home --home-dir /var/lib/compactor compactor \
    && rm -rf /src

# The worker's table store and any embedded state live in the worker-state volume.
USER compactor
WORKDIR /var/lib/compactor
EXPOSE 6066
ENTRYPOINT ["compactor"]
CMD ["worker"]
