"""RL on a game, in the shape of Unsloth's 2048 notebooks: the model writes a strategy function, the rewards run it.

The same cells: a 2048 board, `execute_with_time_limit` around the game loop, `check_python_modules` and
`create_locked_down_function` on the model's code (in slimrl it runs in a locked-down process: docs/sandbox.md), the
rewards function_works / no_cheating / strategy_succeeds, one repeated prompt, GRPOConfig with epsilon_high, delta,
loss_type="bnpo" and mask_truncated_completions; then generation and saving. Two steps on SmolLM2-135M.

    python examples/notebooks/game_2048.py                     # generation through transformers
    .venv-vllm/bin/python examples/notebooks/game_2048.py --fast_inference   # rollouts on vLLM
"""

import random
import sys

fast_inference = "--fast_inference" in sys.argv

# %% Load the model
from slimrl import FastLanguageModel

max_seq_length = 384
lora_rank = 8
model, tokenizer = FastLanguageModel.from_pretrained(
    model_name="smollm2-135m",
    max_seq_length=max_seq_length,
    load_in_4bit=False,
    fast_inference=fast_inference,
    max_lora_rank=lora_rank,
    gpu_memory_utilization=0.1,
    vllm_engine_kwargs={"enforce_eager": True},
)
model = FastLanguageModel.get_peft_model(
    model,
    r=lora_rank,
    target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    lora_alpha=lora_rank * 2,
    use_gradient_checkpointing="unsloth",
    random_state=3407,
)


# %% The game
class GameBoard:
    """2048 on a size × size board: W/A/S/D slide the tiles up/left/down/right; reaching `target` wins."""

    def __init__(self, size=4, seed=None, target=2048, probability_fours=0.10):
        self.size, self.target, self.probability_fours = size, target, probability_fours
        self._rng = random.Random(seed)
        self._board = [[0] * size for _ in range(size)]
        self._state = "ongoing"
        self._add_tile()
        self._add_tile()

    def board(self):
        return [list(row) for row in self._board]

    def state(self):
        return self._state

    def pretty(self):
        return "\n".join(" ".join(f"{v or '.':>4}" for v in row) for row in self._board)

    def _add_tile(self):
        empty = [(r, c) for r in range(self.size) for c in range(self.size) if self._board[r][c] == 0]
        if empty:
            r, c = self._rng.choice(empty)
            self._board[r][c] = 4 if self._rng.random() < self.probability_fours else 2

    @staticmethod
    def _slide_left(row):
        tiles, out = [v for v in row if v], []
        while tiles:
            if len(tiles) > 1 and tiles[0] == tiles[1]:
                out.append(2 * tiles.pop(0))
                tiles.pop(0)
            else:
                out.append(tiles.pop(0))
        return out + [0] * (len(row) - len(out))

    def _moved(self, key):
        """The board after sliding toward W (up), A (left), S (down) or D (right), before a new tile."""
        columns = key in "WS"
        rows = [list(r) for r in zip(*self._board)] if columns else [list(r) for r in self._board]
        if key in "DS":
            rows = [self._slide_left(r[::-1])[::-1] for r in rows]
        else:
            rows = [self._slide_left(r) for r in rows]
        return [list(r) for r in zip(*rows)] if columns else rows

    def do_action(self, key):
        if self._state != "ongoing":
            return
        if key not in ("W", "A", "S", "D"):
            self._state = "failed"
            return
        moved = self._moved(key)
        if moved != self._board:
            self._board = moved
            self._add_tile()
        if any(v >= self.target for row in self._board for v in row):
            self._state = "success"
        elif not any(self._moved(k) != self._board for k in "WASD"):
            self._state = "failed"


game = GameBoard(size=3, seed=42, target=8)
for action in "WDWD":
    game.do_action(action)
print(game.pretty(), game.state())

# %% Run a strategy with a time limit
from slimrl import check_python_modules, create_locked_down_function, execute_with_time_limit
from slimrl.sandbox import SandboxUnavailable  # raised where a kernel layer is missing (docs/sandbox.md, Fail closed)


def _execute_strategy(strategy, game):
    steps = 0
    while game.state() == "ongoing":
        action = strategy(game.board())
        steps += 1
        if type(action) is not str:
            return steps, "failed"
        game.do_action(action)
    return steps, game.state()


@execute_with_time_limit(2)
def execute_strategy(strategy, game):
    return _execute_strategy(strategy, game)


def always_move_left(board):
    return "W"


try:
    print(execute_strategy(always_move_left, GameBoard(size=8, seed=42, target=2048)))
except TimeoutError as e:
    print(f"Timed out with error = {e}")

