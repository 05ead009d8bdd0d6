"""TRL 1.16 equivalent of examples/custom_advantage.py: configs/main.yaml's task, model and GRPO
settings, 10 steps, a graded reward (the right name 1, a well-formed <answer> tag 0.1), and
pairwise-rank advantages instead of GRPO's.

    python benchmarks/trl_equivalents/custom_advantage.py [--max_steps 1 ...]   # GRPOConfig flags
"""

import re

import reasoning_gym
import torch
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


def exact_name(completions, answer, **kwargs) -> list[float]:
    """reinforge's exact_match on the last <answer> tag: case, spaces and a final period forgiven."""
    norm = lambda s: " ".join(s.split()).rstrip(".").lower()  # noqa: E731
    found = [ANSWER.findall(c[0]["content"]) for c in completions]
    return [float(bool(a) and norm(a[-1]) == norm(gold)) for a, gold in zip(found, answer)]


def well_formed(completions, **kwargs) -> list[float]:
    """reinforge's format verifier: exactly one non-empty <answer>...</answer>."""
    texts = [c[0]["content"] for c in completions]
    return [float(t.count("<answer>") == t.count("</answer>") == 1 and any(a.strip() for a in ANSWER.findall(t)))
            for t in texts]


class RankGRPOTrainer(GRPOTrainer):
    """TRL 1.16 computes GRPO's advantages inline in _generate_and_score_completions (no method to
    override): keep the rewards it gathers, then replace the advantages it returns."""

    def _calculate_rewards(self, *args, **kwargs):
        self._rewards = super()._calculate_rewards(*args, **kwargs)  # [all processes' rows, reward funcs]
        return self._rewards

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        r = (self._rewards * self.reward_weights.to(self._rewards.device)).nansum(1)
        g = self.num_generations if self.model.training else self.num_generations_eval
        group = torch.arange(len(r), device=r.device) // g  # a prompt's rows are consecutive
        same = group[:, None] == group[None, :]
        adv = ((r[:, None] - r[None, :]).sign() * same).sum(1) / (same.sum(1) - 1).clamp(min=1)
        n = len(out["advantages"])  # this process's slice
        out["advantages"] = adv[self.accelerator.process_index * n:][:n]
        return out


if __name__ == "__main__":
    parser = HfArgumentParser(GRPOConfig)
    parser.set_defaults(  # configs/main.yaml: 8 prompts x 8 samples a step, in 4 micro-batches
        output_dir="runs/trl_custom_advantage", max_steps=10, per_device_train_batch_size=16,
        gradient_accumulation_steps=4, num_generations=8, max_completion_length=12, temperature=0.7,
        learning_rate=2e-5, lr_scheduler_type="constant", adam_beta2=0.99, max_grad_norm=1.0, beta=0.0,
        loss_type="dapo", epsilon_high=0.28, bf16=False, gradient_checkpointing=False, reward_weights=[1.0, 0.1],
        num_generations_eval=1, per_device_eval_batch_size=10, save_strategy="no", logging_steps=1, report_to="none")
    (args,) = parser.parse_args_into_dataclasses()
    trainer = RankGRPOTrainer(str(default_model_path()), reward_funcs=[exact_name, well_formed], args=args,
                              train_dataset=needle_haystack(0, 3000), eval_dataset=needle_haystack(1_000_003, 50))
    before = trainer.evaluate()  # sampled at the training temperature: TRL has no greedy evaluation
    trainer.train()
    after = trainer.evaluate()
    trainer.save_model()
    key = "eval_rewards/exact_name/mean"
    print(f"run: {args.output_dir}; held-out accuracy (sampled) {before[key]:.3f} -> {after[key]:.3f}")
