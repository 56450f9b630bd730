"""What keeps one run going through restarts, preemption and hangs, in one place.

The training loop and the collectives come through here (before_collective, before_work, beat, step_completed,
before_batch): an auto-resume happens at the first call every rank makes once there is something to restore;
each collective and optimizer step casts this rank's stop vote (stop_vote.py) and feeds the hang watchdog; a
stop asked for by a signal checkpoints, requeues and exits every rank the same way. save_state and load_state
are run from here too, with the watchdog paused and the save's time measured (pace.py). The same hooks time each
rank's own part of a step for the straggler check (stragglers.py), whose "requeue" stops the run as the warning
signal does.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Callable

from hpc.contract import layout
from hpc.errors import HpcError
from hpc.runtime.checkpoint import notices
from hpc.runtime.checkpoint import script_resume as script_checkpoints
from hpc.runtime.process.node_hosts import node_hosts
from hpc.runtime.process.process_state import ProcessState
from hpc.runtime.process.stop_vote import StopVote
from hpc.runtime.process.training_state import TrainingState
from hpc.runtime.resilience import preemption, progress_guard
from hpc.runtime.resilience.fast_saves import FastSaves
from hpc.runtime.resilience.join_vote import JoinVote
from hpc.runtime.resilience.pace import Pace
from hpc.runtime.resilience.stragglers import Stragglers
from hpc.runtime.resilience.timeline_writer import TimelineWriter
from hpc.runtime.resilience.training_checkpoints import ResumeInfo, TrainingCheckpoints
from hpc.runtime.resilience.watchdog import HangWatchdog
from hpc.runtime.settings import Resilience
from hpc.runtime.tracking import run_trackers as trackers


def requeue_signals(signal_name: str) -> list[str]:
    # submitit asks for USR2 before the limit; its own handler would requeue at once, mid-step: once the
    # loop checks should_stop, hpc's handler takes USR2 over and stops at a step boundary with a checkpoint
    first = "USR2" if os.environ.get("SUBMITIT_EXECUTOR") else signal_name
    return [n for n in dict.fromkeys([first, signal_name, "USR2"]) if n not in ("TERM", "INT")]


class RunGuard:
    """``finish``: what ends the run on every rank before a stop exits (the Accelerator's end_training)."""

    def __init__(self, process: ProcessState, training: TrainingState, checkpoints: TrainingCheckpoints,
                 options: Resilience, finish: Callable[[], None]):
        self.process, self.training, self.checkpoints, self.options = process, training, checkpoints, options
        self.finish = finish
        self.resume_pending = options.auto_resume
        self.watch = preemption.PreemptionWatch(requeue_signals(options.requeue_signal),
                                                os.environ.get("HPC_STOP_FILE"))
        self.stop_vote = StopVote(process.distributed, process.backend)
        self.join_vote = JoinVote(self)  # the stop vote inside join_uneven_inputs
        self.stop_code, self.stop_reason = 0, ""
        self._resume_save_as = options.resume_save_as  # the naming of step checkpoints, read off the script's
        self._batch_marks: dict[int, int] = {}  # loader -> completed steps at its previous batch of this pass
        self.watchdog = self._make_watchdog(options.hang_timeout_s)
        self.watchdog.start()
        self.pace = Pace(options.lead_time_s, os.environ.get("HPC_JOB_DIR"), process.is_main_process)
        self.stragglers = Stragglers(process, options.straggler_threshold, options.straggler_action,
                                     options.max_requeues, enabled=options.in_job)
        # rank 0's account of the attempt for `hpc report` (tasks/<task>.timeline): a few lines an attempt
        self.timeline = TimelineWriter(options.in_job and process.is_main_process,
                                       node_first=options.in_job and process.is_local_main_process,
                                       steps=lambda: self.training.completed_steps,
                                       on_exit=self._ended_without_end_training)
        self.timeline.started(process.world_size, training.completed_steps,
                              hosts=node_hosts(process) if options.in_job else None)
        self.fast_saves = FastSaves(process, checkpoints, options.in_job)  # checkpoints in node memory
        self.timeline.progress_fields = self.fast_saves.progress
        self.fast_saves.on_drained = self._drained
        self._requeued = False
        if options.in_job:  # inside an hpc job the warning signal starts ignored; from now on it is noted
            self.watch.install(term=False)

    # An Accelerator may be pickled (sent to a worker, kept with a trainer object). What belongs to this process
    # alone (its hang watchdog thread, signal handlers, stop votes, the job's pacing and straggler check) is left
    # behind: the copy gets an idle watchdog, signal watch, pace and straggler check.
    def __getstate__(self) -> dict:
        return {**self.__dict__, "watchdog": None, "watch": None, "pace": None, "stop_vote": StopVote(False, None),
                "stragglers": None, "timeline": TimelineWriter(False), "fast_saves": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.watchdog = HangWatchdog(0.0, self.process.rank, self.process.world_size, socket.gethostname(), None)
        self.watch = preemption.PreemptionWatch(requeue_signals(self.options.requeue_signal), None)
        self.pace = Pace(None, None, self.process.is_main_process)
        self.stragglers = Stragglers.off(self.process)
        self.fast_saves = FastSaves(self.process, self.checkpoints, in_job=False)

    # --- the hooks the loop and the collectives enter -------------------------------------------------
    def before_work(self) -> None:
        """backward(), accumulate(), a loader's pass, ...: the last before a collective ends a step's own part."""
        self.stragglers.work()
        self._resume_if_due()
        if self.training.models or self.training.optimizers:  # the loop's first work: training time from here
            self.timeline.training(self.training.completed_steps)

    def _resume_if_due(self) -> None:
        # not before prepare() has the model or optimizer: main_process_first() around dataset loading waits for
        # everyone before it, and a resume then would restore the counters and nothing else
        if self.resume_pending and (self.training.models or self.training.optimizers):
            self.resume()

    def before_collective(self, label: str) -> None:
        """Every rank is here, in the same order: resume if asked, vote on stopping, and count the progress
        (``label`` is what a hang report shows if the other ranks never come)."""
        self.stragglers.collective()
        self._resume_if_due()
        self.stop_vote.cast(self.watch.local_code())
        self.beat(label)

    def beat(self, what: str) -> None:
        """Progress that is not a step (a batch, a collective): the hang watchdog counts it from the first
        optimizer step on, so a long first step (torch.compile, autotuning) is not taken for a hang."""
        if self.training.completed_steps:
            self.watchdog.beat(what)

    def step_completed(self) -> None:
        """One optimizer step (an accumulation window) has ended (TrainingState counted it)."""
        self.stop_vote.cast(self.watch.local_code())
        self.pace.step_done()
        self.timeline.step_done(self.training.completed_steps)
        why = self.stragglers.step_done(self.training.completed_steps)  # every rank alike: no vote needed
        if why and not self.stop_code:  # the loop's next should_stop stops it as the warning signal does
            self.stop_code, self.stop_reason = preemption.REQUEUE, why
        self.watchdog.beat(f"optimizer step {self.training.completed_steps}")

    def paused(self, what: str):
        """A wait whose length is not the loop's (a download, a checkpoint): no hang is declared during it, and
        the step it is in is no straggler's evidence."""
        self.stragglers.pause()
        return self.watchdog.paused(what)

    @property
    def completed_steps(self) -> int:
        if self.resume_pending:  # what the resume will load: the newest checkpoint that verifies
            newest = self.checkpoints.checkpointer.newest_good_step()
            return newest if newest is not None else self.training.completed_steps
        return self.training.completed_steps

    # --- saving and loading -------------------------------------------------------------------------
    def save_state(self, output_dir: str | os.PathLike | None, async_save: bool, **noted) -> Path:
        self.before_work()
        with self.paused("save_state: waiting for every rank"):
            self.checkpoints.checkpointer.arrive("save_state")
        named = output_dir is not None
        folder = self.checkpoints.folder_named(output_dir) if named else self.checkpoints.step_folder()
        if named:
            self._note_script_checkpoint(folder)
        started = time.monotonic()
        with self.paused("save"), contextlib.nullcontext() if async_save else self.pace.saving():
            saved = self.checkpoints.save(folder, async_save=async_save, purge=not named)
        # what the save held the loop for (an async save: until it returned), for the report's checkpoint stalls
        self.timeline.note("save", step=self.training.completed_steps, stall_s=round(time.monotonic() - started, 4),
                           folder=str(saved), tier="shared", **{"async": bool(async_save)}, **noted)
        return saved

    def _drained(self, step: int, folder: Path) -> None:
        """Rank 0's writer thread: the fast tier's step is in the shared tier now (the job's progress too)."""
        self.timeline.note("save", step=step, stall_s=0.0, folder=str(folder), tier="shared", **{"from": "node"},
                           **{"async": True})
        if os.environ.get("HPC_JOB_DIR"):
            progress_guard.note(step)

    def _save_shared_instead(self, why: str) -> None:
        """The fast tier failed (full, or a write or a copy failed): this step goes to the shared tier."""
        self.save_state(None, async_save=False, fallback=why)

    def wait_for_checkpoint(self) -> None:
        if self.checkpoints.started:  # a pause ends in a beat: none before anything was saved
            with self.paused("checkpoint commit"):
                self.checkpoints.wait()

    def load_state(self, input_dir: str | os.PathLike | None) -> ResumeInfo:
        self.resume_pending = False
        checkpointer = self.checkpoints.checkpointer
        with self.paused("load_state: waiting for every rank"):
            checkpointer.arrive("load_state")
        folder = checkpointer.choose(self.checkpoints.folder_named(input_dir) if input_dir is not None else None)
        if folder is None:
            raise HpcError(f"no committed checkpoint under {self.checkpoints.directory}",
                           fix="save_state() first, or name a step folder")
        return self._restore(folder, mid_epoch=False)

    def resume(self) -> ResumeInfo | None:
        """The newest complete, verified checkpoint of any tier: this node's memory, a peer's copy, the shared tier."""
        self.resume_pending = False
        fast = self.fast_saves.choose()
        if fast is not None:
            folder, tier = fast.path, fast.tier
            # this rank's own part: in the same folder, or (a rank not first on its node) a folder of its own
            self.checkpoints.checkpointer._own_part_folder = fast.part or folder
        else:
            folder, tier = self.checkpoints.checkpointer.choose(None), "shared"
        if folder is None:
            self.fast_saves.settle(0)
            return None
        started = time.monotonic()
        info = self._restore(folder, mid_epoch=True, tier=tier)
        self.timeline.note("resumed", step=self.training.completed_steps, load_s=round(time.monotonic() - started, 3),
                           tier=tier, folder=str(folder))
        self.fast_saves.settle(self.training.completed_steps)  # what the node keeps from here on
        return info

    def _restore(self, folder: Path, mid_epoch: bool, tier: str | None = None) -> ResumeInfo:
        self.checkpoints.run_load_hooks(folder)
        with self.paused("load"):
            meta = self.checkpoints.checkpointer.load(folder)
        return self.checkpoints.restore(meta, folder, mid_epoch, tier)

    def _note_script_checkpoint(self, folder: Path) -> None:
        """A folder the script named: where a requeued attempt of a self-resuming script may resume from, and,
        read off it, the script's naming of step checkpoints (for the one hpc saves at the warning signal)."""
        job_dir = os.environ.get("HPC_JOB_DIR")
        if not (self.options.script_resumes and job_dir):
            return
        if self.process.is_main_process:
            script_checkpoints.note(job_dir, os.environ.get("HPC_TASK", "0"), folder, self.training.completed_steps)
        if self._resume_save_as is None:
            self._resume_save_as = script_checkpoints.naming(folder, self.training.completed_steps)

    # --- stopping -----------------------------------------------------------------------------------
    @property
    def should_stop(self) -> bool:
        self.watch.install(term=True)  # from here on TERM is handled too: the loop checks for it
        code = self.stop_vote.result(self.watch.local_code())
        if code and not self.stop_code:  # what stopped us, fixed now: signals that follow (SLURM's TERM
            # after our own requeue) change nothing
            self.stop_reason = self.watch.received if self.watch.code == code else (
                "TERM on another rank" if code == preemption.STOP else "warning signal on another rank")
            self.timeline.signal(self.stop_reason or "stop")
        self.stop_code = max(self.stop_code, code)
        return self.stop_code > 0

    def held_back(self):
        """Inside join_uneven_inputs: no per-step collective of hpc's (the joined ranks make none; join_vote.py)."""
        stack = contextlib.ExitStack()
        stack.enter_context(self.stop_vote.held_back())
        stack.enter_context(self.stragglers.held_back())
        return stack

    def preemption_point(self) -> None:
        # inside join_uneven_inputs a save waits for joined ranks: the join vote stops there (join_vote.py)
        if self.should_stop and not self.join_vote.inside:
            # the fast tier first (milliseconds: a requeue on the same nodes reads it), then the shared tier
            self.fast_saves.step_boundary(self._save_shared_instead, stopping=True)
            self.stop_here(self.save_state(None, async_save=False))

    def before_batch(self, loader, first: bool) -> None:
        """A self-resuming script is stopped at the first batch after an optimizer step once a stop was asked
        for: its step is over, scheduler and counters included, and the checkpoint hpc saves in the script's
        naming is one its own resume arithmetic lands on. Evaluation loops take no steps and are not stopped."""
        self.join_vote.batch_came()
        if self.fast_saves.on and not self.join_vote.inside:  # the previous step is over: its state to node memory
            self.fast_saves.step_boundary(self._save_shared_instead)
        if not self.options.script_resumes:
            return
        steps = self.training.completed_steps
        before = None if first else self._batch_marks.get(id(loader))
        self._batch_marks[id(loader)] = steps
        if before is None or before == steps or not self.should_stop or self.join_vote.inside:
            return
        # every rank is here (the stop is seen alike): rank 0's naming holds for all (diffusers saves on it alone)
        naming = self.process.broadcast_object(self._resume_save_as)
        folder = None
        if naming is not None:
            folder = Path(naming.replace("{step}", str(steps)))
            saved = self.process.broadcast_object(self.checkpoints.checkpointer.committed_step(folder))
            if saved != steps:  # the script's own save of this very step stands
                folder = self.save_state(folder, async_save=False)
        elif self.process.is_main_process:
            preemption.log("the script has saved no step checkpoint yet and resume_save_as is not set: nothing "
                           "saved; its next attempt resumes from its newest own checkpoint, if any")
        self.stop_here(folder)

    def stop_here(self, folder: Path | None) -> None:
        """Requeue (for the warning signal) and exit, every rank the same way; ``folder`` is what was saved."""
        requeued = False
        if self.process.is_main_process:
            # TERM is a cancel unless SLURM preempted the job
            preempted = self.stop_code == preemption.STOP and preemption.preempted_without_job_script()
            said = "exiting"
            if self.stop_code == preemption.REQUEUE or preempted:
                # a preempted job comes back whatever max_requeues says, as SLURM's own requeue would bring it
                requeued, said = preemption.requeue(None if preempted else self.options.max_requeues,
                                                    self.stop_reason)
            saved = f"saved {folder}" if folder is not None else "nothing saved"
            preemption.log(f"stop requested ({self.stop_reason}): {saved}; {said}")
            self.timeline.note("stopped", step=self.training.completed_steps, why=self.stop_reason,
                               requeued=requeued)
            self._report_goodput()
            self._stop_noted = True  # finish() ends training: that end is this stop's, noted already
        requeued = self.process.broadcast_flag(requeued)
        self._requeued = requeued  # the fast tier stays in node memory for the next attempt
        self.finish()
        sys.exit(0 if requeued else 128 + (signal.SIGTERM if self.stop_code == preemption.STOP
                                           else getattr(signal, f"SIG{self.watch.requeue_signals[0]}")))

    def end(self) -> None:
        """The run is over: no hang watch, the last save committed, the last votes in."""
        self.watchdog.stop()
        self.wait_for_checkpoint()
        if self.fast_saves is not None:
            self.fast_saves.close(remove=not self._requeued)
        self.stop_vote.finish()
        if self.timeline.on and not getattr(self, "_stop_noted", False):
            self.timeline.finished(self.training.completed_steps)
            self._report_goodput()
            self._stop_noted = True

    def _ended_without_end_training(self) -> None:
        """The process exits and neither a stop nor end_training() said how the attempt went (most scripts just
        return): the goodput line goes to the log (the trackers may be closed by now)."""
        if not getattr(self, "_stop_noted", False):
            self._report_goodput(trackers_too=False)

    def _report_goodput(self, trackers_too: bool = True) -> None:
        """Rank 0, at the end of an attempt: the goodput so far and the steps redone, to the trackers and the log."""
        try:
            summary = self.timeline.summary()
            if summary is None or summary["goodput"] is None:
                return
            if trackers_too:
                trackers.log_to_running({"hpc/goodput": summary["goodput"],
                                         "hpc/redone_steps": summary["redone_steps"]}, self.training.completed_steps)
            preemption.log(f"goodput so far {summary['goodput']:.1%} of {summary['allocated_node_s']:.0f} "
                           f"node-seconds; {summary['redone_steps']} step(s) redone after resumes")
        except Exception as e:  # noqa: BLE001 - a report must never fail the run
            preemption.log(f"goodput: not reported: {type(e).__name__}: {e}")

    # --- hangs --------------------------------------------------------------------------------------
    def _make_watchdog(self, timeout_s: float) -> HangWatchdog:
        job_dir = os.environ.get("HPC_JOB_DIR")
        # one folder per array task (they share the job folder); the watchdog tells an earlier attempt's reports by age
        folder = Path(layout.JobFolder(job_dir).hang(os.environ.get("HPC_TASK", "0"))) if job_dir else None
        main = self.process.is_main_process
        return HangWatchdog(timeout_s, self.process.rank, self.process.world_size, socket.gethostname(), folder,
                            before_exit=self._after_hang, excused=None if main else notices.peer_saving)

    def _after_hang(self, summary: str) -> None:
        self.timeline.note("hang", step=self.training.completed_steps, idle_s=self.options.hang_timeout_s)
        # any rank may ask (the job script's request file is one); scontrol for a function only from the rank
        # that wrote the verdict: rank 0 may be the frozen one
        if self.options.hang_requeue and (preemption.job_script_requeues() or self.watchdog.wrote_summary or (
                self.watchdog.report_dir is None and self.process.is_main_process)):
            _, said = preemption.requeue(self.options.max_requeues, f"hang: {summary}")
            preemption.log(f"hang_requeue: {said}")
