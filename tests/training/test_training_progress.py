"""Long training stages show progress: the trainers' ``train(progress=...)`` draws a bar of steps (with the loss or
mean reward and the time left) on stderr, counting from where a resumed run starts; without a name, nothing."""

import torch

from components.training.model import LoRASettings, build_policy
from components.training.params import GRPOParams, SFTParams
from components.training.sft.examples import SFTExample
from components.training.sft.trainer import SFTTrainer
from components.training.tiny import CharTokenizer, tiny_qwen2

TOK = CharTokenizer("abcdefgh")


def sft_trainer(tmp_path):
    torch.manual_seed(0)
    policy = build_policy(tiny_qwen2(TOK.vocab_size, seed=0), lora=LoRASettings(r=2, alpha=4))
    examples = [SFTExample([2, 3, 4, 5], [0, 1, 1, 1]), SFTExample([3, 4, 5], [0, 1, 1])]
    return SFTTrainer(policy, examples, SFTParams(batch_size=1, epochs=3), pad_token_id=0, seed=0,
                      checkpoint_dir=tmp_path)


def test_sft_progress_counts_steps_from_a_resumed_start(tmp_path, capsys):
    first = sft_trainer(tmp_path)
    first.train(2)
    first.save()
    assert capsys.readouterr().err == ""  # no name, no bar
    resumed = sft_trainer(tmp_path)
    assert resumed.resume()
    resumed.train(progress="sft (sft)")
    err = capsys.readouterr().err
    assert "sft (sft)" in err and "6/6" in err and "2/6" in err and "loss=" in err


def test_grpo_progress_names_the_run_and_shows_the_reward(capsys):
    from components.training.engines.rollout import HFRolloutEngine
    from components.training.grpo.trainer import GRPOTrainer

    torch.manual_seed(0)
    policy = build_policy(tiny_qwen2(TOK.vocab_size, seed=0), lora=LoRASettings(r=2, alpha=4))
    config = GRPOParams(group_size=2, prompts_per_step=1, max_new_tokens=3, steps=2)
    trainer = GRPOTrainer(policy, HFRolloutEngine(policy.model, TOK), lambda eps, ctx: [float(len(e.text)) for e in eps],
                          ["ab", "cd"], config)
    trainer.train(2, progress="train_policy@grpo")
    err = capsys.readouterr().err
    assert "train_policy@grpo" in err and "2/2" in err and "reward=" in err
