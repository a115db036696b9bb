"""A scenario played by the launcher: link changes by round and by time, and leaves, joins and
partitions at a time fixed at rounds on the run's clock (``fixing.RoundFixer``).

No sockets and no processes: the clock (wall seconds since the run's start, None before it) and
the way to answer a worker (``tell``) are injected, so the rules are tested alone. The Supervisor
owns one and calls it from its serve loop and its message handlers.

Under time dilation (``time_scale`` K, netplan's "Time dilation") the scenario is written in
emulated time and values: every time it compares is the clock / K, every wait it asks of the
launcher is K times its emulated length, and every link value it hands the network is the
played one (rate / K, latency x K: ``dilate_state``), as the workers' ``LinkApplier`` does for
the links they change themselves.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from gasloc_emu.emulator.errors import RunFailed
from gasloc_emu.netplan import dilate_state
from gasloc_emu.report.schema import MetricRow
from gasloc_emu.scenario.events import ScenarioError
from gasloc_emu.scenario.hostloss import (
    HostBack,
    HostLoss,
    HostLossError,
    in_decided_order,
)
from gasloc_emu.scenario.observed import link_changes, membership_summary, observed_link_changes
from gasloc_emu.scenario.world import World
from gasloc_emu.transport.orders import Fixings

Clock = Callable[[], "float | None"]
Tell = Callable[[int, dict], None]


class Conductor:
    """The scenario's side of the launcher (a ``World``, or None for a run without one)."""

    def __init__(self, world: World | None, network, rounds: int, clock: Clock, tell: Tell,
                 time_scale: float = 1.0):
        self.world, self.network, self.rounds = world, network, rounds
        self.clock, self.tell, self.k = clock, tell, time_scale
        self.links_round = 0      # the link changes of rounds < this are applied
        self.timed_upto_s = -1.0  # and the changes by time up to here (the run's clock)
        # {worker, round, recv_links} of each row, when links change: what summary.json's
        # link_changes observe (one per worker and round, so bounded by the run's length)
        self.link_rows: list[dict] = []
        # leaves, joins and partitions at a time: the workers absent until a join not fixed
        # yet, and the round each asked at (answered once it is fixed, ``fix_due``)
        self.join_waiters: dict[int, int] = {}
        # how late (s) each event at a time fired on the run's clock, for the record
        self.late_s: list[float] = []

    @property
    def links(self):
        return self.world.links if self.world is not None else None

    @property
    def fixer(self):
        return self.world.fixer if self.world is not None else None

    def now_s(self) -> float | None:
        """Emulated seconds since the run's start (the wall clock / K); None before it."""
        wall_s = self.clock()
        return None if wall_s is None else wall_s / self.k

    def _change(self, changes: dict) -> None:
        """Hand the network asked link states {(src, dst): (rate_mbit, latency_ms)}, played."""
        self.network.change_links({link: dilate_state(state[0], state[1], self.k)
                                   for link, state in changes.items()})

    # -- links
    def keep_link_row(self, row: MetricRow) -> None:
        """Keep what ``link_changes`` needs of a (checked) row, in a run whose links change."""
        if self.links is not None and row.recv_links is not None:
            self.link_rows.append({"worker": row.worker, "round": row.round,
                                   "recv_links": row.recv_links})

    def change_links(self, upto: int) -> None:
        """The network's link changes of rounds <= ``upto``, once each, when the first worker
        reports round ``upto`` - 1 (tc: messages of that round still in flight may see them;
        the userspace shaper's workers apply their own at their round starts)."""
        if self.links is None:
            return
        now_s = self.now_s() or 0.0
        while self.links_round <= min(upto, self.rounds - 1):
            t = self.links_round
            self._change({link: self.links.at(*link, t, now_s)
                          for link in self.links.changes.get(t, {})})
            self.links_round += 1

    def change_links_by_time(self) -> None:
        """The time-triggered link changes whose time has come on the run's clock (tc changes
        the classes then; under the userspace shaper the workers apply their own). A link a
        partition holds cut stays cut: its restore brings the value in force then."""
        timed = self.links.timed if self.links is not None else None
        now_s = self.now_s()
        if timed is None or now_s is None:
            return
        cut = self.links.cut(max(self.links_round - 1, 0))
        due = timed.due(self.timed_upto_s, now_s)
        self.late_s += [now_s - ev.at_s for ev in due]
        changes = {link: timed.in_force(*link, now_s)
                   for ev in due for link in ev.links if link not in cut}
        self.timed_upto_s = now_s
        if changes:
            self._change(changes)

    def next_due_s(self) -> float | None:
        """Wall seconds until the next event at a time (a link change, or a leave, join or
        partition to fix): K times its distance on the emulated clock; None when none is
        pending or the clock has not started. The launcher waits no longer than this, so an
        event fires on time."""
        now_s = self.now_s()
        if now_s is None:
            return None
        times = list(self.fixer.alarms_s[:1]) if self.fixer is not None else []
        timed = self.links.timed if self.links is not None else None
        if timed is not None:
            times += [ev.at_s for ev in timed.events if ev.at_s > self.timed_upto_s][:1]
        return max(0.0, min(times) - now_s) * self.k if times else None

    # -- leaves, joins and partitions at a time
    def on_round(self, rank: int, round_idx: int, waiting: bool, slots: Sequence) -> str | None:
        """A worker starts a round (or waits for its join): fix what is due first, so that no
        round it starts misses a fixing, then answer with every fixing so far. Returns the drop
        reason when the run has nothing to fix at a time."""
        if self.fixer is None:
            return "round.scenario"  # only events at a time need the question
        self.fix_due(slots)
        if waiting and self.world.awaits_join(rank, round_idx):
            self.join_waiters[rank] = round_idx
            return None
        if not waiting:
            self.fixer.started(round_idx)
        self.tell_fixings(rank)
        return None

    def fix_due(self, slots: Sequence) -> None:
        """Fix the events whose time has come; answer the workers whose join that fixes; the
        network's link changes are played again from the first round fixed (a partition's)."""
        now_s = self.now_s()
        if self.fixer is None or now_s is None:
            return
        new = self.fixer.due(now_s)
        self.late_s += [now_s - f.at_s for f in new]
        if new:
            try:
                self.world.fix(new)
            except ScenarioError as exc:   # with the hosts lost, nobody would be left
                raise RunFailed(f"the scenario's events at {new[0].at_s:g} s, with the "
                                f"workers lost so far, leave no worker: {exc}") from None
            self.links_round = min(self.links_round, min(f.round for f in new))
            for rank, t in list(self.join_waiters.items()):
                if not self.world.awaits_join(rank, t):
                    del self.join_waiters[rank]
                    self.tell_fixings(rank)
        self._release_waiters(slots)

    def _release_waiters(self, slots: Sequence) -> None:
        """Once every other worker is done, a join that has not come never will."""
        rest = [s for s in slots if s.rank not in self.join_waiters]
        if self.join_waiters and all(s.final is not None or s.gone for s in rest):
            for rank in self.join_waiters:
                self.tell_fixings(rank, released=True)
                slots[rank].gone = True
            self.join_waiters.clear()

    def tell_fixings(self, rank: int, released: bool = False) -> None:
        self.tell(rank, Fixings(released, [f.to_json() for f in self.world.fixings]).to_wire())

    # -- departures
    def planned_leave(self, rank: int, last_round: int) -> int | None:
        """The round at which the scenario makes this worker leave after ``last_round``, the
        last it reported; None when it has no such departure."""
        if self.world is None:
            return None
        leaves = [c["round"] for c in self.world.left_and_joined()
                  if c["type"] == "leave" and c["worker"] == rank and c["round"] > last_round]
        return min(leaves) if leaves else None

    def rejoin_round(self, rank: int, leave: int) -> int | None:
        """The round a departed worker's successor starts from: its next join, or (a join at a
        time not fixed yet) the round it left at, where it waits for the join; None when it
        never comes back."""
        joins = [c["round"] for c in self.world.left_and_joined()
                 if c["type"] == "join" and c["worker"] == rank and c["round"] > leave]
        if joins:
            return min(joins)
        return leave if self.world.awaits_join(rank, leave) else None

    # -- a host lost without warning (``scenario.hostloss``)
    def lose_host(self, node: int, host: str, ranks: list[int],
                  last_rows: dict[int, int], cause: str = "host") -> HostLoss:
        """Node ``node``'s workers ``ranks`` are gone (their last rows: ``last_rows``): they
        leave at the round an event reached now is fixed at, which no worker has started
        (every worker asks before it starts one). The decision, played here; the caller tells
        every survivor."""
        now_s = self.now_s() or 0.0
        loss = HostLoss(node, host, tuple(ranks), self.fixer.fixed_unplanned(now_s, ranks),
                        now_s, dict(last_rows), cause=cause)
        self.world.lose(loss)
        for r in ranks:   # a successor that waited for its join died with the host
            self.join_waiters.pop(r, None)
        return loss

    def back_round(self, ranks: list[int]) -> int:
        """The round workers ``ranks`` coming back now would join at (the rule of
        ``lose_host``: after every event fixed before that touches them)."""
        return self.fixer.round_at(self.now_s() or 0.0, frozenset(ranks))

    def back_refusal(self, node: int, ranks: list[int]) -> str | None:
        """Why workers ``ranks`` cannot come back now, or None: the run has no round left to
        take them at, or one of them is not lost (lost with its host, not back since)."""
        start = self.back_round(ranks)
        if start >= self.rounds:
            return (f"the run has no round left to take it back at (round {start} of "
                    f"{self.rounds})")
        try:
            HostBack(node, "", tuple(ranks), start, 0.0).check(
                self.world.workers, self.world.losses, self.world.backs)
        except HostLossError as exc:
            return str(exc)
        return None

    def back_host(self, node: int, host: str, ranks: list[int],
                  from_checkpoint: bool = False) -> HostBack:
        """Node ``node``'s workers ``ranks``, lost earlier, come back: they join at the round
        an event reached now is fixed at, as ``lose_host``'s leave. The decision, played
        here; the caller tells every living worker."""
        now_s = self.now_s() or 0.0
        back = HostBack(node, host, tuple(ranks), self.fixer.fixed_unplanned(now_s, ranks),
                        now_s, from_checkpoint)
        self.world.back(back)
        return back

    def decisions(self) -> list:
        """Every loss and return decided so far, as orders, in the order decided (what a
        worker that starts now must play before its first round)."""
        from gasloc_emu.transport.orders import Back, Lost
        if self.world is None:
            return []
        return [Lost(x.to_json()) if isinstance(x, HostLoss) else Back(x.to_json())
                for x in in_decided_order(self.world.losses, self.world.backs)]

    # -- the record
    def summary(self) -> dict:
        """summary.json's scenario blocks: membership, and the link changes as observed."""
        out = {}
        if self.world is not None:
            out["membership"] = membership_summary(self.world)
        if self.links is not None:
            out["link_changes"] = observed_link_changes(link_changes(self.links),
                                                        self.link_rows)
        if self.late_s:  # the launcher waits no longer than the next one (``next_due_s``)
            out["timed_events"] = {"fired": len(self.late_s),
                                   "max_late_ms": 1000 * max(self.late_s)}
        return out
