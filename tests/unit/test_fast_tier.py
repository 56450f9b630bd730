"""The fast checkpoint tier in node memory (issue 41), on one process: its folder is private and this job's alone,
its saves are committed in the checkpointer's format and a damaged one is skipped, a full tier turns into one line
and a shared-tier save, and the folder goes at the run's end. Two ranks resuming from it (node and peer copies):
tests/test_fast_tier_slurm.py; a requeue reading it: tests/test_checkpoint.py's local requeue."""

import os
import shutil
import threading
import time
import types

import pytest
import torch

from hpc.contract.launch_settings import FastTier as FastTierSettings
from hpc.errors import HpcError
from hpc.runtime.checkpoint import manifest
from hpc.runtime.checkpoint.store import CheckpointStore
from hpc.runtime.checkpoint.tiers import choice
from hpc.runtime.checkpoint.tiers.fast_tier import FastTier
from hpc.runtime.checkpoint.tiers.node_store import NodeStore, job_key
from hpc.runtime.process.training_state import TrainingState


def _tier(base, job="41", **settings) -> FastTier:
    node = NodeStore(base, job)
    node.open()
    # no optimizer: the first one made in a process imports torch's compiler (1.5 s); the format is the same
    training = TrainingState(models=[torch.nn.Linear(4, 2)])
    return FastTier(node, 0, 1, 1, training, types.SimpleNamespace(scaler=None),
                    types.SimpleNamespace(unwrap=lambda m: m), FastTierSettings(enabled=True, **settings), job)


def _meta(step: int) -> dict:
    return {"step": step, "micro_step": step, "strategy": "ddp", "loaders": []}


def _one(obj) -> list:  # the gather of a run of one process
    return [obj]


def test_the_jobs_folder_is_private_and_a_folder_not_ours_or_open_to_others_is_refused(tmp_path):
    node = NodeStore(tmp_path, "41")
    path = node.open()
    assert path.name == f"hpc-{os.getuid()}-41" and (path.stat().st_mode & 0o777) == 0o700
    path.chmod(0o755)
    with pytest.raises(HpcError, match="others can enter it"):
        node.open()
    assert node.holdings() == []  # nothing in it is read either
    path.chmod(0o700)
    stranger = NodeStore(tmp_path, "41", uid=os.getuid() + 4242)  # the same folder, seen by another user
    stranger.path = path
    with pytest.raises(HpcError, match="belongs to uid"):
        stranger.open()
    link = NodeStore(tmp_path, "42")
    link.path.symlink_to(path)
    with pytest.raises(HpcError, match="symbolic link"):
        link.open()


def test_saves_commit_in_the_checkpointers_format_and_a_damaged_newest_is_skipped(tmp_path, capsys):
    tier = _tier(tmp_path)
    outside = 0.0  # each save's call and its background half, by this test's clock
    for step in (1, 2):
        assert tier.due(step)
        started = time.monotonic()
        tier.save(step, _meta(step))
        tier.wait()
        outside += time.monotonic() - started
        tier.training.models[0].weight.data.add_(1.0)  # the next step changes the weights
    newest = tier.node.store("own", 0).step_dir(2)
    data = manifest.read(newest)
    size = sum(int(f["size"]) for f in data["files"].values())  # what `hpc submit` takes as the state a rank
    saves = tier.saves.take()
    # the writer thread's time on the two saves: within what the saves took from outside, less the loop's stall (the
    # thread may start within the save call's last lines: a GIL switch interval or two)
    assert 0 < saves["busy_s"] <= outside - saves["stall_s"] + 0.05, (saves, outside)
    saves.pop("busy_s")
    assert saves == {"step": 2, "n": 2, "stall_s": pytest.approx(tier.saves.stall_s, abs=1), "replicas": 1,
                     "bytes": size}
    assert data["format"] == "full" and data["rank"] == 0 and data["job"] == "41"
    assert manifest.check(newest, data) is None and {"model_0.pt", "rng/rank0.pt"} <= set(
        data["files"])
    assert choice.choose(tier.node, "41", 0, _one) == choice.Choice(2, newest, "node")
    weights = newest / "model_0.pt"
    raw = bytearray(weights.read_bytes())
    raw[-20] ^= 0xFF
    weights.write_bytes(bytes(raw))
    picked = choice.choose(tier.node, "41", 0, _one)
    assert picked.step == 1 and picked.tier == "node"
    assert "skipping the fast-tier checkpoint" in capsys.readouterr().err
    loaded = torch.load(picked.path / "model_0.pt", weights_only=True)
    assert torch.equal(loaded["weight"] + 2.0, tier.training.models[0].weight.data)


