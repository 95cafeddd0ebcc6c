"""The vLLM tier: one in-process engine per process. vLLM's in-process engines share one process-wide parallel state,
and the shutdown of any of them (its close, or the finalizer vLLM runs when it is garbage-collected) tears that
state down for all. A model loaded again with fast_inference=True (a notebook's model cell run twice) therefore
closes the earlier engine first, so nothing the earlier engine does later can break the new one, and the earlier
model's fast_generate says why it no longer works. The negative control keeps the earlier engine open: its later
shutdown breaks the new engine.
"""

import gc

import pytest

pytestmark = pytest.mark.vllm
vllm = pytest.importorskip("vllm", reason="vLLM is not installed (bash scripts/install_vllm.sh)")

from slimrl import FastLanguageModel  # noqa: E402
from slimrl.generation import vllm_engine  # noqa: E402
from slimrl.testing import save_tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    # head_dim 64: vLLM's CPU attention has no kernel for 16
    return save_tiny_model(
        tmp_path_factory.mktemp("tiny"), vocab_size=512, hidden_size=128, num_layers=2, num_heads=2, num_kv_heads=1
    )


def _load(folder):
    model, _ = FastLanguageModel.from_pretrained(
        folder,
        max_seq_length=128,
        dtype="float32",
        fast_inference=True,
        gpu_memory_utilization=0.05,
        vllm_engine_kwargs={"enforce_eager": True},
    )
    return model


def _three_tokens(model):
    params = vllm.SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    return list(model.fast_generate("hello there", params)[0].outputs[0].token_ids)


def test_a_model_loaded_again_closes_the_earlier_engine(folder, caplog):
    first = _load(folder)
    first_engine = first.vllm_engine
    second = _load(folder)
    assert first_engine.closed and not second.vllm_engine.closed
    assert "replaces the one built earlier" in caplog.text
    with pytest.raises(RuntimeError, match="replaced it"):
        _three_tokens(first)
    first_engine.close()  # closing it again, and dropping it, do nothing to the new engine
    del first, first_engine
    gc.collect()
    assert len(_three_tokens(second)) == 3


def test_without_closing_the_earlier_engine_its_shutdown_breaks_the_new_one(folder, monkeypatch):
    first = _load(folder)
    monkeypatch.setattr(vllm_engine, "_close_earlier_engines", lambda: None)
    second = _load(folder)
    try:
        assert len(_three_tokens(second)) == 3
        first.vllm_engine.close()
        with pytest.raises(AssertionError, match="not initialized"):
            _three_tokens(second)
    finally:
        second.vllm_engine.close()
