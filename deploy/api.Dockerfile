# Slim API image: FastAPI + SQLAlchemy + boto3, no torch (the API never imports it).
FROM python:3.11-slim AS api
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY api ./api
COPY models ./models
COPY migrations ./migrations
COPY storage ./storage
COPY trainer/__init__.py ./trainer/__init__.py
COPY trainer/spec ./trainer/spec
RUN pip install ".[api]" "celery[redis]>=5.4"
RUN useradd --uid 10001 --create-home humanline
USER humanline
EXPOSE 8000
HEALTHCHECK CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz')"
CMD ["humanline-server", "serve", "--host", "0.0.0.0", "--port", "8000", "--workers", "2"]