def test_a_save_after_a_resume_from_an_older_step_replaces_the_abandoned_later_ones(tmp_path):
    """The run went back to step 4 (the shared tier's): the fast tier's steps 5 and 6 of the attempt before are
    of a trajectory left behind. Saving step 5 again drops them; the store's purge (newest kept) then keeps the new
    step 5 instead of taking it for an old one."""
    tier = _tier(tmp_path)
    for step in (5, 6):
        tier.save(step, _meta(step))
        tier.wait()
    tier._last_step = None  # a new attempt
    tier.training.models[0].weight.data.add_(1.0)
    tier.save(5, _meta(5))
    tier.wait()
    store = tier.node.store("own", 0)
    assert [e.step for e in store.committed()] == [5] and tier.off is None and tier.fallback_due is None
    assert choice.choose(tier.node, "41", 0, _one) == choice.Choice(5, store.step_dir(5), "node")
    assert torch.equal(torch.load(store.step_dir(5) / "model_0.pt", weights_only=True)["weight"],
                       tier.training.models[0].weight.data)


def _held(node: str, *folders: tuple[int, int], world: int = 4, per_node: int = 1) -> tuple[str, list]:
    """A rank's offer: its node and the (saved rank, step) folders the node holds, saved at ``world`` with
    ``per_node`` ranks a node (a part names its node's first rank)."""
    return node, [(saved, step, world, saved - saved % per_node) for saved, step in folders]


def test_the_resume_plan_fetches_each_missing_folder_from_the_lowest_rank_holding_it():
    # ranks 0-3, a node each; rank 2's node came back empty; rank 3's own folder of step 6 is damaged only on its node
    offers = [_held("a", (0, 5), (0, 6), (3, 6)), _held("b", (1, 5), (1, 6), (0, 6)), _held("c"),
              _held("d", (2, 5), (2, 6), (3, 5), (3, 6))]
    assert choice.plan(offers) == ((6, 4), [(3, 2, 2)])
    offers[3][1].remove((2, 6, 4, 2))  # nobody holds rank 2's step 6 any more: step 5, rank 2's again from rank 3
    assert choice.plan(offers) == ((5, 4), [(3, 2, 2)])
    assert choice.plan([_held("a", (0, 1), world=2), _held("b", world=2)]) == (None, [])  # rank 1's held nowhere
    assert choice.plan([_held("a"), _held("b")]) == (None, [])


