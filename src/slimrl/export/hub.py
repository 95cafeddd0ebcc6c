"""Hub upload, the model card, and the Ollama Modelfile that go with an exported folder.

Choices:
- Upload with huggingface_hub's own client: `HfApi.create_repo(exist_ok=True)` then `HfApi.upload_folder` (one
  commit). A repository slimrl creates is private unless `private=False` is passed (the CLI: `--public`): a fresh
  fine-tune is not published by accident. (Unsloth's `private=None` leaves it to the Hub, which makes it public.) An
  existing repository keeps its visibility. The endpoint is huggingface_hub's (`HF_ENDPOINT`); the token is the
  caller's, else huggingface_hub's login / `HF_TOKEN`. Tests run this client against a local stand-in of the Hub
  API, never the network.
- The model card is a short README.md with Hub metadata: `base_model` only when the base is a Hub id (the Hub
  rejects a local path), the embedded model mapped to its Hub id; tags slimrl and trl.
- The Modelfile points Ollama at the GGUF next to it. A ChatML chat template (SmolLM2, Qwen2) is spelled as
  Ollama's TEMPLATE with `<|im_end|>` as stop; for other templates only FROM and the eos stop are written and
  Ollama reads the template from the GGUF metadata itself.
"""

from __future__ import annotations

import os

from ..models.embedded import hub_base_model

_CHATML_OLLAMA_TEMPLATE = (
    "{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n{{ end }}<|im_start|>assistant\n"
)


def write_model_card(folder: str, base_name: str | None, library: str) -> str:
    """README.md with Hub metadata for an exported folder; returns its path."""
    lines = ["---", f"library_name: {library}", "tags:", "- slimrl", "- trl"]
    base = hub_base_model(base_name)
    if base is not None:
        lines.append(f"base_model: {base}")
    lines += [
        "---",
        "",
        "Fine-tuned with slimrl (reinforcement learning on Hugging Face TRL)"
        + (f" from `{base_name}`." if base_name else "."),
    ]
    path = os.path.join(folder, "README.md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def write_modelfile(folder: str, gguf_filename: str, tokenizer) -> str:
    """An Ollama Modelfile next to the GGUF (`ollama create NAME -f Modelfile`); returns its path."""
    template = getattr(tokenizer, "chat_template", None) or ""
    lines = [f"FROM ./{gguf_filename}"]
    if "<|im_start|>" in template:
        lines.append(f'TEMPLATE """{_CHATML_OLLAMA_TEMPLATE}"""')
        lines.append('PARAMETER stop "<|im_end|>"')
    elif tokenizer is not None and tokenizer.eos_token:
        lines.append(f'PARAMETER stop "{tokenizer.eos_token}"')
    path = os.path.join(folder, "Modelfile")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def is_private(private: bool | None) -> bool:
    """The visibility of a repository slimrl creates: private unless the caller said `private=False`."""
    return True if private is None else bool(private)


def upload_folder(
    folder: str,
    repo_id: str,
    token=None,
    private: bool | None = None,
    commit_message: str | None = None,
    commit_description: str | None = None,
    create_pr: bool = False,
    revision: str | None = None,
) -> str:
    """Create `repo_id` if needed (private unless `private=False`) and upload `folder` in one commit; returns the
    commit URL."""
    from huggingface_hub import HfApi

    if not isinstance(repo_id, str) or not repo_id.strip():
        raise ValueError(f"repo_id must be a Hub repository id such as 'user/my-model'; got {repo_id!r}")
    api = HfApi(token=token)
    api.create_repo(repo_id, private=is_private(private), exist_ok=True, repo_type="model")
    info = api.upload_folder(
        repo_id=repo_id,
        folder_path=folder,
        repo_type="model",
        commit_message=commit_message or "Upload model trained with slimrl",
        commit_description=commit_description,
        create_pr=create_pr,
        revision=revision,
    )
    return str(getattr(info, "commit_url", info))