# %% What the model may import, and its function locked down
ok, info = check_python_modules('def strategy(board):\n    import math\n    return "W"\n')
assert ok, info
ok, info = check_python_modules('def strategy(board):\n    from numpy import matmul\n    return "W"\n')
assert not ok, info
f = create_locked_down_function('def import_numpy():\n    np.matmul\n    print("Success")\n')
try:
    f()
except Exception as e:
    print("refused:", e)
f = create_locked_down_function("def add(a, b):\n    def adder(a):\n        return a + b\n    return adder(b) + b\n")
assert f(10, 20) == 60

# %% The prompt and the rewards
prompt = """
Create a new short 2048 strategy using only native Python code.
You are given a list of list of numbers for the current board state.
Output one action for "W", "A", "S", "D" on what is the optimal next step.
Output your new short function in backticks using the format below:
```python
def strategy(board):
    return "W" # Example
```
All helper functions should be inside def strategy. Only output the short function `strategy`.
""".strip()


def extract_function(text):
    if text.count("```") >= 2:
        first = text.find("```") + 3
        second = text.find("```", first)
        fx = text[first:second].strip().removeprefix("python\n")
        fx = fx[fx.find("def") :]
        if fx.startswith("def strategy(board):"):
            return fx
    return None


def function_works(completions, **kwargs):
    scores = []
    for completion in completions:
        function = extract_function(completion[0]["content"])
        info = check_python_modules(function)[1] if function is not None else {"error": "no function"}
        if "error" in info:
            scores.append(-2.0)
            continue
        try:
            create_locked_down_function(function)
            scores.append(1.0)
        except Exception:
            scores.append(-0.5)
    return scores


def no_cheating(completions, **kwargs):
    scores = []
    for completion in completions:
        function = extract_function(completion[0]["content"])
        scores.append(-1.0 if function is None else 1.0 if check_python_modules(function)[0] else -20.0)
    return scores


def strategy_succeeds(completions, **kwargs):
    scores, seed = [], random.randrange(10000)
    for completion in completions:
        function = extract_function(completion[0]["content"])
        if function is None or "error" in check_python_modules(function)[1]:
            scores.append(0.0)
            continue
        try:
            new_strategy = create_locked_down_function(function)
        except Exception:
            scores.append(0.0)
            continue
        try:
            steps, state = execute_strategy(new_strategy, GameBoard(size=6, seed=seed, target=2048))
            print(f"Steps = {steps} State = {state}")
            scores.append(20.0 if state == "success" else 2.0)
        except TimeoutError:
            scores.append(-1.0)
        except SandboxUnavailable:  # this machine lacks a protection layer: not the model's fault, not a score
            raise
        except Exception as e:
            print(f"Exception = {e}")
            scores.append(-3.0)
    return scores


written = [
    [{"content": f"```python\n{src}\n```"}]
    for src in (
        'def strategy(board):\n    return "W"',
        'def strategy(board):\n    import os\n    return os.system("ls")',
        "def strategy(board):\n    while True:\n        pass",
    )
]
print(function_works(written), no_cheating(written), strategy_succeeds(written))
assert no_cheating(written)[1] == -20.0 and strategy_succeeds(written)[2] == -1.0

# %% Train
from datasets import Dataset

dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": prompt}], "answer": 0}] * 16)
maximum_length = len(tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True))
max_completion_length = max_seq_length - (maximum_length + 1)

from trl import GRPOConfig, GRPOTrainer

training_args = GRPOConfig(
    temperature=1.0,
    learning_rate=5e-5,
    weight_decay=0.001,
    warmup_ratio=0.1,
    lr_scheduler_type="linear",
    optim="adamw_8bit",
    logging_steps=1,
    per_device_train_batch_size=1,
    gradient_accumulation_steps=2,
    num_generations=2,
    max_completion_length=max_completion_length,
    max_steps=2,
    save_steps=100,
    report_to="none",
    output_dir="outputs",
    epsilon=0.2,
    epsilon_high=0.28,
    delta=1.5,
    loss_type="bnpo",
    mask_truncated_completions=True,
)
trainer = GRPOTrainer(
    model=model,
    processing_class=tokenizer,
    reward_funcs=[function_works, no_cheating, strategy_succeeds],
    args=training_args,
    train_dataset=dataset,
)
trainer.train()
assert trainer.state.global_step == 2

# %% Inference and saving
text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
if fast_inference:
    from vllm import SamplingParams

    print(model.fast_generate(text, SamplingParams(max_tokens=48), use_adapter=True)[0].outputs[0].text)
else:
    FastLanguageModel.for_inference(model)
    inputs = tokenizer(text=text, return_tensors="pt", add_special_tokens=False).to(model.device)
    print(tokenizer.decode(model.generate(**inputs, max_new_tokens=48, do_sample=True, top_k=64)[0]))
model.save_pretrained("game_lora")
tokenizer.save_pretrained("game_lora")
print("saved: game_lora/")
