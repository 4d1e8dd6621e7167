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


def test_nodes_default_to_one_and_world_size_counts_every_process():
    p = spec().parallelism
    assert p.nodes == 1 and p.processes_per_node is None and not p.hsdp and not p.multinode
    assert p.world_size() == 1 and p.world_size(4) == 4
    two = spec(
        parallelism={"strategy": "fsdp", "nodes": 2, "processes_per_node": 8, "hsdp": True}
    ).parallelism
    assert two.multinode and two.hsdp and two.world_size() == 16 and two.world_size(4) == 16
    assert spec(parallelism={"processes_per_node": 3}).parallelism.world_size(8) == 3


@pytest.mark.parametrize(
    "parallelism, where",
    [
        ({"nodes": 0}, "parallelism.nodes"),
        ({"nodes": 2, "processes_per_node": 0}, "parallelism.processes_per_node"),
        ({"nodes": 2}, "processes_per_node is required"),
        ({"nodes": 2, "processes_per_node": 2, "hsdp": True}, "hsdp needs strategy 'fsdp'"),
        ({"strategy": "fsdp", "hsdp": True, "processes_per_node": 2}, "hsdp needs nodes > 1"),
    ],
)
def test_invalid_nodes_are_rejected_with_the_field(parallelism, where):
    with pytest.raises(ValidationError) as err:
        spec(parallelism=parallelism)
    assert where in str(err.value) and "parallelism" in str(err.value)
