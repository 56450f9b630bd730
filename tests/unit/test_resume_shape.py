"""A job resumed in another shape (world size, per-rank batch, split_batches) goes on at the same sample of its
epoch: what the first shape trained and what the second trains are the epoch, each sample once.

Ranks are simulated in this process (as in test_data_loading): each rank's loader of a pretend world takes its
batches alone. The point a checkpoint records comes from rank 0's loader, as in a real save.
"""

import collections

import pytest
import torch
from torch.utils.data import DataLoader

from hpc.errors import HpcError
from hpc.runtime.data.position import EpochPoint, Shape
from hpc.runtime.data.prepare import SkipFirstBatches
from hpc.runtime.process.training_state import TrainingState
from tests.unit.test_data_loading import Reversed, SizedStream, UnevenBatches, simulated_rank

N = 64


def sizes(batch):
    return lambda: DataLoader(torch.arange(N), batch_size=batch)


KINDS = {  # each: batch size -> loader
    "sequential": lambda bs: DataLoader(torch.arange(N), batch_size=bs),
    "shuffle": lambda bs: DataLoader(torch.arange(N), batch_size=bs, shuffle=True),
    "loader generator": lambda bs: DataLoader(torch.arange(N), batch_size=bs, shuffle=True,
                                              generator=torch.Generator().manual_seed(5)),
    "reversed sampler": lambda bs: DataLoader(torch.arange(N), batch_size=bs, sampler=Reversed(N)),
    "list sampler": lambda bs: DataLoader(torch.arange(N), batch_size=bs, sampler=list(range(N - 1, -1, -2))
                                          + list(range(0, N, 2))),
    "stream": lambda bs: DataLoader(SizedStream(N), batch_size=bs),
}

# (world before, world after) and how the batch is held fixed: "rank" (each rank's batch 4), "global" (16 in all,
# so each rank's is 16 / world), "split" (split_batches, a global batch of 16)
CHANGES = [(2, 1), (2, 4), (4, 2), (1, 2)]
BATCHES = ["rank", "global", "split"]


