"""Each process loads onto its own GPU (slimrl.models.loading.process_device_map): under torchrun / accelerate launch
LOCAL_RANK picks the GPU, so N ranks never all materialise the model on GPU 0 first; under ZeRO-3 no map is given
(transformers refuses one and DeepSpeed places the shards)."""

import pytest

from slimrl.models import loading


@pytest.mark.parametrize("local_rank,expected", [(None, {"": 0}), ("0", {"": 0}), ("3", {"": 3})])
def test_device_map_follows_local_rank(monkeypatch, local_rank, expected):
    if local_rank is None:
        monkeypatch.delenv("LOCAL_RANK", raising=False)
    else:
        monkeypatch.setenv("LOCAL_RANK", local_rank)
    assert loading.process_device_map() == expected


def test_no_device_map_under_zero3(monkeypatch):
    import transformers.integrations

    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(transformers.integrations, "is_deepspeed_zero3_enabled", lambda: True)
    assert loading.process_device_map() is None
