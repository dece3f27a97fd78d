"""Checkpoints: full round trip (weights, optimizer, scheduler, RNG, method state) and atomicity."""

import json
import random

import numpy as np
import pytest
import torch

from components.training import checkpoint as ckpt_mod
from components.training.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from components.training.model import LoRASettings, build_policy
from components.training.tiny import tiny_qwen2


def _objects(seed=0, lora=True):
    torch.manual_seed(seed)
    policy = build_policy(tiny_qwen2(12, seed=1), lora=LoRASettings(r=2, alpha=4) if lora else None)
    opt = torch.optim.AdamW(policy.trainable_parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (s + 1))
    return policy, opt, sched


def _train_a_bit(policy, opt, sched, steps=2):
    ids = torch.tensor([[2, 3, 4, 5, 6]])
    for _ in range(steps):
        opt.zero_grad()
        policy.model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        sched.step()


def _trainable(policy):
    return {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("lora", [True, False])
def test_round_trip_restores_everything(tmp_path, lora):
    policy, opt, sched = _objects(lora=lora)
    _train_a_bit(policy, opt, sched)
    random.seed(5)
    np.random.seed(6)
    torch.manual_seed(7)

    class Bank:
        def write(self, folder):
            (folder / "bank.jsonl").write_text('{"rubric": "cite the source"}\n')

    path = save_checkpoint(
        tmp_path,
        2,
        model=policy.model,
        optimizer=opt,
        scheduler=sched,
        trainer_state={"data": {"epoch": 1, "cursor": 3}, "history": [{"loss": 0.25}]},
        method_state={"memory": ["a", "b"]},
        method_files=Bank().write,
    )
    after_save = (random.random(), float(np.random.rand()), torch.rand(1).item())
    weights = _trainable(policy)
    opt_state = opt.state_dict()

    fresh, fresh_opt, fresh_sched = _objects(seed=99, lora=lora)
    assert any(not torch.equal(weights[n], p) for n, p in _trainable(fresh).items())
    got = load_checkpoint(tmp_path, model=fresh.model, optimizer=fresh_opt, scheduler=fresh_sched)
    assert got.path == path and got.step == 2
    assert (random.random(), float(np.random.rand()), torch.rand(1).item()) == after_save
    for n, p in _trainable(fresh).items():
        assert torch.equal(weights[n], p), n
    for k, v in opt_state["state"].items():
        for name, t in v.items():
            assert torch.equal(fresh_opt.state_dict()["state"][k][name], t)
    assert fresh_sched.state_dict()["last_epoch"] == 2
    assert fresh_opt.param_groups[0]["lr"] == pytest.approx(1e-2 / 3)
    assert got.trainer_state["data"] == {"epoch": 1, "cursor": 3}
    assert got.trainer_state["history"] == [{"loss": 0.25}]
    assert got.method_state == {"memory": ["a", "b"]}
    assert (got.method_dir / "bank.jsonl").read_text().startswith('{"rubric"')


def test_crash_mid_save_keeps_previous_checkpoint(tmp_path, monkeypatch):
    policy, opt, sched = _objects()
    save_checkpoint(
        tmp_path, 1, model=policy.model, optimizer=opt, scheduler=sched, trainer_state={"history": [1]}
    )
    weights_1 = _trainable(policy)
    _train_a_bit(policy, opt, sched)

    real = ckpt_mod._write_json

    def crash(path, obj):
        if path.name == "trainer_state.json":
            raise OSError("disk full")
        real(path, obj)

    monkeypatch.setattr(ckpt_mod, "_write_json", crash)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(
            tmp_path, 2, model=policy.model, optimizer=opt, scheduler=sched, trainer_state={"history": [1, 2]}
        )
    monkeypatch.undo()

    assert (tmp_path / "latest").read_text().strip() == "step_000001"
    assert latest_checkpoint(tmp_path) == tmp_path / "step_000001"
    assert not (tmp_path / "step_000002").exists()
    assert not list(tmp_path.glob(".tmp-*"))
    fresh, fresh_opt, fresh_sched = _objects(seed=3)
    got = load_checkpoint(tmp_path, model=fresh.model, optimizer=fresh_opt, scheduler=fresh_sched)
    assert got.step == 1 and got.trainer_state["history"] == [1]
    for n, p in _trainable(fresh).items():
        assert torch.equal(weights_1[n], p), n


def test_crash_during_pointer_update_keeps_old_pointer(tmp_path, monkeypatch):
    policy, _, _ = _objects()
    save_checkpoint(tmp_path, 1, model=policy.model)

    def crash(root, name):
        raise KeyboardInterrupt

    monkeypatch.setattr(ckpt_mod, "_point_latest", crash)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 2, model=policy.model)
    assert latest_checkpoint(tmp_path) == tmp_path / "step_000001"


def test_leftover_temp_folder_is_ignored_and_cleaned(tmp_path):
    policy, _, _ = _objects()
    save_checkpoint(tmp_path, 1, model=policy.model)
    junk = tmp_path / ".tmp-step_000002-deadbeef"
    (junk / "weights").mkdir(parents=True)
    assert latest_checkpoint(tmp_path) == tmp_path / "step_000001"
    save_checkpoint(tmp_path, 2, model=policy.model)
    assert not junk.exists()
    assert latest_checkpoint(tmp_path) == tmp_path / "step_000002"


def test_folder_without_manifest_or_with_changed_file_is_refused(tmp_path):
    policy, _, _ = _objects()
    path = save_checkpoint(tmp_path, 1, model=policy.model, trainer_state={"history": []})
    state = path / "trainer_state.json"
    state.write_text(json.dumps({"step": 1, "history": [{"loss": 999}]}))
    with pytest.raises(ValueError, match="differs"):
        load_checkpoint(path, model=policy.model)
    (path / "manifest.json").unlink()
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path, model=policy.model)


def test_keep_last_prunes_old_checkpoints(tmp_path):
    policy, _, _ = _objects()
    for step in (1, 2, 3, 4):
        save_checkpoint(tmp_path, step, model=policy.model, keep_last=2)
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_000003", "step_000004"]
    assert latest_checkpoint(tmp_path) == tmp_path / "step_000004"


def test_adapter_that_does_not_fit_is_refused(tmp_path):
    policy, _, _ = _objects()
    save_checkpoint(tmp_path, 1, model=policy.model)
    other = build_policy(tiny_qwen2(12, seed=1), lora=LoRASettings(r=2, alpha=4, target_modules=("q_proj",)))
    with pytest.raises(ValueError, match="does not fit"):
        load_checkpoint(tmp_path, model=other.model)
