"""TRL 1.16 equivalent of examples/custom_reward.py: configs/main.yaml's task, model and GRPO
settings, 10 steps, scored by the same reward function, with GRPOTrainer.

    python benchmarks/trl_equivalents/custom_reward.py [--max_steps 1 ...]   # GRPOConfig flags
"""

import re

import reasoning_gym
from datasets import Dataset
from transformers import HfArgumentParser
from trl import GRPOConfig, GRPOTrainer

from reinforge.models import default_model_path  # SmolLM2-135M-Instruct as an HF folder

ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)
SUFFIX = "\nGive only the final answer inside <answer></answer> tags."
SHOT = [{"role": "user", "content": "Ann likes tea. Bo hates rain. \nWho hates rain? Reply only with a name." + SUFFIX},
        {"role": "assistant", "content": "<answer>Bo</answer>"}]


def needle_haystack(seed: int, size: int) -> Dataset:
    """configs/main.yaml's prompts: training from seed 0, held-out from reinforge's eval seed."""
    items = reasoning_gym.create_dataset("needle_haystack", seed=seed, size=size,
                                         min_num_statements=10, max_num_statements=10)
    return Dataset.from_list([{"prompt": SHOT + [{"role": "user", "content": x["question"] + SUFFIX}],
                               "answer": x["answer"]} for x in items])


def name_reward(completions, answer, log_metric, **kwargs) -> list[float]:
    """1 for the right name in <answer> tags, plus 0.1 for exactly one non-empty tag."""
    rewards, right = [], 0
    for completion, gold in zip(completions, answer):
        answers = ANSWER.findall(completion[0]["content"])
        correct = bool(answers) and answers[-1].strip().lower() == gold.lower()
        right += correct
        rewards.append(float(correct) + 0.1 * (len(answers) == 1 and answers[0].strip() != ""))
    log_metric("accuracy", right / len(rewards))  # TRL has no verdict besides the reward: log it
    return rewards


if __name__ == "__main__":
    parser = HfArgumentParser(GRPOConfig)
    parser.set_defaults(  # configs/main.yaml: 8 prompts x 8 samples a step, in 4 micro-batches
        output_dir="runs/trl_custom_reward", max_steps=10, per_device_train_batch_size=16,
        gradient_accumulation_steps=4, num_generations=8, max_completion_length=12, temperature=0.7,
        learning_rate=2e-5, lr_scheduler_type="constant", adam_beta2=0.99, max_grad_norm=1.0, beta=0.0,
        loss_type="dapo", epsilon_high=0.28, bf16=False, gradient_checkpointing=False, num_generations_eval=1,
        per_device_eval_batch_size=10, save_strategy="no", logging_steps=1, report_to="none")
    (args,) = parser.parse_args_into_dataclasses()
    trainer = GRPOTrainer(str(default_model_path()), reward_funcs=name_reward, args=args,
                          train_dataset=needle_haystack(0, 3000), eval_dataset=needle_haystack(1_000_003, 50))
    before = trainer.evaluate()  # sampled at the training temperature: TRL has no greedy evaluation
    trainer.train()
    after = trainer.evaluate()
    trainer.save_model()
    print(f"run: {args.output_dir}; held-out accuracy (sampled) {before['eval_accuracy']:.3f} -> "
          f"{after['eval_accuracy']:.3f}")
