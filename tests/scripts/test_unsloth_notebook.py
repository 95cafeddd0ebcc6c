"""scripts/unsloth_notebook.py: every rewrite, the dataset stand-ins, the refusals, and negative controls."""

import importlib.util
import json
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "scripts" / "unsloth_notebook.py"
_SPEC = importlib.util.spec_from_file_location("unsloth_notebook", _PATH)
nb = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(nb)

SAMPLE = """!pip install unsloth
%%capture
from unsloth import FastLanguageModel, PatchFastRL
import unsloth
model, tok = FastLanguageModel.from_pretrained(model_name = "unsloth/Qwen3-4B-Base", fast_inference = True)
x = torch.zeros(1, device = "cuda")
args = GRPOConfig(max_steps = 500)
"""


def test_every_rewrite(tmp_path):
    src = tmp_path / "n.py"
    src.write_text(SAMPLE)
    out = tmp_path / "o.py"
    assert nb.main([str(src), "--out", str(out), "--steps", "3"]) == 0
    text = out.read_text()
    body = text.split("\n\n", 1)[1]
    assert "pip install" not in body and "%%capture" not in body
    assert "from slimrl import FastLanguageModel, PatchFastRL" in text and "import slimrl" in text
    assert 'model_name = "smollm2-135m"' in text and '"cpu"' in text and '"cuda"' not in body
    assert "max_steps = 3" in text and "fast_inference = False" in text
    assert text.startswith("# Rewritten from n.py") and "# - max_steps capped at 3" in text


def test_vllm_and_ipynb(tmp_path):
    cells = [
        {"cell_type": "markdown", "source": ["from unsloth import x"]},
        {"cell_type": "code", "source": ["!pip install unsloth\n", "from unsloth import FastModel\n"]},
        {"cell_type": "code", "source": ["m = FastModel.from_pretrained(fast_inference = False)"]},
    ]
    src = tmp_path / "n.ipynb"
    src.write_text(json.dumps({"cells": cells}))
    out = tmp_path / "o.py"
    assert nb.main([str(src), "--out", str(out), "--vllm"]) == 0
    text = out.read_text()
    assert "from slimrl import FastModel" in text and "fast_inference = True" in text
    assert "from unsloth import x" not in text  # markdown cells dropped


@pytest.mark.parametrize(
    "line",
    [
        "from openenv import Env",
        "model_name = 'unsloth/gpt-oss-20b'",
        "load_in_fp8 = True",
        "import nemo_gym",
        "model = 'LLaDA diffusion'",
    ],
)
def test_refusals(tmp_path, line, capsys):
    src = tmp_path / "n.py"
    src.write_text(SAMPLE + line + "\n")
    assert nb.main([str(src), "--out", str(tmp_path / "o.py")]) == 2
    assert "cannot run on slimrl" in capsys.readouterr().err
    assert not (tmp_path / "o.py").exists()


def test_negative_control_untouched():
    text = "import torch\nprint('unslothful')\n"
    assert nb.transform(text) == (text, [])
    assert nb.refusal(SAMPLE) is None
    assert nb.refusal("m = load(load_in_fp8 = False)\n") is None
    assert nb.refusal("# News: gpt-oss and FP8 RL are here\n!pip install openenv\n" + SAMPLE) is None


DATA = """from datasets import load_dataset
a = load_dataset("openai/gsm8k", "main", split = "train")
b = load_dataset('org/pairs')["train"]
c = load_dataset("json", data_files = "mine.jsonl")
d = load_dataset(name, split = split)
max_seq_length = 4096
max_seq_length = 256
args = Config(
    max_length = 1024,
)
"""


def _stand_ins(tmp_path) -> Path:
    folder = tmp_path / "datasets"
    folder.mkdir()
    for name in ("openai__gsm8k", "org__pairs"):
        (folder / f"{name}.jsonl").write_text('{"question": "1 + 1?", "answer": "#### 2"}\n')
    return folder


def test_datasets_served_from_stand_ins_and_seq_length_capped(tmp_path):
    src, out, folder = tmp_path / "n.py", tmp_path / "o.py", _stand_ins(tmp_path)
    src.write_text(DATA)
    assert nb.main([str(src), "--out", str(out), "--datasets", str(folder), "--max-seq-length", "384"]) == 0
    text = out.read_text()
    gsm8k, pairs = folder.resolve() / "openai__gsm8k.jsonl", folder.resolve() / "org__pairs.jsonl"
    assert f'a = load_dataset("json", data_files = {{"train": "{gsm8k}"}}, split = "train")' in text  # config dropped
    assert f'b = load_dataset("json", data_files = {{"train": "{pairs}"}})["train"]' in text
    assert 'c = load_dataset("json", data_files = "mine.jsonl")' in text  # a builder, not a Hub id
    assert "d = load_dataset(name, split = split)" in text  # not a literal id: served when it runs (below)
    assert "max_seq_length = 384\nmax_seq_length = 256\n" in text  # capped, never raised
    assert "    max_length = 384,\n" in text and "# - max_length capped at 384 (1x)" in text
    assert '# - dataset "openai/gsm8k" -> openai__gsm8k.jsonl (local stand-in)' in text
    assert "# - max_seq_length capped at 384 (1x)" in text
    from datasets import load_dataset  # the rewritten calls load, with the stand-in's columns

    row = eval(text.split("a = ", 1)[1].splitlines()[0], {"load_dataset": load_dataset})[0]
    assert row == {"question": "1 + 1?", "answer": "#### 2"}


