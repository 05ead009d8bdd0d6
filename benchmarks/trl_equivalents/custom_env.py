"""TRL 1.16 equivalent of examples/custom_env.py: reasoning-gym products answered over several
turns with a `multiply` tool, GRPOTrainer's tool-calling loop (`tools=`).

    python benchmarks/trl_equivalents/custom_env.py [--max_steps 1 ...]   # GRPOConfig flags
"""

import reasoning_gym
from datasets import Dataset
from transformers import AutoTokenizer, HfArgumentParser
from trl import GRPOConfig, GRPOTrainer
from trl.chat_template_utils import qwen2_5_chat_template

from reinforge.models import default_model_path  # SmolLM2-135M-Instruct as an HF folder

SUFFIX = "\nCall the tool, then reply with the final number alone."
SHOT = [{"role": "system", "content": "Use the multiply tool for arithmetic instead of computing in your head."},
        {"role": "user", "content": "Solve the following multiplication: 21 * 34. Give only the result as your "
                                    "final answer." + SUFFIX},
        {"role": "assistant",
         "content": '<tool_call>{"name": "multiply", "arguments": {"a": 21, "b": 34}}</tool_call>'}]


def multiply(a: int, b: int) -> int:
    """Multiply two integers exactly.

    Args:
        a: the first factor
        b: the second factor
    """
    return a * b


def products(seed: int, size: int) -> Dataset:
    """examples/custom_env.py's prompts: training from seed 0, held-out from reinforge's eval seed."""
    items = reasoning_gym.create_dataset("products", seed=seed, size=size, min_terms=2, max_terms=2,
                                         min_digits=3, max_digits=4)
    return Dataset.from_list([{"prompt": SHOT + [{"role": "user", "content": x["question"] + SUFFIX}],
                               "answer": x["answer"]} for x in items])


def final_answer(completions, answer, **kwargs) -> list[float]:
    """1 when the last line of the final assistant turn is the product (a trajectory cut after a
    tool result has no final turn: 0)."""
    last = [c[-1]["content"].strip().splitlines() if c[-1]["role"] == "assistant" else [] for c in completions]
    return [float(bool(lines) and lines[-1].strip().rstrip(".") == gold) for lines, gold in zip(last, answer)]


def invalid_calls(completions, **kwargs) -> list[float]:
    """-0.1 for each tool call that failed (unknown tool, wrong arguments): TRL returns {'error': ...}."""
    return [-0.1 * sum(m["role"] == "tool" and str(m["content"]).startswith("{'error'") for m in c)
            for c in completions]


if __name__ == "__main__":
    parser = HfArgumentParser(GRPOConfig)
    parser.set_defaults(  # 4 prompts x 4 trajectories a step, in 2 micro-batches; 3 model turns at most
        output_dir="runs/trl_custom_env", max_steps=6, per_device_train_batch_size=8, gradient_accumulation_steps=2,
        num_generations=4, max_completion_length=192, max_tool_calling_iterations=2, temperature=0.7,
        learning_rate=1e-5, lr_scheduler_type="constant", adam_beta2=0.99, max_grad_norm=1.0, beta=0.0,
        loss_type="dapo", bf16=False, gradient_checkpointing=False, num_generations_eval=1,
        per_device_eval_batch_size=10, save_strategy="no", logging_steps=1, report_to="none")
    (args,) = parser.parse_args_into_dataclasses()
    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    # SmolLM2's chat template ignores tools, which TRL refuses; Qwen2.5's is ChatML with the tools
    # in the system message and <tool_call> JSON, which TRL knows how to parse
    tokenizer.chat_template = qwen2_5_chat_template
    trainer = GRPOTrainer(str(default_model_path()), reward_funcs=[final_answer, invalid_calls], args=args,
                          processing_class=tokenizer, tools=[multiply],
                          train_dataset=products(0, 5000), eval_dataset=products(1_000_003, 30))
    before = trainer.evaluate()  # sampled at the training temperature: TRL has no greedy evaluation
    trainer.train()
    after = trainer.evaluate()
    trainer.save_model()
    key = "eval_rewards/final_answer/mean"
    print(f"run: {args.output_dir}; held-out success (sampled) {before[key]:.3f} -> {after[key]:.3f}")
