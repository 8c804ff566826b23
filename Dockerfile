# kvscope images, built from this repository:
#   docker build --target agent -t kvscope:0.1.0 .      # agent, webhook (kvscope serve), CLI
#   docker build --target ui    -t kvscope-ui:0.1.0 .   # the same plus the Streamlit UI extras
# Both run as uid 65532 and work with a read-only root filesystem (state in /var/lib/kvscope,
# a writable /tmp is mounted by the Kubernetes manifests). Base pinned by tag; pin it by
# digest in your registry mirror for bit-for-bit rebuilds.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

# ---------------------------------------------------------------- build: wheels and venvs
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY kvscope/ kvscope/
COPY agent/ agent/
COPY core/ core/
COPY diagnoser/ diagnoser/
COPY report/ report/
COPY rules/ rules/
COPY dashboards/ dashboards/
COPY ui/ ui/
# Dependencies are pinned in pyproject.toml; "." is this checkout.
RUN python -m venv /opt/kvscope \
    && /opt/kvscope/bin/pip install --no-cache-dir . \
    && python -m venv /opt/kvscope-ui \
    && /opt/kvscope-ui/bin/pip install --no-cache-dir ".[ui]"

# ---------------------------------------------------------------- shared runtime base
FROM ${PYTHON_IMAGE} AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/var/lib/kvscope
RUN groupadd --system --gid 65532 kvscope \
    && useradd --system --uid 65532 --gid 65532 --home-dir /var/lib/kvscope --shell /usr/sbin/nologin kvscope \
    && install -d -o 65532 -g 65532 -m 0750 /var/lib/kvscope /etc/kvscope
WORKDIR /var/lib/kvscope

# ---------------------------------------------------------------- ui: Streamlit console
FROM runtime AS ui
COPY --from=build /opt/kvscope-ui /opt/kvscope-ui
ENV PATH=/opt/kvscope-ui/bin:$PATH
USER 65532:65532
EXPOSE 8501 9465
ENTRYPOINT ["kvscope"]
CMD ["ui", "--host=0.0.0.0", "--port=8501"]

# ---------------------------------------------------------------- agent (default target)
FROM runtime AS agent
COPY --from=build /opt/kvscope /opt/kvscope
ENV PATH=/opt/kvscope/bin:$PATH
USER 65532:65532
EXPOSE 9464 4318
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9464/-/ready', timeout=4)"]
ENTRYPOINT ["kvscope"]
# 0.0.0.0 inside the container namespace only: publish it with `docker run -p 127.0.0.1:9464:9464`.
CMD ["agent", "--config=/etc/kvscope/kvscope.yaml", "--store.path=/var/lib/kvscope/kvscope.db", \
     "--web.listen-address=0.0.0.0:9464"]