def test_the_resume_plan_at_another_world_size_reads_the_saved_ranks_it_still_has_and_the_replicated_state():
    """Folders saved at one world size serve a run at another, as the shared tier's do: rank r reads saved rank
    r's folder (its streams) and its node a folder with the replicated state; a rank new since the save, the
    replicated state alone (saved rank 0's); a node lacking one is sent it once, however many of its ranks need it."""
    # 3 nodes of 2 ranks saved step 6 at world 6, each node keeping a copy of the previous one's; node b is lost:
    # c's ranks are renumbered 2, 3, and c holds the copies of b's (saved 2 and 3) they now read
    a = _held("a", (0, 6), (1, 6), (4, 6), (5, 6), world=6, per_node=2)
    c = _held("c", (4, 6), (5, 6), (2, 6), (3, 6), world=6, per_node=2)
    assert choice.plan([a, a, c, c]) == ((6, 6), [])
    # two nodes of one rank saved at world 2; the job grows to 3 with an empty node: its rank (new since the
    # save) is sent saved rank 0's folder, with the model
    x, y = _held("x", (0, 6), (1, 6), world=2), _held("y", (1, 6), (0, 6), world=2)
    assert choice.plan([x, y, _held("z")]) == ((6, 2), [(0, 2, 0)])
    # the same on a new node of two ranks: one copy of the folder sent, to the node's lowest rank
    assert choice.plan([x, y, _held("z"), _held("z")]) == ((6, 2), [(0, 2, 0)])
    # a new node of two ranks at world 4 in place of a lost node of two (saved at 4): each rank's folder, and the
    # replicated state its part names, arrive once
    p = _held("p", (0, 6), (1, 6), (2, 6), (3, 6), per_node=2)
    assert choice.plan([p, p, _held("q"), _held("q")]) == ((6, 4), [(0, 2, 2), (0, 3, 3)])
    # an older step saved at the old world size and a newer one at the new: the newest wins
    assert choice.plan([("a", [(0, 4, 2, 0), (0, 8, 1, 0)])]) == ((8, 1), [])
    # a part whose replicated state is held nowhere is no resume point
    assert choice.plan([("a", [(1, 6, 2, 0)]), ("a", [(1, 6, 2, 0)])]) == (None, [])


def _overlapping(base) -> tuple[FastTier, torch.nn.Linear, torch.optim.Optimizer, threading.Event]:
    """A tier with overlap_copy on whose writer thread lands the deferred copy only once the returned gate is set."""
    node = NodeStore(base, "41")
    node.open()
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    model(torch.ones(1, 4)).sum().backward()
    opt.step()  # momentum buffers: optimizer state to defer as well
    tier = FastTier(node, 0, 1, 1, TrainingState(models=[model], optimizers=[opt]), types.SimpleNamespace(scaler=None),
                    types.SimpleNamespace(unwrap=lambda m: m),
                    FastTierSettings(enabled=True, overlap_copy=True), "41")
    gate, land = threading.Event(), tier._deferred.land
    tier._deferred.land = lambda: (gate.wait(10), land())[1]
    return tier, model, opt, gate


def test_an_overlapped_copy_lets_forward_and_backward_run_and_holds_the_optimizer_step_until_it_landed(tmp_path):
    tier, model, opt, gate = _overlapping(tmp_path)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    momentum = opt.state[model.weight]["momentum_buffer"].clone()
    tier.save(1, _meta(1))
    model(torch.ones(1, 4)).sum().backward()  # the next step's forward and backward: the copy is not waited for
    stepped = threading.Thread(target=opt.step)
    stepped.start()
    stepped.join(0.3)
    assert stepped.is_alive()  # the step waits in its pre-hook
    gate.set()
    stepped.join(10)
    tier.wait()
    folder = tier.node.store("own", 0).step_dir(1)
    saved = torch.load(folder / "model_0.pt", weights_only=True)
    assert all(torch.equal(saved[k], before[k]) for k in before) and not torch.equal(model.weight, before["weight"])
    saved_opt = torch.load(folder / "optimizer_0.pt", weights_only=True)
    assert torch.equal(saved_opt["state"][0]["momentum_buffer"], momentum)
    assert tier.take_saves()["stall_s"] >= 0.2  # the step's wait counts as the save's stall


def test_a_weight_changed_in_place_before_the_copy_landed_drops_that_save_and_copies_at_once_after(tmp_path, capsys):
    tier, model, opt, gate = _overlapping(tmp_path)
    tier.save(1, _meta(1))
    with torch.no_grad():
        model.weight.mul_(0.5)  # an EMA-like update of the trained weights ahead of the optimizer step
    gate.set()
    tier.wait()
    assert not tier.node.store("own", 0).step_dir(1).exists()
    assert "the fast tier's save of step 1 is dropped: 1 tensor(s)" in capsys.readouterr().err
    tier.save(2, _meta(2))  # copied on the training thread now: a change after it is no harm
    with torch.no_grad():
        copy = model.weight.clone()
        model.weight.mul_(0.5)
    tier.wait()
    saved = torch.load(tier.node.store("own", 0).step_dir(2) / "model_0.pt", weights_only=True)
    assert torch.equal(saved["weight"], copy)


