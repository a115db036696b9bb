"""``gasloc-emu netem measure`` on one host: meet the others, measure every directed pair one
at a time, and (node 0) write the profile file that ``run`` and ``simulate`` take.

Launched like a multi-node run (``cluster.roles``: by hand, torchrun or Slurm; the shared
secret of ``--secret-file`` or GASLOC_SECRET). The protocol, as every node sees it:

1. meet: join the store (``rendezvous.open_store``, under ``<prefix>/measure``), node 0 puts a
   fresh token there; every node opens its listener on its route address to the master and
   publishes a ``HostReport`` (address, port, TCP settings, version); all gather them. The
   addresses must be distinct and, with ``--hosts``, on that allowlist; a listener takes
   connections only from them, and the data connections' key derives from the secret and the
   token (``netem.measure``);
2. measure: every node walks ``measureplan.pair_order`` alike. For pair k = (i, j), node i
   connects to j, measures, and puts the ``PairResult`` at ``pair/<k>``; node j serves it;
   the others wait for the result. Every wait is bounded (the pair's bound and a grace), so a
   node that died (kill -9) makes the others fail within that bound, naming it; a failed pair
   ends the measurement everywhere (a profile with a link missing is no profile);
3. end: node 0 writes the file (only when every pair was measured), puts how it ended at
   ``end`` and waits briefly until the others have read it.

Nothing is started but this process: its sockets close with it, whatever ends it.
"""
from __future__ import annotations

import dataclasses
import json
import os
import secrets
import socket
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path

from gasloc_emu import exitcodes
from gasloc_emu.cluster.rendezvous import Rendezvous, RendezvousError, open_store
from gasloc_emu.cluster.roles import ClusterError, NodeRole, host_name, route_address
from netem import measure as wire
from netem import tcpsettings
from netem.measureplan import (
    HostReport,
    MeasureBounds,
    MeasureError,
    PairBudget,
    PairResult,
    pair_order,
    profile_document,
)

Log = Callable[[str], None]
JOIN_TIMEOUT_S = 300.0
GRACE_S = 3.0          # beyond a pair's bound, before a missing result counts as a dead node
LEAVE_WAIT_S = 5.0     # node 0 keeps the store up this long for the others to read the end
VERDICT_WAIT_S = 30.0  # the others wait this long for node 0's verdict (it writes the file)
POLL_S = 0.05


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("gasloc-emu")
    except PackageNotFoundError:
        return "unknown"


