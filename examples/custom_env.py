"""A multi-turn tool-using environment written in the training script: SmolLM2-135M-Instruct
multiplies two 3-4 digit numbers (reasoning-gym `products`), which it cannot do in its head, by
calling the `multiply` tool below, reading the result and answering.

    python examples/custom_env.py                     # about 7 min on a 2-core CPU
    python examples/custom_env.py trainer.steps=10 rollout.num_samples=8   # key=value overrides
"""

import sys

import reinforge


def multiply(a: int, b: int) -> int:
    """Multiply two integers exactly.

    Args:
        a: the first factor
        b: the second factor
    """
    return a * b


class MultiplyEnv(reinforge.ToolEnv):
    """Runs each turn's tool calls and returns their results; a turn without a call is the final
    answer. Each invalid call (bad JSON, unknown tool, wrong arguments) costs 0.1."""

    def step(self, message):
        result = super().step(message)
        result.reward = -0.1 * result.info.get("invalid_calls", 0)
        return result


@reinforge.register_env("multiply_tool")
def multiply_env(task, *, max_turns: int | None = None):
    """One environment per trajectory (called by the agent loop with the run's task)."""
    return MultiplyEnv([multiply], max_turns=max_turns, timeout_s=1.0)


CONFIG = {
    "model": {"path": "smollm2-135m-instruct"},
    "task": {
        "source": "reasoning_gym", "name": "products",
        "options": {"min_terms": 2, "max_terms": 2, "min_digits": 3, "max_digits": 4},
        "system_prompt": "Use the multiply tool for arithmetic instead of computing in your head.",
        "prompt_suffix": "\nCall the tool, then reply with the final number alone.",
        # one solved first turn shows the call format (SmolLM2's template has no tool support, so
        # reinforge describes the tool in the system message)
        "few_shot": [{"user": "Solve the following multiplication: 21 * 34. Give only the result as your final answer.",
                      "assistant": '<tool_call>{"name": "multiply", "arguments": {"a": 21, "b": 34}}</tool_call>'}],
        "eval_size": 30,
    },
    # The factory itself rather than its registered name "multiply_tool": config.yaml then records
    # it as ".../custom_env.py:multiply_env", which `reinforge reproduce` can load in a fresh process.
    # Up to 3 turns (a call, the result, the answer), 192 tokens in all.
    "env": {"name": multiply_env, "max_turns": 3, "max_tokens": 192, "truncated_reward": 0.0},
    "reward": {"answer_format": "last_line", "verifiers": [{"name": "exact_match"}]},  # on the final turn
    "rollout": {"num_samples": 4, "temperature": 0.7, "max_new_tokens": 48},
    "algorithm": {"loss_agg": "token_mean", "kl_coef": 0.0},
    "learner": {"lr": 1.0e-5},
    "trainer": {"steps": 6, "prompts_per_step": 4, "eval_every": 6, "checkpoint_every": 0},
}

# Training stays under the guard: a later process that loads this file by name (to find
# multiply_env again) must not start another run.
if __name__ == "__main__":
    result = reinforge.Trainer(reinforge.build_config(CONFIG, sys.argv[1:])).run()
    print(f"run: {result.run_dir} ({result.steps_done} steps)")
    acc, verdict = result.summary.get("heldout_accuracy"), result.summary.get("verdict")
    if acc:  # the same held-out prompts before and after, greedy; summary.md has the details
        print(f"held-out success {acc['before']:.3f} -> {acc['after']:.3f}"
              + (f"; {verdict['text']}" if verdict else ""))
