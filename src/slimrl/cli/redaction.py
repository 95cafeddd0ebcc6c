"""Secrets kept out of what slimrl prints: the resume line repeats the command as run, and a command line can hold a
Hub token (`--hub_token hf_...`) or an API key that must not land in logs.

Choices:
- A flag is secret when the last word of its name is token, key, password, passwd, secret or credentials
  (`--hub_token`, `--token`, `--api_key`, `--wandb_password`), except the tokenizer's special-token fields
  (`--pad_token`, `--stop_token`, ...), whose values are token strings, not credentials.
- A secret flag and its value are left out of the printed command (the command stays pasteable: the Hub client
  still finds the token saved by `hf auth login` or in HF_TOKEN); a trailing shell comment names what was left out.
- A value shaped like a known credential (Hugging Face `hf_...`, OpenAI-style `sk-...`, GitHub `ghp_...` /
  `github_pat_...`, Slack `xox?-...`, AWS `AKIA...`) is replaced by REDACTED wherever it appears in an argument.
"""

from __future__ import annotations

import re

REDACTED = "REDACTED"
SECRET_WORDS = ("token", "key", "password", "passwd", "secret", "credentials")
# `<name>_token` fields that hold a tokenizer's special token, not a credential
SPECIAL_TOKEN_PREFIXES = ("pad", "eos", "bos", "unk", "sep", "mask", "cls", "stop")
SECRET_VALUE = re.compile(
    r"(hf_[A-Za-z0-9]{16,}|sk-[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
    r"|xox[abpr]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16})"
)


def is_secret_flag(arg: str) -> bool:
    """Whether `arg` (`--name` or `--name=value`) names a flag whose value is a credential."""
    if not arg.startswith("-"):
        return False
    name = arg.lstrip("-").split("=", 1)[0].lower().replace("-", "_")
    words = name.split("_")
    if words[-1] not in SECRET_WORDS:
        return False
    return not (words[-1] == "token" and len(words) == 2 and words[0] in SPECIAL_TOKEN_PREFIXES)


def redact_value(text: str) -> str:
    return SECRET_VALUE.sub(REDACTED, text)


def redact_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """(argv without secret flags and with credential-shaped values replaced, the secret flags left out)."""
    kept, left_out, skip_value = [], [], False
    for i, arg in enumerate(argv):
        if skip_value:
            skip_value = False
            continue
        if is_secret_flag(arg):
            left_out.append(arg.split("=", 1)[0])
            skip_value = "=" not in arg and i + 1 < len(argv) and not argv[i + 1].startswith("--")
            continue
        kept.append(redact_value(arg))
    return kept, left_out


def left_out_note(left_out: list[str]) -> str:
    """The shell comment that follows a command from which secret flags were left out ('' when none were)."""
    if not left_out:
        return ""
    flags = ", ".join(dict.fromkeys(left_out))
    return f"  # left out (secret): {flags}; pass again, or let the Hub client use HF_TOKEN / hf auth login"
