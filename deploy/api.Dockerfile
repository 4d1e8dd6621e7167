# Slim API image: FastAPI + SQLAlchemy + boto3 + the Celery client, no torch (the API never
# imports it). Same CPython (3.11) and the same pins as requirements/cpu.lock (make install, CI,
# the CPU worker): the lock is a constraints file here, so only the API's own packages are
# installed, each at its locked version.
#   docker build -f deploy/api.Dockerfile -t humanline/api:latest .
FROM python:3.11-slim AS api
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY requirements/cpu.lock requirements/cpu.lock
COPY pyproject.toml README.md alembic.ini ./
COPY api ./api
COPY models ./models
COPY migrations ./migrations
COPY storage ./storage
COPY contract ./contract
COPY reports ./reports
RUN pip install -c requirements/cpu.lock ".[api]" "celery[redis]" \
    && python -c "import api.main, sys; assert 'torch' not in sys.modules"
RUN useradd --uid 10001 --create-home humanline
USER humanline
EXPOSE 8000
HEALTHCHECK CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz')"
CMD ["humanline-server", "serve", "--host", "0.0.0.0", "--port", "8000", "--workers", "2"]
