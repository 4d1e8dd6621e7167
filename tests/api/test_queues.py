"""api/queues.py: the work queues (embedded, Celery, the background sender) for jobs and
evaluations, and the Celery client made once however many threads enqueue at once."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import types
from pathlib import Path

from api import queues
from contract.tasks import RUN_EVALUATION, RUN_JOB
from models.settings import Settings

REPO = Path(__file__).resolve().parents[2]


def test_embedded_queue_hands_jobs_to_the_worker(monkeypatch):
    got = []
    fake = types.ModuleType("worker.embedded")
    fake.enqueue = got.append
    monkeypatch.setitem(sys.modules, "worker.embedded", fake)
    queues.EmbeddedQueue().enqueue("job-1")
    assert got == ["job-1"]


def test_default_queue_follows_the_broker_url():
    assert isinstance(queues.default_queue(Settings(BROKER_URL="memory://")), queues.EmbeddedQueue)
    queue = queues.default_queue(Settings(BROKER_URL="redis://h:6379/0", CELERY_QUEUE="gpu-a100"))
    assert isinstance(queue, queues.BackgroundQueue) and isinstance(queue, queues.JobQueue)
    assert isinstance(queue.inner, queues.CeleryQueue) and queue.inner.queue == "gpu-a100"


def test_background_queue_sends_in_order_and_survives_broker_errors(caplog):
    sent, done = [], threading.Event()

    class Flaky:
        def enqueue(self, job_id):
            if job_id == "job-2":
                raise ConnectionError("broker down")
            sent.append(job_id)
            if job_id == "job-4":
                done.set()

    queue = queues.BackgroundQueue(Flaky())
    for i in range(1, 5):
        queue.enqueue(f"job-{i}")  # returns at once: the sender thread talks to the broker
    assert done.wait(10)
    assert sent == ["job-1", "job-3", "job-4"]  # job-2 stays queued in the DB for the sweep
    assert any("could not enqueue" in r.getMessage() for r in caplog.records)


def test_celery_queue_sends_run_job_by_name(monkeypatch):
    sent = []

    class FakeCelery:
        def send_task(self, name, args, **options):
            sent.append((name, args, options))

    queue = queues.CeleryQueue("redis://h:6379/0", "gpu")
    monkeypatch.setattr(queue, "_app", lambda: FakeCelery())
    queue.enqueue("job-7")
    assert sent == [("worker.tasks.run_job", ["job-7"], {"queue": "gpu"})]


def test_celery_queue_reaches_a_real_redis_broker(redis_broker_url):
    """On the test broker's own Redis database (tests/fixtures/services.py)."""
    import redis

    client = redis.Redis.from_url(redis_broker_url)
    name = "humanline-test-queue"
    client.delete(name)
    try:
        queues.CeleryQueue(redis_broker_url, name).enqueue("job-redis")
        assert client.llen(name) == 1
        assert b"worker.tasks.run_job" in client.lindex(name, 0)
    finally:
        client.delete(name)


def test_concurrent_first_enqueues_create_one_celery_client():
    """celery swaps its package for a lazy module on first import; threads importing it at
    once used to get "cannot import name 'Celery'" (a fresh interpreter: first import)."""
    code = textwrap.dedent(
        """
        import threading
        from api.queues import CeleryQueue

        queue, barrier = CeleryQueue("redis://127.0.0.1:1/0"), threading.Barrier(16)
        apps, errors = [], []

        def first_use():
            barrier.wait()
            try:
                apps.append(queue._app())
            except Exception as exc:
                errors.append(repr(exc))

        threads = [threading.Thread(target=first_use) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print(len(errors), len({id(a) for a in apps}))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "1"], done.stdout + done.stderr


def test_each_task_has_its_queue(monkeypatch):
    """Jobs and evaluations go through the same queue object, each to its own task."""
    got: list[tuple[str, str]] = []
    fake = types.ModuleType("worker.embedded")
    fake.enqueue = lambda i: got.append(("job", i))
    fake.enqueue_evaluation = lambda i: got.append(("evaluation", i))
    monkeypatch.setitem(sys.modules, "worker.embedded", fake)
    queues.default_queue(Settings(BROKER_URL="memory://"), RUN_EVALUATION).enqueue("eval-1")
    queues.default_queue(Settings(BROKER_URL="memory://"), RUN_JOB).enqueue("job-1")
    assert got == [("evaluation", "eval-1"), ("job", "job-1")]
    remote = queues.default_queue(Settings(BROKER_URL="redis://h:6379/0"), RUN_EVALUATION)
    assert remote.inner.task == "worker.tasks.run_evaluation"


def test_create_app_builds_both_queues(tmp_path):
    from api.main import create_app

    settings = Settings(
        DATABASE_URL=f"sqlite:///{tmp_path / 'q.db'}",
        STORAGE_URL=f"file://{tmp_path / 'objects'}",
        BROKER_URL="redis://h:6379/0",
        CELERY_QUEUE="ingress",
    )
    state = create_app(settings).state
    assert [q.inner.task for q in (state.queue, state.eval_queue)] == [RUN_JOB, RUN_EVALUATION]
    assert state.queue.inner.queue == state.eval_queue.inner.queue == "ingress"