def test_an_optimizer_outliving_its_tier_steps_as_before(tmp_path):
    tier, model, opt, gate = _overlapping(tmp_path)
    gate.set()
    tier.save(1, _meta(1))
    tier.wait()
    tier.close(remove=True)
    del tier
    opt.step()  # its pre-hook is gone with the tier (one returning a value would make torch raise here)


def test_a_save_that_raises_on_the_writer_thread_falls_back_and_the_writer_serves_on(tmp_path, monkeypatch):
    tier = _tier(tmp_path)
    from hpc.runtime.checkpoint.fileset import FileSet

    save = FileSet.save
    monkeypatch.setattr(FileSet, "save", lambda self, name, obj: (_ for _ in ()).throw(TypeError("cannot pickle")))
    tier.save(1, _meta(1))
    tier.wait(10)
    assert tier.fallback_due and "TypeError: cannot pickle" in tier.fallback_due
    monkeypatch.setattr(FileSet, "save", save)
    tier.fallback_due, tier._failed, tier._last_step = None, None, None
    tier.save(2, _meta(2))
    tier.wait(10)
    assert tier.node.store("own", 0).step_dir(2).joinpath("manifest.json").exists()


def test_after_a_resume_a_node_keeps_its_ranks_folders_and_the_previous_nodes_copies_up_to_the_step(tmp_path):
    """Ranks 2-3 of 4 on this node now (2 a node): it keeps own/rank-2..3 and peer/rank-0..1 up to the step resumed;
    a later step (a history left behind), the copy of its own rank 3 sent at this resume, and own/rank-0 left by
    another layout go."""
    from hpc.runtime.resilience.fast_saves import FastSaves

    tier = _tier(tmp_path)
    tier.writer, tier.local_world, tier.world = 2, 2, 4
    for kind, rank, step in [("own", 2, 6), ("own", 2, 8), ("own", 3, 6), ("peer", 0, 6), ("peer", 1, 6),
                             ("peer", 3, 6), ("own", 0, 6)]:
        folder = tier.node.store(kind, rank).step_dir(step)
        folder.mkdir(parents=True)
        manifest.commit(folder, {}, {"step": step}, fsync=False)
    saves = FastSaves.__new__(FastSaves)
    saves.fast = tier
    saves.process = types.SimpleNamespace(barrier=lambda: None, is_local_main_process=True)
    saves.settle(6)
    left = sorted(str(p.relative_to(tier.node.path)) for p in tier.node.path.glob("*/rank-*/step-*"))
    assert left == ["own/rank-2/step-6", "own/rank-3/step-6", "peer/rank-0/step-6", "peer/rank-1/step-6"]


def test_another_jobs_or_users_checkpoints_are_never_read_and_a_gone_jobs_folder_is_swept(tmp_path):
    old = _tier(tmp_path, job="40")
    old.save(3, _meta(3))
    old.wait()
    assert choice.choose(NodeStore(tmp_path, "41"), "41", 0, _one) is None  # the job's own folder only
    # a folder of ours named for this job but holding another job's manifest: not loaded
    (tmp_path / f"hpc-{os.getuid()}-40").rename(tmp_path / f"hpc-{os.getuid()}-41")
    assert choice.choose(NodeStore(tmp_path, "41"), "41", 0, _one) is None
    (tmp_path / f"hpc-{os.getuid()}-41").rename(tmp_path / f"hpc-{os.getuid()}-40")
    foreign = tmp_path / f"hpc-{os.getuid() + 4242}-7"
    foreign.mkdir(mode=0o700)
    current = NodeStore(tmp_path, "41")
    current.open()
    assert current.sweep(lambda jobs: {"40"}) == [] and old.node.path.exists()  # still running: kept
    assert current.sweep(lambda jobs: set()) == [old.node.path] and not old.node.path.exists()
    assert foreign.exists() and current.path.exists()  # another user's, and our own job's, untouched


