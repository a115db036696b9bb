"""The round protocol, written once: what one worker of a round-based algorithm does in each
round, whichever runner hosts it.

Round t of worker i, in order:

1. **stop**: the runner may end the worker here (the launcher told it to stop);
2. **presence**: with leaves, joins or partitions at a time, the runner fixes the events due
   by this round's start (``scenario.fixing``); a worker absent until a join that is not fixed
   yet waits for it, and one whose join never comes is released for good;
3. **membership**: the scenario's plan of the round (``World.plan``): a departure (the worker
   is gone without a word), a join from a donor's parameters or from its own last
   checkpoint, or absence;
4. **timed self**: this worker's speed and pause events at a time that are due;
5. **begin**: the runner's links take round t's values before anything of it is sent, and
   the workers joining at t are new processes: what the transport held for their
   predecessors goes (``Transport.peer_restarted``);
6. **donate**: parameters to the workers joining from this one;
7. **train**: ``Worker.run_round`` (inner phase, the algorithm's exchange and outer step);
8. **evaluate** on the evaluation rounds;
9. **checkpoint** on the checkpoint rounds (``training.checkpoint``): before the row, so that
   whoever sees a worker's row of such a round knows its checkpoint is on disk;
10. **report** the round's row.

A runner is a ``Host``: the emulator's worker process (``emulator.worker_process``: its
control plane, heartbeat and shaper) or a simulator thread (``simulator.simulate``: the
in-memory transport and the virtual clock). The driver decides the order and the rules; the
host only says how each step is done where it runs, so ``run`` and ``simulate`` make the same
rounds by construction.
"""
from __future__ import annotations

from typing import Protocol

from gasloc_emu.scenario.world import RoundPlan, World
from gasloc_emu.training import checkpoint
from gasloc_emu.training.worker import RoundStats, Worker


class Host(Protocol):
    """How each step of a round is done where a worker runs."""

    def stop_requested(self) -> bool:
        """Whether the worker must end now (told to stop)."""

    def await_fixings(self, t: int) -> bool:
        """Absent until a join at a time that is not fixed yet: wait until more events are
        fixed. False: the run ends without this worker's join (it is released)."""

    def round_fixings(self, t: int) -> bool:
        """Present at round t's start: take the events fixed by then. False: released."""

    def leave(self, t: int) -> None:
        """A scenario's departure at round t: the worker's state is gone."""

    def joiner(self, t: int) -> Worker:
        """The worker that joins at round t (its state is built afresh, as a new process's)."""

    def rejoined(self, t: int, round_idx: int, refused: tuple[str, ...]) -> None:
        """It joined at round t from its checkpoint of ``round_idx``, passing over the damaged
        files ``refused`` names (one line each)."""

    def due(self, plan: RoundPlan | None, t: int) -> RoundPlan | None:
        """The round's plan with this worker's speed and pause events at a time that are due."""

    def begin(self, t: int) -> None:
        """Before anything of round t is sent."""

    def compute_done(self, seconds: float, nominal: bool) -> None:
        """Between the inner phase and the exchange (``Worker.run_round``'s callback)."""

    def evaluating(self, t: int) -> None:
        """Before the evaluation of round t."""

    def report(self, t: int, stats: RoundStats) -> None:
        """After round t: its row."""


class Released(Exception):
    """The worker is absent to the end of the run: its join at a time never came."""


class RoundDriver:
    """One worker's rounds (the module's protocol) on a ``Host``. ``worker``: None while the
    worker is absent (a newcomer before its first join, or after a departure);
    ``checkpoints``: where it writes its state every ``run.checkpoint_every`` rounds (None:
    never)."""

    def __init__(self, host: Host, worker: Worker | None, world: World | None, rank: int,
                 rounds: int, checkpoints: checkpoint.Checkpoints | None = None):
        self.host, self.worker, self.world, self.rank, self.rounds = \
            host, worker, world, rank, rounds
        self.checkpoints = checkpoints

    def run(self, first: int = 0) -> bool:
        """Rounds ``first`` .. the last; False when stopped or released before the end."""
        for t in range(first, self.rounds):
            if self.host.stop_requested():
                return False
            try:
                takes_part, plan = self.enter(t)
            except Released:
                return False
            if takes_part:
                self.round(t, plan)
        return True

    def enter(self, t: int) -> tuple[bool, RoundPlan | None]:
        """Steps 2 and 3 of round t: whether this worker takes part in it, and the round's
        plan (None without a scenario). Raises ``Released``."""
        world = self.world
        if world is None:
            return True, None
        if world.fixer is not None and not self.present(t):
            return False, None
        plan = world.plan(self.rank, t)
        if plan.leaving:
            self.host.leave(t)
            self.worker = None
        if plan.join_from is not None or plan.join_checkpoint:
            self.worker = self.host.joiner(t)
            if plan.join_checkpoint:
                self.restore_last(t)
            else:
                self.worker.join(plan.join_from, t)
        return plan.active, plan

    def restore_last(self, t: int) -> int:
        """A rejoin from a checkpoint (step 3): the worker's state of the last round before t
        of which it has a whole checkpoint; the round taken. A damaged file is passed over for
        the one before (``Checkpoints.last_whole``)."""
        # not past the last it wrote: a replay computes a lost worker's dead rounds (for the
        # messages it sent before it died) and may write files of them that the run has not
        rounds = self.world.restore_rounds(self.rank, t) if self.world is not None else []
        before = rounds[-1] + 1 if rounds else t
        round_idx, state, refused = self.checkpoints.last_whole(self.rank, before=before)
        self.worker.restore(state)
        self.host.rejoined(t, round_idx, refused)
        return round_idx

    def present(self, t: int) -> bool:
        """With events at a time: whether this worker has a part in round t, once the events
        due by its start are fixed. Raises ``Released``."""
        world, rank = self.world, self.rank
        while world.awaits_join(rank, t):
            if not self.host.await_fixings(t):
                raise Released
        if world.sits_out(rank, t):
            return False
        if not self.host.round_fixings(t):
            raise Released
        return True

    def round(self, t: int, plan: RoundPlan | None) -> RoundStats:
        """Steps 4 to 10 of round t."""
        host, worker = self.host, self.worker
        plan = host.due(plan, t)
        host.begin(t)
        for joiner in sorted(plan.joined - {self.rank}) if plan else ():
            worker.peer_joined(joiner)
        for joiner in (plan.donate_to if plan else ()):
            worker.donate(joiner, t)
        stats = worker.run_round(t, on_compute_done=host.compute_done, plan=plan)
        if worker.should_eval(t):
            host.evaluating(t)
            stats.eval_loss = worker.evaluate(t)
        if self.checkpoints is not None and checkpoint.due(worker.cfg.run.checkpoint_every, t):
            self.checkpoints.save(self.rank, t, worker.checkpoint())
        host.report(t, stats)
        return stats