def test_a_variable_dataset_id_is_served_from_its_stand_in_when_it_runs(tmp_path):
    src, out, folder = tmp_path / "n.py", tmp_path / "o.py", _stand_ins(tmp_path)
    src.write_text(DATA)
    assert nb.main([str(src), "--out", str(out), "--datasets", str(folder)]) == 0
    text = out.read_text()
    assert "# - load_dataset(<variable id>) -> its stand-in when it runs" in text
    shim = text.split("\n\n", 1)[1].split("from datasets import load_dataset")[0]
    import datasets

    before = datasets.load_dataset
    try:
        exec(shim, {})
        rows = datasets.load_dataset("org/pairs", split="test_prefs")  # Zephyr's call: an id held in a variable
        assert rows[0] == {"question": "1 + 1?", "answer": "#### 2"}
        with pytest.raises(FileNotFoundError, match="org__other.jsonl"):
            datasets.load_dataset("org/other", split="train")
    finally:
        datasets.load_dataset = before
    literal_only = "\n".join(line for line in DATA.splitlines() if not line.startswith("d ="))
    src.write_text(literal_only)
    assert nb.main([str(src), "--out", str(out), "--datasets", str(folder)]) == 0
    assert "_stand_in" not in out.read_text()  # the negative control: literal ids need nothing at run time


def test_a_dataset_without_stand_in_is_refused(tmp_path, capsys):
    src, out, folder = tmp_path / "n.py", tmp_path / "o.py", _stand_ins(tmp_path)
    src.write_text(DATA + 'e = load_dataset("org/unknown", split = "test")\n')
    assert nb.main([str(src), "--out", str(out), "--datasets", str(folder)]) == 2
    err = capsys.readouterr().err
    assert 'no stand-in for load_dataset("org/unknown")' in err and "org__unknown.jsonl" in err
    assert not out.exists()


def test_without_the_options_datasets_and_lengths_are_untouched(tmp_path):  # the negative control
    src, out = tmp_path / "n.py", tmp_path / "o.py"
    src.write_text(DATA)
    assert nb.main([str(src), "--out", str(out)]) == 0
    assert out.read_text().endswith("\n\n" + DATA)


ENGINE = "model = FastLanguageModel.from_pretrained(fast_inference = True, gpu_memory_utilization = 0.9, # lower\n)\n"


@pytest.mark.parametrize(
    "text, vllm, device, expected",
    [
        (ENGINE, True, "cpu", 'gpu_memory_utilization = 0.1, vllm_engine_kwargs = {"enforce_eager": True}, # lower'),
        (ENGINE + "kw = dict(vllm_engine_kwargs = {})\n", True, "cpu", "gpu_memory_utilization = 0.1, # lower"),
        (ENGINE, False, "cpu", "gpu_memory_utilization = 0.9, # lower"),  # no engine: untouched (the control)
        (ENGINE, True, "cuda", "gpu_memory_utilization = 0.9, # lower"),  # a GPU's share: untouched
    ],
)
def test_a_cpu_engine_takes_a_tenth_of_ram_and_starts_eager(text, vllm, device, expected):
    out, changes = nb.transform(text, vllm=vllm, device=device)
    assert expected in out and out.count("vllm_engine_kwargs") == text.count("vllm_engine_kwargs") + (
        "enforce_eager" in expected
    )
    assert any("share of RAM" in c for c in changes) is (vllm and device == "cpu")


LFM2_TARGETS = """model = FastLanguageModel.get_peft_model(model,
    target_modules = [
        "q_proj", "k_proj", "v_proj", "out_proj", "in_proj",
        "w1", "w2", "w3"
    ],
)
"""


def test_another_architectures_lora_targets_name_the_embedded_models_layers():
    text, changes = nb.transform(LFM2_TARGETS)
    assert 'target_modules = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "down_proj", "up_proj"]' in text
    assert "in_proj" not in text and any("the embedded Llama model's layers" in c for c in changes)
    llama = 'target_modules = ["q_proj", "v_proj"],\n'
    assert nb.transform(llama)[0] == llama  # already Llama's names: the negative control
    assert nb.transform(LFM2_TARGETS, model="./my-lfm2")[0] == LFM2_TARGETS  # another model keeps the notebook's


def test_an_upper_case_model_constant_and_a_release_assert():
    text, changes = nb.transform(
        'MODEL_NAME = "unsloth/Muse-30B"\nassert transformers.__version__ == "5.15.0", transformers.__version__\n'
        "print(transformers.__version__)\n"
    )
    assert 'MODEL_NAME = "smollm2-135m"' in text and "assert" not in text
    assert "print(transformers.__version__)" in text  # only the assert goes: its install line is removed too
    assert "removed release asserts (1x)" in changes


def test_reasoning_tags_a_model_lacks_start_as_text():
    notebook = "reasoning_start = None\nreasoning_end = None\nfor token in tokenizer.get_added_vocab(): pass\n"
    text, changes = nb.transform(notebook)
    assert 'reasoning_start = "<think>"\nreasoning_end = "</think>"\n' in text
    assert any("reasoning tags as text" in c for c in changes)
    assert nb.transform(notebook, model="./deepseek-r1")[0] == notebook  # the notebook's own model keeps None