def test_a_full_tier_writes_nothing_and_says_so_in_one_line(tmp_path, capsys, monkeypatch):
    tier = _tier(tmp_path)
    monkeypatch.setattr(tier.node, "free_bytes", lambda: 100)  # a node whose memory is taken by the job
    tier.save(1, _meta(1))
    tier.wait()
    assert tier.fallback_due and "out of node memory" in tier.fallback_due
    assert not tier.node.store("own", 0).committed() and tier.saves.step is None
    why = tier.fell_back()
    assert not tier.due(2) and tier.off == why
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "fast tier off, checkpoints go to the shared tier" in err


def test_the_folder_goes_at_the_end_and_stays_over_a_requeue(tmp_path):
    tier = _tier(tmp_path)
    tier.save(1, _meta(1))
    tier.close(remove=False)  # a requeue: the next attempt on this node reads it
    assert tier.node.store("own", 0).committed()
    tier.close(remove=True)
    assert not tier.node.path.exists()


def test_the_job_key_is_slurms_job_id_kept_over_a_requeue():
    assert job_key({"SLURM_JOB_ID": "123"}) == "123"
    assert job_key({"SLURM_JOB_ID": "123", "SLURM_ARRAY_TASK_ID": "4"}) == "123_4"
    assert job_key({"HPC_JOB_DIR": "/x/jobs/20261201-abc"}) == "20261201-abc"


def test_a_drain_copies_the_newest_into_the_shared_tier_committed_and_leaves_a_save_of_the_script_alone(tmp_path):
    (tmp_path / "node").mkdir()
    tier = _tier(tmp_path / "node", drain_steps=1)
    heard = []
    tier.drained = lambda step, folder: heard.append((step, folder))
    shared = CheckpointStore(tmp_path / "shared")
    tier.save(1, _meta(1), drain_into=shared.step_dir(1))
    tier.wait()
    data = manifest.read(shared.step_dir(1))
    assert manifest.check(shared.step_dir(1), data) is None and data["from"] == "node" and data["step"] == 1
    assert "job" not in data and "rank" not in data and data["format"] == "full"
    assert heard == [(1, shared.step_dir(1))] and shared.newest_good().step == 1
    shared.step_dir(2).mkdir()  # the script's own save_state of step 2, under way
    tier.save(2, _meta(2), drain_into=shared.step_dir(2))
    tier.wait()
    assert list(shared.step_dir(2).iterdir()) == [] and len(heard) == 1


class _Wire:
    """Two ranks in threads, each its node's memory: the gather and the fetch a resume makes (every rank calls
    both, in the same order)."""

    def __init__(self, nodes: list[NodeStore]):
        self.nodes, self.barrier, self.slots, self.sent = nodes, threading.Barrier(len(nodes)), {}, {}

    def gather(self, rank: int, obj) -> list:
        self.slots[rank] = obj
        self.barrier.wait()
        out = [self.slots[r] for r in range(len(self.nodes))]
        self.barrier.wait()
        return out

    def fetch(self, rank: int, step: int, moves: list, folder_of) -> dict:
        for holder, needer, saved in moves:
            if holder == rank:
                self.sent[(needer, saved)] = folder_of(saved).path
        self.barrier.wait()
        got = {}
        for _, needer, saved in moves:
            if needer == rank:
                into = self.nodes[rank].store("peer", saved).step_dir(step)
                shutil.copytree(self.sent[(needer, saved)], into)
                got[saved] = into
        self.barrier.wait()
        return got


def _two_nodes_saved(base, steps=(1, 2)) -> list[NodeStore]:
    """Ranks 0 and 1 of a run of 2 (a node each) saved ``steps``; each node keeps a copy of the other's folders."""
    nodes = []
    for rank in (0, 1):
        node = NodeStore(base / f"node{rank}", "41")
        (base / f"node{rank}").mkdir()
        node.open()
        tier = FastTier(node, rank, 2, 1, TrainingState(models=[torch.nn.Linear(4, 2)]),
                        types.SimpleNamespace(scaler=None), types.SimpleNamespace(unwrap=lambda m: m),
                        FastTierSettings(enabled=True), "41")
        for step in steps:
            tier.save(step, _meta(step))
            tier.wait()
        nodes.append(node)
    for rank, node in enumerate(nodes):
        for step in steps:
            shutil.copytree(node.store("own", rank).step_dir(step), nodes[1 - rank].store("peer", rank).step_dir(step))
    return nodes


