"""A patched GRPO step takes "auto"'s decision for each long-context lever from slimrl.models.long_context, and
`slimrl.describe(trainer).levers` says which is on or off and why. Negative control: the same trainer with the CPU
threshold lowered to one token groups its rows and says so."""

import slimrl
from slimrl.models import long_context as LC
from slimrl.ops import row_groups as rg
from slimrl.patches.scoring import row_groups as RG

import _parity as P
import _rl_parity as R
import _tiny as T


def _step(trainer, args) -> dict:
    trainer.training_step(trainer.model, R.generation_batch(args), None)
    return slimrl.describe(trainer).levers


def test_describe_says_why_each_lever_is_on_or_off(tmp_path, unpatched, monkeypatch):
    with P.patched_state("grpo"):
        args = R.make_config("grpo", str(tmp_path), per_device_train_batch_size=4, num_generations=2)
        trainer = R.build_trainer("grpo", T.tiny_model(0), args, T.lora_config())
        trainer.current_gradient_accumulation_steps = 1
        assert slimrl.describe(trainer).levers["row_groups"].startswith("undecided (auto: decided per forward")
        levers = _step(trainer, args)
        assert levers["row_groups"].startswith("off (auto: off on CPU, a forward of 4 rows x ")
        assert levers["padding_free"].startswith("off (auto: off on CPU, a forward of 4 rows x ")
        assert levers["tiled_mlp"].startswith("off (auto: tiles calls of ")
        assert "  lever    row_groups: off (auto: off on CPU" in str(slimrl.describe(trainer))
        stats = RG.row_group_stats(trainer)
        assert stats.grouped_steps == 0 and stats.grouped_passes == 0

        monkeypatch.setattr(LC, "CPU_MIN_FORWARD_TOKENS", 1)
        monkeypatch.setattr(rg, "AUTO_GROUP_TOKENS", 12)  # a couple of the tiny rows a group
        levers = _step(trainer, args)
        assert levers["row_groups"] == "on (auto: groups of up to 12 tokens, fewer where free memory is short)"
        assert levers["padding_free"].startswith("on (auto: all-padding columns skipped")
        assert stats.grouped_steps == 1 and stats.groups > 1