def loader_batch(mode, world):
    return {"rank": 4, "global": 16 // world, "split": 16}[mode]


def trained(kind, world, mode, rounds=None, start=None, epoch=1, **config):
    """Every rank's samples of epoch `epoch` (the first `rounds` batches each, or all from `start`), and rank 0's
    point after them."""
    config = {"dispatch_batches": False, "split_batches": mode == "split", **config}
    make = lambda: KINDS[kind](loader_batch(mode, world))  # noqa: E731
    seen, point = [], None
    for rank in range(world):
        dl, _ = simulated_rank(make, rank, world, **config)
        if start is None:
            for _ in dl:  # the epochs before, as the job trained them
                pass
            dl.set_epoch(epoch)
        else:
            dl.continue_from(start)
        it = iter(dl)
        for i, batch in enumerate(it):
            seen += batch.tolist()
            if rounds is not None and i + 1 == rounds:
                break
        if rank == 0:
            point = dl.point()
    return seen, point


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("change", CHANGES, ids=lambda c: f"{c[0]}to{c[1]}")
@pytest.mark.parametrize("mode", BATCHES)
def test_a_resume_in_another_shape_trains_every_sample_of_the_epoch_once(kind, change, mode):
    before, after = change
    first, point = trained(kind, before, mode, rounds=3, even_batches=False)
    assert point.consumed == len(first) and point.epoch == 1
    rest, _ = trained(kind, after, mode, start=point, even_batches=False)
    assert sorted(first + rest) == list(range(N))


@pytest.mark.parametrize("kind", ["shuffle", "list sampler", "stream"])
@pytest.mark.parametrize("change,mode", [((2, 4), "rank"), ((4, 3), "rank"), ((3, 5), "rank"), ((2, 4), "split"),
                                         ((4, 8), "split")], ids=lambda c: f"{c[0]}to{c[1]}" if len(c) == 2 else c)
def test_with_even_batches_the_remainder_a_new_shape_cannot_divide_is_cut_short_and_even(kind, change, mode):
    """A straight run at the new shape would fill its final round up to full batches from the epoch's start
    (even_batches, as Accelerate's). Entered mid-epoch from another shape, the remainder differs: the final round
    gives every rank the same shorter batch, and fewer samples than ranks are trained twice."""
    before, after = change
    first, point = trained(kind, before, mode, rounds=2)
    config = {"dispatch_batches": False, "split_batches": mode == "split"}
    rest, lengths, remainders, last_round = [], set(), set(), 0
    for rank in range(after):
        dl, acc = simulated_rank(lambda: KINDS[kind](loader_batch(mode, after)), rank, after, **config)
        dl.continue_from(point)
        batches = [(b.tolist(), acc.gradient_state.remainder) for b in dl]
        rest += [i for b, _ in batches for i in b]
        lengths.add(len(batches))
        remainders.add(batches[-1][1])
        last_round += len(batches[-1][0])
    counts = collections.Counter(first + rest)
    assert set(counts) == set(range(N))
    repeated = sum(counts.values()) - N
    assert repeated < after, repeated
    assert len(lengths) == 1  # every rank as many batches
    assert remainders == {last_round - repeated}  # gather_for_metrics drops the repeated ones


def test_a_batch_size_that_does_not_divide_the_point_cuts_the_batches_from_there():
    """Saved at world 3 after 2 rounds of 4 (24 samples); resumed at world 2 with batches of 5: 24 is no multiple of
    10, and the epoch goes on at sample 24 all the same."""
    make = lambda world, bs: lambda: DataLoader(torch.arange(N), batch_size=bs, shuffle=True)  # noqa: E731
    seen, point = [], None
    for rank in range(3):
        dl, _ = simulated_rank(make(3, 4), rank, 3, even_batches=False, dispatch_batches=False)
        it = iter(dl)
        seen += next(it).tolist() + next(it).tolist()
        point = point or dl.point()
    assert point.consumed == 24
    for rank in range(2):
        dl, _ = simulated_rank(make(2, 5), rank, 2, even_batches=False, dispatch_batches=False)
        dl.continue_from(point)
        assert len(dl) == 7 - rank  # the epoch's length in this shape (13 batches), whatever the point
        seen += [i for b in dl for i in b.tolist()]
    assert sorted(seen) == list(range(N))


def test_a_stream_that_its_new_batch_size_cannot_reach_is_refused_in_one_line():
    point = EpochPoint(0, 12, "sample", Shape(3, 4, False))
    dl, _ = simulated_rank(lambda: DataLoader(SizedStream(N), batch_size=8), 0, 2, dispatch_batches=False)
    with pytest.raises(HpcError) as e:
        dl.continue_from(point)
    assert "after 12 samples" in str(e.value) and "batches of 8" in str(e.value) and "\n" not in str(e.value)


def test_a_batch_sampler_is_counted_in_its_own_batches():
    make = lambda: DataLoader(torch.arange(12), batch_sampler=UnevenBatches())  # noqa: E731
    dl, _ = simulated_rank(make, 0, 2, even_batches=False, dispatch_batches=False)
    it = iter(dl)
    next(it)
    point = dl.point()
    assert (point.unit, point.consumed) == ("item", 2)  # one round of world 2: the sampler's first two batches
    rest = []
    for rank in range(3):
        dl, _ = simulated_rank(make, rank, 3, even_batches=False, dispatch_batches=False)
        dl.continue_from(point)
        rest += [b.tolist() for b in dl]
    assert sorted(rest) == sorted([[5], [6, 7], [8, 9, 10], [11]])


def test_a_checkpoint_of_an_earlier_hpc_is_read_in_the_world_it_was_saved_at():
    shape = Shape(1, 4, False)
    point = EpochPoint.from_state({"epoch": 2, "position": 3}, "sample", shape, saved_world=2)
    assert (point.epoch, point.consumed, point.shape.world) == (2, 24, 2)


# --- which batches count as trained: the script's save point ---------------------------------------------
def loader_of_a_run(world=2, rank=0):
    training = TrainingState()
    training.optimizers.append(object())  # a run that trains
    dl, _ = simulated_rank(sizes(4), rank, world, dispatch_batches=False)
    dl.training = training
    training.loaders.append(dl)
    return dl, training


def step(training: TrainingState) -> None:
    """The optimizer's step at the end of a window (AcceleratedOptimizer.step tells the training state)."""
    training.optimizer_stepped(training.optimizers[0])


def test_a_batch_fetched_but_not_yet_trained_is_not_counted():
    """`for i, b in enumerate(dl): if i == K: save_state(); break` and `if step % N == 0: save_state()` at the top of
    the loop save after fetching batch K and before training it: the checkpoint holds K batches, not K + 1."""
    dl, training = loader_of_a_run()
    for i, _ in enumerate(dl):
        if i == 3:
            break
        step(training)
    assert dl.position == 4 and dl.point().consumed == 3 * 8
    step(training)  # ... and once the script trains it, it counts
    assert dl.point().consumed == 4 * 8


def test_a_save_after_the_step_counts_the_batch_just_trained():
    dl, training = loader_of_a_run()
    it = iter(dl)
    for _ in range(5):
        next(it)
        step(training)
    assert dl.point().consumed == 5 * 8


def test_a_save_inside_an_accumulation_window_goes_back_to_the_windows_start():
    """Accumulation 2, saved after micro-batch 3 (its backward done, no step yet): the window's gradients are in no
    checkpoint, so the point and the micro-step are those of the last step, and the window is trained again."""
    dl, training = loader_of_a_run()
    it = iter(dl)
    for micro in range(1, 4):
        next(it)
        training.micro_step = micro
        if micro % 2 == 0:
            step(training)
    assert dl.point().consumed == 2 * 8 and training.saved_micro_step == 2
    next(it)
    training.micro_step = 4
    step(training)
    assert dl.point().consumed == 4 * 8 and training.saved_micro_step == 4


# --- skip_first_batches after load_state --------------------------------------------------------------
def restarted(point, world=2, derived=None):
    dl, acc = simulated_rank(sizes(4), 0, world, even_batches=False, dispatch_batches=False)
    dl.restart_epoch(point, derived_skip=derived)
    return dl


def first_of(skipped):
    return next(iter(skipped)).tolist()


def test_skip_first_batches_after_load_state_skips_what_the_script_asks(capsys):
    point = EpochPoint(0, 5 * 8, "sample", Shape(2, 4, False))  # 5 batches trained
    for asked in (5, 4, 6):
        dl = restarted(point)
        skipped = SkipFirstBatches(dl, asked)
        assert len(skipped) == 8 - asked
        assert first_of(skipped) == list(range(asked * 8, asked * 8 + 4))
    assert capsys.readouterr().err == ""


def test_skip_first_batches_after_a_shape_change_goes_to_the_checkpoint_and_says_so(capsys):
    point = EpochPoint(0, 5 * 8, "sample", Shape(2, 4, False))  # world 2: 40 samples
    dl = restarted(point, world=4)  # at world 4 a batch of every rank is 16 samples
    skipped = SkipFirstBatches(dl, 5)
    assert len(skipped) == 2  # samples 40-63: 24 of them, a round and a half
    assert first_of(skipped) == [40, 41, 42, 43]
    err = capsys.readouterr().err
    assert "skip_first_batches(5)" in err and "after 40 samples of epoch 0" in err and "world 2" in err \
        and "world 4" in err and "would lose 40 samples" in err and err.count("\n") == 1


def test_a_count_computed_from_accumulated_steps_is_corrected_and_said(capsys):
    point = EpochPoint(1, 3 * 8, "sample", Shape(2, 4, False))
    dl = restarted(point, derived=4)
    assert first_of(SkipFirstBatches(dl, 4)) == list(range(24, 28))
    err = capsys.readouterr().err
    assert "accumulation windows" in err and "would lose 8 samples" in err
    dl = restarted(point, derived=4)  # a count of the script's own is still its own
    assert first_of(SkipFirstBatches(dl, 2)) == list(range(16, 20))


def test_a_pass_after_load_state_without_a_skip_starts_over_and_says_what_trains_again(capsys):
    point = EpochPoint(0, 5 * 8, "sample", Shape(2, 4, False))
    assert first_of(restarted(point)) == [0, 1, 2, 3]  # Accelerate's: the epoch from its first batch
    err = capsys.readouterr().err
    assert "load_state restored epoch 0 after 40 samples" in err and "skip_first_batches(loader, 5)" in err \
        and err.count("\n") == 1
    dl = restarted(point)
    first_of(SkipFirstBatches(dl, 5))  # the script skips: nothing to say, nor at the next pass
    first_of(dl)
    assert capsys.readouterr().err == ""


def test_a_checkpoint_at_the_epochs_last_batch_restarts_at_the_next_epoch():
    dl = restarted(EpochPoint(0, N, "sample", Shape(2, 4, False)))
    assert dl.epoch == 1 and first_of(SkipFirstBatches(dl, 0)) == [0, 1, 2, 3]


# --- a StatefulDataLoader's stream ----------------------------------------------------------------------
STATEFUL = {"use_stateful_dataloader": True, "dispatch_batches": False, "even_batches": False}


def stateful_stream(rank, world, bs, n=24, plain=False):
    """A stream read through a StatefulDataLoader; `plain`: a dataset with no state of its own, which the loader's
    state puts back by counting the batches it had yielded."""
    from tests.unit.test_data_loading import StatefulStream

    data = SizedStream(n) if plain else StatefulStream(n)
    return simulated_rank(lambda: DataLoader(data, batch_size=bs), rank, world, **STATEFUL)[0]


def test_a_stateful_stream_saved_with_a_batch_in_hand_resumes_at_the_point_not_past_it():
    dl = stateful_stream(0, 1, 2)
    dl.training = TrainingState()
    dl.training.optimizers.append(object())
    dl.training.loaders.append(dl)
    it = iter(dl)
    next(it)
    step(dl.training)
    next(it)  # fetched, then saved before its step
    state = dl.state_dict()
    assert "reader" not in state and state["consumed"] == 2
    again = stateful_stream(0, 1, 2)
    again.load_state_dict(state)
    assert [b.tolist() for b in again][0] == [2, 3]


@pytest.mark.parametrize("plain", [False, True], ids=["stateful dataset", "plain dataset"])
def test_a_stateful_stream_resumed_in_another_shape_reads_up_to_the_point(plain):
    dl = stateful_stream(0, 2, 2, plain=plain)
    it = iter(dl)
    next(it), next(it)  # two rounds of world 2: samples 0-7
    state = dl.state_dict()
    assert "reader" in state and state["consumed"] == 8
    seen = []
    for rank in range(4):
        again = stateful_stream(rank, 4, 1, plain=plain)  # batches of 1: the saved state counts batches of 2
        again.restore_reader(state["reader"])
        again.load_state_dict(state)
        seen += [i for b in again for i in b.tolist()]
    assert sorted(seen) == list(range(8, 24))


def test_a_count_in_the_epoch_a_checkpoint_finished_does_not_skip_the_next(capsys):
    """Saved at epoch 0's last batch, and the script skips its own count of it (8): epoch 1 starts from its first
    batch, not after 8 of it, with a note."""
    dl = restarted(EpochPoint(0, N, "sample", Shape(2, 4, False)))
    assert dl.epoch == 1 and first_of(SkipFirstBatches(dl, 8)) == [0, 1, 2, 3]
    assert "ended epoch 0 with its last batch" in capsys.readouterr().err


def test_a_batch_samplers_batches_of_another_size_are_refused_in_one_line():
    class Sized:
        def __init__(self, size):
            self.batch_size, self.batches = size, [list(range(i, i + size)) for i in range(0, N, size)]

        def __len__(self):
            return len(self.batches)

        def __iter__(self):
            return iter(self.batches)

    point = EpochPoint(0, 4, "item", Shape(2, 8, False))  # 4 of its batches of 8
    dl, _ = simulated_rank(lambda: DataLoader(torch.arange(N), batch_sampler=Sized(16)), 0, 1,
                           dispatch_batches=False)
    with pytest.raises(HpcError) as e:
        dl.continue_from(point)
    assert "batches held 8 samples; they hold 16 now" in str(e.value) and "\n" not in str(e.value)
    same, _ = simulated_rank(lambda: DataLoader(torch.arange(N), batch_sampler=Sized(8)), 0, 4,
                             dispatch_batches=False)
    same.continue_from(point)  # another world size, the same batches: counted in them, exact
    assert next(iter(same)).tolist() == list(range(32, 40))


def test_a_save_at_an_epochs_end_records_the_next_epochs_start():
    """`if checkpointing_steps == "epoch": save_state()` after the loop: the point is the next epoch's first sample,
    not the finished pass's count carried into it."""
    dl, training = loader_of_a_run()
    for _ in dl:
        step(training)
    point = dl.point()
    assert (point.epoch, point.consumed) == (1, 0)
    dl.continue_from(EpochPoint(1, 16, "sample", dl.shape))  # a resume, saved again before its first batch
    assert dl.point().consumed == 16
