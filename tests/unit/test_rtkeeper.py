"""The real-time keeper's rules: what a request may be and whose process it may touch; and the
keeper itself, forked here, refusing a process that is not the launcher's."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from netem import rtkeeper


@pytest.mark.parametrize("raw,words", [
    (b"12", "is not 'PID PRIORITY'"), (b"-3 10", "is not 'PID PRIORITY'"),
    (b"abc 10", "is not 'PID PRIORITY'"), (b"0 10", "pid = 0 is out of range"),
    (b"99999999 10", "pid = 99999999 is out of range"),
    (b"123 0", "priority = 0 is out of range; expected [1, 99]"),
    (b"123 100", "priority = 100 is out of range")])
def test_a_bad_request_is_refused_naming_the_value(raw, words):
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
        rtkeeper.parse_request(raw)


def test_only_descendants_of_the_launcher_may_be_made_realtime():
    parents = {40: 30, 30: 20, 20: 1, 50: 1}
    assert rtkeeper.descends_from(40, 20, parents.get)
    assert not rtkeeper.descends_from(50, 20, parents.get)
    assert not rtkeeper.descends_from(20, 20, parents.get)    # itself is no descendant
    assert not rtkeeper.descends_from(40, 20, lambda pid: None)


def test_the_keeper_answers_and_refuses_a_process_that_is_not_the_launchers(monkeypatch):
    env = rtkeeper.start()
    monkeypatch.setattr(rtkeeper, "_taken", False)
    monkeypatch.setattr(rtkeeper, "_channel", None)
    monkeypatch.setenv(rtkeeper.ENV_FDS, env[rtkeeper.ENV_FDS])
    req_w, rep_r = rtkeeper.channel()
    assert rtkeeper.ENV_FDS not in os.environ and not os.get_inheritable(req_w)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(10)"])
    try:
        with pytest.raises(rtkeeper.KeeperError, match=r"pid 1 is not a process of the "
                                                        "launcher"):
            rtkeeper.make_realtime(1, 10)
        try:
            rtkeeper.make_realtime(child.pid, 10)
        except rtkeeper.KeeperError as exc:     # not root: said, with the kernel's reason
            assert "SCHED_FIFO outside the user namespace" in str(exc)
        else:
            assert os.sched_getscheduler(child.pid) == os.SCHED_FIFO
    finally:
        child.kill()
        child.wait()
        os.close(req_w)                         # EOF: the keeper ends
        os.close(rep_r)