def _resume(nodes: list[NodeStore], world: int) -> list:
    wire, out = _Wire(nodes), [None] * len(nodes)

    def one(rank):
        out[rank] = choice.choose(nodes[rank], "41", rank, lambda o: wire.gather(rank, o), world,
                                  lambda s, m, f: wire.fetch(rank, s, m, f))

    threads = [threading.Thread(target=one, args=(r,)) for r in range(len(nodes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def test_a_damaged_folder_is_fetched_from_the_node_that_kept_a_good_copy_not_the_step_given_up(tmp_path, capsys):
    nodes = _two_nodes_saved(tmp_path)
    damaged = nodes[0].store("own", 0).step_dir(2) / "model_0.pt"
    raw = bytearray(damaged.read_bytes())
    raw[-20] ^= 0xFF
    damaged.write_bytes(bytes(raw))
    first, second = _resume(nodes, 2)
    assert "skipping the fast-tier checkpoint" in capsys.readouterr().err
    # rank 0 reads step 2 all the same: node 1's copy of its folder, sent over (before: step 1, a step trained again)
    assert (first.step, first.tier) == (2, "peer") and first.path == nodes[0].store("peer", 0).step_dir(2)
    assert (second.step, second.tier, second.path) == (2, "peer", nodes[1].store("own", 1).step_dir(2))
    assert manifest.check(first.path, manifest.read(first.path)) is None


def test_after_a_lost_node_the_survivor_alone_reads_the_lost_ranks_folders_its_node_kept(tmp_path, capsys):
    """An elastic shrink: node 0 is gone and node 1's rank is rank 0 of a world of 1. It reads saved rank 0's
    folder, the copy node 1 kept (rank 0's streams, the model), with a line saying the world size changed."""
    nodes = _two_nodes_saved(tmp_path)
    (only,) = _resume(nodes[1:], 1)
    assert (only.step, only.tier, only.path, only.part) == (2, "peer", nodes[1].store("peer", 0).step_dir(2), None)
    assert "step 2 was saved at world size 2, this run has 1" in capsys.readouterr().err


class _Shards:
    """A sharded model's format as the fast tier sees it: this rank's shards, and the layout they fit."""

    def __init__(self, layout: str):
        self.layout = layout

    def local_state(self, models, optimizers) -> dict:
        return {"model_0.pt": {"w": torch.ones(2, 3)}, "optimizer_0.pt": {"state": {}, "param_groups": []}}

    def local_layout(self, models, optimizers) -> str:
        return self.layout


def test_a_sharded_models_folders_are_read_only_by_a_run_of_the_same_layout(tmp_path):
    """Each rank's own shards (format "shard") fit one layout: a run of another (another mesh or model at the
    same world size) or a run of replicated state (DDP after FSDP) does not read them; the shared tier does."""
    node = NodeStore(tmp_path, "41")
    node.open()
    tier = FastTier(node, 0, 1, 1, TrainingState(models=[torch.nn.Linear(4, 2)]), types.SimpleNamespace(scaler=None),
                    types.SimpleNamespace(unwrap=lambda m: m), FastTierSettings(enabled=True), "41",
                    shards=_Shards("L1"))
    tier.save(3, _meta(3))
    tier.wait()
    folder = node.store("own", 0).step_dir(3)
    data = manifest.read(folder)
    assert (data["format"], data["layout"], sorted(data["files"])) == (
        "shard", "L1", ["model_0.pt", "optimizer_0.pt", "rng/rank0.pt"])
    assert choice.choose(node, "41", 0, _one, 1, layout="L1") == choice.Choice(3, folder, "node")
    assert choice.choose(node, "41", 0, _one, 1, layout="L2") is None
    assert choice.choose(node, "41", 0, _one, 1) is None  # a run of replicated state
    assert choice.choose(node, "41", 0, _one, 2, layout="L1") is None  # another world size