def resolve_allowlist(hosts: Sequence[str]) -> frozenset[str]:
    """The addresses of ``--hosts`` (names or addresses); a name that does not resolve is
    bad input."""
    out = set()
    for h in hosts:
        try:
            infos = socket.getaddrinfo(h, None, socket.AF_INET, socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise ClusterError(f"--hosts {h!r} does not resolve: {exc}") from None
        out.update(i[4][0] for i in infos)
    return frozenset(out)


def check_hosts(reports: Sequence[HostReport], allowlist: frozenset[str] | None) -> frozenset:
    """The participating hosts' addresses, once each is distinct and (with ``--hosts``) on
    the allowlist; else a ClusterError naming the host."""
    seen: dict[str, int] = {}
    for r in reports:
        if r.addr in seen:
            raise ClusterError(f"nodes {seen[r.addr]} and {r.node} both publish address "
                               f"{r.addr}: measure needs one node per host")
        seen[r.addr] = r.node
        if allowlist is not None:
            try:
                wire.check_address(r.addr, allowlist)
            except wire.AddressRefused:
                raise ClusterError(f"node {r.node} ({r.host}) publishes address {r.addr}, "
                                   f"which is not on --hosts ({', '.join(sorted(allowlist))}); "
                                   "refusing to measure") from None
    return frozenset(seen)


def check_out(out: str, overwrite: bool) -> Path:
    path = Path(out)
    if path.suffix != ".json":
        raise ClusterError(f"--out {out!r}: the profile file is JSON; name it *.json")
    if path.exists() and not overwrite:
        raise ClusterError(f"--out {out!r} exists; give --overwrite to replace it")
    if not path.parent.is_dir():
        raise ClusterError(f"--out {out!r}: folder {str(path.parent)!r} does not exist")
    return path


class _Meeting:
    """This node's view of the measurement's store."""

    def __init__(self, role: NodeRole):
        self.role = dataclasses.replace(role, store_prefix=f"{role.store_prefix}/measure")
        self.rdv = Rendezvous(open_store(self.role), self.role)
        self.store = self.rdv.store

    def token(self, deadline_s: float) -> bytes:
        if self.role.is_master:
            self.store.set("token", secrets.token_hex(16))
        self._wait(["token"], deadline_s, "node 0's token")
        return bytes.fromhex(self.store.get("token").decode())

    def _wait(self, keys: list[str], deadline_s: float, what: str) -> None:
        while not self.store.check(keys):
            if time.monotonic() > deadline_s:
                raise RendezvousError(f"{what} did not come within {JOIN_TIMEOUT_S:g} s")
            time.sleep(POLL_S)

    def gather(self, me: HostReport, deadline_s: float) -> list[HostReport]:
        self.store.set(f"host/{me.node}", me.to_json())
        keys = [f"host/{k}" for k in range(self.role.nnodes)]
        self._wait(keys, deadline_s, "every node's report")
        reports = [HostReport.from_json(self.store.get(k)) for k in keys]
        for k, r in enumerate(reports):
            if r.node != k:
                raise RendezvousError(f"the store's host/{k} says it is node {r.node}")
        return reports

    def result(self, index: int, pair: tuple[int, int], deadline_s: float) -> PairResult:
        """Pair ``index``'s result, once its sender has put it; a failed result naming the
        silent node when none came by ``deadline_s`` or node 0 ended the measurement."""
        key = f"pair/{index}"
        while not self.store.check([key]):
            if time.monotonic() > deadline_s:
                return PairResult(*pair, error=f"node {pair[0]} reported nothing within the "
                                               "pair's bound (gone?)")
            if not self.role.is_master and self.rdv.ended() is not None:
                return PairResult(*pair, error="node 0 ended the measurement")
            time.sleep(POLL_S)
        res = PairResult.from_json(self.store.get(key))
        if (res.src, res.dst) != pair:
            raise RendezvousError(f"the store's {key} is a result for {res.src}->{res.dst}")
        return res


def _measure_as_sender(reports, allowed, key, bounds, index, pair,
                       total_deadline_s) -> PairResult:
    budget = PairBudget(bounds, time.monotonic(), total_deadline_s)
    src, dst = pair
    if not budget.startable:
        return PairResult(src, dst, error="not started: --max-seconds was used up")
    peer = reports[dst]
    try:
        sock = wire.connect_pair(peer.addr, peer.port, source=reports[src].addr, allowed=allowed,
                                 key=key, index=index, src=src, dst=dst,
                                 deadline_s=budget.deadline_s)
    except wire.MeasureRunError as exc:
        return PairResult(src, dst, error=str(exc))
    try:
        return wire.send_pair(sock, budget, src, dst)
    except (OSError, TimeoutError, wire.MeasureRunError, MeasureError) as exc:
        return PairResult(src, dst, error=f"with node {dst} ({peer.host}, {peer.addr}): "
                                          f"{type(exc).__name__}: {exc}")
    finally:
        wire.abort_close(sock)


def _serve_as_receiver(listener, bounds, index, pair, total_deadline_s, log: Log) -> None:
    """Serve one pair; a failure here is the sender's to report (it sees it too)."""
    budget = PairBudget(bounds, time.monotonic(), total_deadline_s)
    try:
        sock = listener.accept_pair(index, *pair, budget.deadline_s + GRACE_S)
    except wire.MeasureRunError as exc:
        log(f"pair {pair[0]}->{pair[1]}: {exc}")
        return
    try:
        budget = PairBudget(bounds, time.monotonic(), total_deadline_s + GRACE_S)
        wire.serve_pair(sock, budget)
    except (OSError, TimeoutError, wire.MeasureRunError) as exc:
        log(f"pair {pair[0]}->{pair[1]}: serving failed: {type(exc).__name__}: {exc}")
    finally:
        sock.close()


def describe(res: PairResult) -> str:
    if not res.ok:
        return f"pair {res.src}->{res.dst}: FAILED: {res.error}"
    return (f"pair {res.src}->{res.dst}: {res.receiver['mbit']:g} Mbit/s (receiver, "
            f"{res.receiver['bytes']} B in {res.receiver['seconds']:g} s), RTT median "
            f"{res.rtt['median_ms']:g} ms p95 {res.rtt['p95_ms']:g} ms, ended by {res.ended_by}")


def _walk(meeting, listener, reports, allowed, key, bounds, log) -> list[PairResult]:
    me = meeting.role.node_rank
    total_deadline_s = time.monotonic() + bounds.max_seconds
    results = []
    for index, pair in enumerate(pair_order(len(reports))):
        if me == pair[0]:
            res = _measure_as_sender(reports, allowed, key, bounds, index, pair,
                                     total_deadline_s)
            meeting.store.set(f"pair/{index}", res.to_json())
        else:
            if me == pair[1]:
                _serve_as_receiver(listener, bounds, index, pair, total_deadline_s, log)
            wait = min(bounds.max_seconds_per_pair, max(0.0, total_deadline_s
                                                        - time.monotonic()))
            res = meeting.result(index, pair, time.monotonic() + wait + GRACE_S)
        log(describe(res))
        results.append(res)
        if not res.ok:
            break
    return results


def measure_hosts(role: NodeRole, secret: bytes, bounds: MeasureBounds, *, out: Path | None,
                  allowlist: frozenset[str] | None, loss_from: str, placement: str,
                  log: Log) -> int:
    """This node's part; the exit code: node 0's verdict (whether the file was written) on
    every node that heard it."""
    if role.nnodes < 2:
        raise ClusterError("netem measure needs at least 2 hosts (--nnodes 2 or more, one "
                           "`gasloc-emu netem measure` per host)")
    join_deadline = time.monotonic() + JOIN_TIMEOUT_S
    addr = route_address(role.master_addr, role.master_port)
    if allowlist is not None:
        check_hosts([HostReport(role.node_rank, host_name(), addr, 1, "", {}, 0)], allowlist)
    meeting = _Meeting(role)
    status, error = "failed", "interrupted"
    try:
        status, error = _measure(meeting, role, addr, secret, bounds, join_deadline, allowlist,
                                 out, loss_from, placement, log)
    except RuntimeError as exc:   # the store went with node 0 (DistNetworkError)
        error = f"lost node 0's store ({str(exc).splitlines()[0]}): node 0 gone?"
    finally:
        status, error = _end(meeting, status, error)
    if error:
        log(f"error: node {role.node_rank}: {error}")
    return exitcodes.OK if status == "ok" else exitcodes.RUN_FAILED


def _measure(meeting, role, addr, secret, bounds, join_deadline, allowlist, out, loss_from,
             placement, log) -> tuple[str, str | None]:
    key = wire.derive_key(secret, meeting.token(join_deadline))
    with wire.Listener(addr, key) as listener:
        me = HostReport(role.node_rank, host_name(), addr, listener.port, _version(),
                        tcpsettings.read_host().as_dict(), os.getpid())
        reports = meeting.gather(me, join_deadline)
        listener.allowed = check_hosts(reports, allowlist)
        log(f"node {role.node_rank} of {role.nnodes}: measuring "
            f"{role.nnodes * (role.nnodes - 1)} directed pairs among "
            + ", ".join(f"{r.host} ({r.addr})" for r in reports))
        results = _walk(meeting, listener, reports, listener.allowed, key, bounds, log)
        for why in listener.refused:
            log(f"refused a connection from {why}")
    failed = [r for r in results if not r.ok]
    if failed:
        return "failed", f"pair {failed[0].src}->{failed[0].dst}: {failed[0].error}"
    if role.is_master:
        _write(out, reports, results, bounds, loss_from, placement)
        log(f"wrote {out}")
    return "ok", None


def _write(out: Path, reports, results, bounds, loss_from: str, placement: str) -> None:
    doc = profile_document(reports, results, bounds=bounds, loss_from=loss_from,
                           placement=placement, tool_version=_version(),
                           date=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, out)


def _end(meeting: _Meeting, status: str, error: str | None) -> tuple[str, str | None]:
    """Node 0: say how it ended and give the others a moment to read it. The others: wait
    (bounded) for node 0's verdict, which is theirs, and say they read it. The store may be
    gone (node 0 died): there is nothing to tell then."""
    try:
        if meeting.role.is_master:
            meeting.rdv.end(status, error)
            meeting.rdv.wait_left(LEAVE_WAIT_S)
            return status, error
        deadline = time.monotonic() + VERDICT_WAIT_S
        while (end := meeting.rdv.ended()) is None and time.monotonic() < deadline:
            time.sleep(POLL_S)
        meeting.rdv.leave()
    except RuntimeError as exc:
        return "failed", error or f"lost node 0's store ({str(exc).splitlines()[0]})"
    if end is None:
        return "failed", error or f"node 0 gave no verdict within {VERDICT_WAIT_S:g} s"
    if status == "ok" and end["status"] != "ok":
        return end["status"], f"node 0: {end.get('error')}"
    return status, error
