"""The official `openai` package drives a humanline DPO job end to end through the embedded
worker: upload with purpose fine-tune, create with extensions, follow to `succeeded`, read
its events, checkpoints and fine-tuned model."""

from __future__ import annotations

import openai
from fastapi.testclient import TestClient
from openai.types.fine_tuning import FineTuningJob

from api.main import create_app
from models.teams import create_api_key
from tests.worker.conftest import PREFERENCE, wait_for
from worker import embedded


def test_openai_client_runs_a_dpo_job_to_success(local):
    with local.sessions() as s:
        _, secret = create_api_key(s, local.team_id)
        s.commit()
    http = TestClient(create_app(local.settings, session_factory=local.sessions))
    oai = openai.OpenAI(base_url="http://testserver/v1", api_key=secret, http_client=http)
    embedded.start(local.settings)
    try:
        training = oai.files.create(file=("prefs.jsonl", PREFERENCE), purpose="fine-tune")
        job = oai.fine_tuning.jobs.create(
            model="tiny-llama",
            training_file=training.id,
            method={"type": "dpo", "dpo": {"hyperparameters": {"batch_size": 4}}},
            extra_body={
                "humanline": True,
                "spec": {
                    "max_steps": 3,
                    "max_length": 96,
                    "max_prompt_length": 48,
                    "quality_sample": 0,
                    "checkpoint_every": 2,
                },
            },
        )

        def finished():
            j = oai.fine_tuning.jobs.retrieve(job.id)
            return j if j.status in ("succeeded", "failed", "cancelled") else None

        done = FineTuningJob.model_validate(wait_for(finished, 300, 0.2, "the job").model_dump())
        assert done.status == "succeeded", done.error
        assert done.fine_tuned_model and done.fine_tuned_model.endswith(job.id)
        messages = [e.message for e in oai.fine_tuning.jobs.list_events(job.id, limit=100)]
        assert any("succeeded" in m for m in messages)
        steps = sorted(c.step_number for c in oai.fine_tuning.jobs.checkpoints.list(job.id))
        assert steps == [2, 3]
        assert oai.models.retrieve(done.fine_tuned_model).owned_by == local.team_id
    finally:
        embedded.stop()
        http.close()
