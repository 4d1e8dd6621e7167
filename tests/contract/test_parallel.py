"""spec.parallelism: DDP by default, FSDP on request, clear refusals where FSDP cannot run."""

import pytest
from pydantic import ValidationError

from contract.spec import JobSpec


def spec(**kw):
    base = {"base_model": "tiny-llama", "training_file": "x.jsonl", "objective": "dpo"}
    return JobSpec.model_validate({**base, **kw})


def test_default_is_ddp_and_fsdp_is_accepted():
    assert spec().parallelism.strategy == "ddp" and not spec().parallelism.fsdp
    p = spec(
        parallelism={"strategy": "fsdp", "reshard_after_forward": False},
        adapter={"kind": "lora"},
        precision="bf16",
    ).parallelism
    assert p.fsdp and p.reshard_after_forward is False
    assert JobSpec.model_validate_json(
        spec(parallelism={"strategy": "fsdp"}).model_dump_json()
    ).parallelism.fsdp


@pytest.mark.parametrize(
    "kw, where",
    [
        ({"parallelism": {"strategy": "zero3"}}, "parallelism.strategy"),
        ({"parallelism": {"strategy": "fsdp", "cpu_offload": True}}, "parallelism.cpu_offload"),
        ({"parallelism": {"strategy": "fsdp"}, "precision": "fp16"}, "use precision 'bf16'"),
    ],
)
def test_invalid_parallelism_is_rejected_with_the_field(kw, where):
    with pytest.raises(ValidationError) as err:
        spec(**kw)
    assert where in str(err.value)
    assert "parallelism" in str(err.value)


def test_online_is_fine_with_both_and_fp16_with_ddp():
    for strategy in ("ddp", "fsdp"):
        online = spec(variant="online", max_steps=2, parallelism={"strategy": strategy})
        assert online.parallelism.strategy == strategy and online.data_source == "online"
    assert spec(precision="fp16").parallelism.strategy == "ddp"
