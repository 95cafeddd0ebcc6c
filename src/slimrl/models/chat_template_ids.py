"""transformers 4.x's `tokenizer.apply_chat_template(..., tokenize=True)` result, the token ids, on the tokenizer
FastLanguageModel.from_pretrained returns.

transformers 5 made `return_dict=True` the default, so the call returns a BatchEncoding: `len(...)` is 2 (its keys)
and `dataset.map` refuses it. Unsloth's notebooks measure prompts with `len(tokenizer.apply_chat_template(messages,
tokenize=True))` and store the result. On the tokenizer slimrl returns (an instance-level swap: no other tokenizer,
and not the class, changes), a tokenizing call that does not pass `return_dict` gets `return_dict=False`, as in
transformers 4.x: the ids (a list, a list per conversation, or a tensor with `return_tensors`), with one notice the
first time. `return_dict=True` (TRL passes it explicitly) and `tokenize=False` are left as they are.

The swap is one instance attribute, a `LegacyChatTemplate` holding the tokenizer (`is_swapped` recognises it;
`copy.deepcopy` and pickling, e.g. `dataset.map(num_proc=...)`, bind it to the copy), undone by `restore`.
"""

from __future__ import annotations

import inspect

from ..notices import notice

NAME = "apply_chat_template"


class LegacyChatTemplate:
    """`apply_chat_template` of one tokenizer with transformers 4.x's default `return_dict=False`."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __reduce__(self):  # copies and pickles of the tokenizer get their own, bound to the copy
        return type(self), (self.tokenizer,)

    def __call__(self, *args, **kwargs):
        original = getattr(type(self.tokenizer), NAME)
        call = inspect.signature(original).bind(self.tokenizer, *args, **kwargs)
        if call.arguments.get("tokenize", True) and "return_dict" not in call.arguments:
            kwargs["return_dict"] = False
            notice(
                "tokenizer.apply_chat_template(..., tokenize=True) returns the token ids, as in transformers 4.x "
                "(transformers 5 returns a BatchEncoding unless return_dict=False); pass return_dict=True for that."
            )
        return original(self.tokenizer, *args, **kwargs)


def swap_in(tokenizer) -> None:
    """Give `tokenizer` (a transformers tokenizer, not a processor) transformers 4.x's result for tokenizing calls."""
    from transformers import PreTrainedTokenizerBase

    if NAME in vars(tokenizer) or not isinstance(tokenizer, PreTrainedTokenizerBase):
        return
    setattr(tokenizer, NAME, LegacyChatTemplate(tokenizer))


def is_swapped(tokenizer) -> bool:
    return isinstance(vars(tokenizer).get(NAME), LegacyChatTemplate)


def restore(tokenizer) -> None:
    """transformers 5's own apply_chat_template on `tokenizer` again."""
    if is_swapped(tokenizer):
        delattr(tokenizer, NAME)
