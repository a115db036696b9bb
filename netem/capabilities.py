"""What this machine can do for shaping, detected (never assumed), and which shaper to use.

``probe()`` tries every feature the shaper needs inside a scratch network namespace
(``unshare -Urn``, or ``unshare -n`` when that is what works), so nothing on the host changes:
veth, bridge and ifb links; the htb, tbf, pfifo, netem and ingress qdiscs; the u32 classifier
in the exact form the shaper uses; and the mirred action. It also checks whether user
namespaces work (``unshare -Urnm true``), whether we already run inside one, and whether we
are real root. The result is cached per process.

``choose_shaper(requested, caps)`` turns ``net.shaper`` into a ``Decision``: which shaper
(``netem.shapers``: tc / userspace / none / a plugin) and which delay mechanism (netem, the
packet line, or the receiver release queue of ``netem.userspace``); the shaper decides.
"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field

from netem import delay as delay_modes
from netem import shapers

PROBE_TIMEOUT_S = 20.0
FEATURES = ("veth", "bridge", "ifb", "htb", "pfifo", "u32", "tbf", "netem", "ingress", "mirred",
            "packet")
# Without these the tc shaper cannot build its topology or its per-link classes.
TC_REQUIRED = ("veth", "bridge", "htb", "pfifo", "u32")

# One line per feature: "ok NAME" or "fail NAME first-error-line". Runs in a fresh network
# namespace, on its own loopback and a veth pair it creates there.
_PROBE_SCRIPT = r"""
t() { name=$1; shift; if out=$("$@" 2>&1); then echo "ok $name";
      else echo "fail $name $(printf '%s' "$out" | head -n 1)"; fi; }
t veth ip link add gpv0 type veth peer name gpv1
t bridge ip link add gpbr0 type bridge
t ifb ip link add gpifb0 type ifb
t htb tc qdisc add dev lo root handle 1: htb
tc class add dev lo parent 1: classid 1:10 htb rate 1mbit ceil 1mbit prio 0 >/dev/null 2>&1
t pfifo tc qdisc add dev lo parent 1:10 handle 10: pfifo limit 1000
t u32 tc filter add dev lo parent 1: protocol ip prio 1 u32 match ip dst 198.18.0.1/32 \
  match u16 0x0000 0xff80 at 2 flowid 1:10
t tbf tc qdisc add dev gpv0 root tbf rate 1mbit burst 10kb latency 50ms
t netem tc qdisc add dev gpv1 root handle 1: netem delay 1ms
t ingress tc qdisc add dev lo handle ffff: ingress
t mirred tc filter add dev lo parent ffff: protocol ip prio 1 u32 match u32 0 0 \
  action mirred egress redirect dev lo
t packet "$GASLOC_PROBE_PYTHON" -c 'import socket; socket.socket(socket.AF_PACKET, \
  socket.SOCK_RAW, 0x0300).close()'
"""


class CapabilityError(ValueError):
    """The requested shaping cannot be done on this machine; the message says why and what works."""


@dataclass(frozen=True)
class Capabilities:
    """What was detected. Every feature flag is True only if it was tried and worked."""

    root: bool                 # euid 0 in the host's user namespace (real root)
    in_userns: bool            # this process already runs in a user namespace (not the host's)
    userns: bool               # `unshare -Urnm true` works: we can re-exec into our own namespace
    tools: tuple[str, ...]     # which of ip, tc, unshare, mount were found on PATH
    probed_with: str           # the scratch-namespace command the features were tried in, or ""
    kernel: str = ""           # os.uname().release, for the run record
    features: dict[str, bool] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)

    def has(self, feature: str) -> bool:
        return self.features.get(feature, False)

    def __getattr__(self, name: str) -> bool:
        # caps.netem, caps.htb, ... read as flags; only for known feature names
        if name in FEATURES:
            return self.features.get(name, False)
        raise AttributeError(name)

    def tc_missing(self) -> str:
        """Why the tc shaper cannot run here, or "" when it can."""
        if not {"ip", "tc"} <= set(self.tools):
            return "the ip and tc programs (iproute2) are not installed"
        if not (self.userns or self.in_userns or self.root):
            return "user namespaces are disabled and this process is not root"
        missing = [f for f in TC_REQUIRED if not self.has(f)]
        if missing:
            return "; ".join(f"{f}: {self.errors.get(f, 'not tried')}" for f in missing)
        return ""

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Decision:
    """The shaper chosen for a run, the delay mechanism, and why (printed and recorded)."""

    shaper: str                # a netem.shapers name: 'tc' | 'userspace' | 'none' | a plugin's
    delay: str                 # a netem.delay mode: 'netem' | 'packet-line' | 'release-queue' |
    reason: str                # 'none'
    caps: Capabilities | None = None

    @property
    def shaper_kind(self) -> shapers.Shaper:
        """What the shaper does (``netem.shapers``)."""
        return shapers.shaper(self.shaper)

    @property
    def delay_mode(self) -> delay_modes.DelayMode:
        """What the delay mode can do (``netem.delay``)."""
        return delay_modes.MODES[self.delay]

    def as_dict(self) -> dict:
        out = {"shaper": self.shaper, "delay": self.delay, "reason": self.reason,
               "delay_faithful_to_tcp": self.delay_mode.faithful_to_tcp,
               "delay_by": self.delay_mode.where}
        if self.caps is not None:
            out["capabilities"] = self.caps.as_dict()
        return out


# ---------------------------------------------------------------- detection

def _run(argv: list[str], script: str | None = None) -> tuple[int, str]:
    """Exit status and combined output of a short command; 127 when it cannot start."""
    try:
        proc = subprocess.run(argv, input=script, capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_S,
                              env=os.environ | {"GASLOC_PROBE_PYTHON": sys.executable})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 127, str(exc)
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def in_user_namespace() -> bool:
    """True unless /proc/self/uid_map is the host's identity map of all 2^32 - 1 ids."""
    try:
        with open("/proc/self/uid_map") as fh:
            rows = [line.split() for line in fh if line.strip()]
    except OSError:
        return False
    return rows != [["0", "0", "4294967295"]]


def userns_works() -> bool:
    """Whether an unprivileged user, network and mount namespace can be made here."""
    return shutil.which("unshare") is not None and _run(["unshare", "-Urnm", "true"])[0] == 0


def _parse_probe(output: str) -> tuple[dict[str, bool], dict[str, str]]:
    features, errors = {}, {}
    for line in output.splitlines():
        parts = line.split(" ", 2)
        if len(parts) >= 2 and parts[0] in ("ok", "fail") and parts[1] in FEATURES:
            features[parts[1]] = parts[0] == "ok"
            if parts[0] == "fail":
                errors[parts[1]] = parts[2] if len(parts) > 2 else "failed"
    return features, errors


def _probe_features(prefixes: list[list[str]]) -> tuple[str, dict[str, bool], dict[str, str]]:
    """Run the probe script in the first scratch namespace that can be made."""
    last_error = "unshare is not installed"
    for prefix in prefixes:
        rc, out = _run([*prefix, "sh", "-s"], _PROBE_SCRIPT)
        features, errors = _parse_probe(out)
        if features:
            return " ".join(prefix), features, errors
        last_error = f"{' '.join(prefix)}: {out.splitlines()[0] if out else f'exit {rc}'}"
    return "", {}, {f: f"no scratch namespace to test in ({last_error})" for f in FEATURES}


@functools.lru_cache(maxsize=1)
def probe() -> Capabilities:
    """Detect what this machine can do (cached for the life of the process)."""
    tools = tuple(t for t in ("ip", "tc", "unshare", "mount") if shutil.which(t))
    inside = in_user_namespace()
    root = os.geteuid() == 0 and not inside
    userns = userns_works()
    prefixes = []
    if "unshare" in tools:
        prefixes = [["unshare", "-Urn"]] if userns else []
        if root or inside:
            prefixes.append(["unshare", "-n"])
    probed_with, features, errors = _probe_features(prefixes)
    return Capabilities(root=root, in_userns=inside, userns=userns, tools=tools,
                        probed_with=probed_with, kernel=os.uname().release,
                        features=features, errors=errors)


# ---------------------------------------------------------------- choice

def choose_shaper(requested: str, caps: Capabilities, delay: str = "auto") -> Decision:
    """tc when asked for or when ``auto`` finds namespaces + htb; else userspace; 'none' only on
    request (``netem.shapers.resolve``). ``delay`` (``net.delay``): how the links are delayed;
    the shaper decides (``Shaper.decide``): tc chooses among the modes the kernel has
    (``netem.delay.choose``), a shaper with a delay mode of its own refuses any other
    explicit request."""
    if delay not in delay_modes.REQUESTS:
        raise CapabilityError(f"net.delay = {delay!r} is not allowed; expected one of "
                              f"{', '.join(delay_modes.REQUESTS)}")
    try:
        kind, why = shapers.resolve(requested, caps.tc_missing())
    except shapers.ShaperError as exc:
        raise CapabilityError(str(exc)) from None
    return kind.decide(caps, delay, why, shapers.asked(requested) is None)


def fixed_delay_decision(kind: shapers.Shaper, caps: Capabilities | None, delay: str,
                         why: str) -> Decision:
    """The decision of a shaper that has one delay mode of its own (userspace: the release
    queue; none: none): an explicit other ``delay`` is refused, naming the shaper's."""
    own = kind.delay_modes[0]
    if not kind.shapes:
        return Decision(kind.name, own, why, caps)
    if delay not in ("auto", own):
        raise CapabilityError(f"net.delay = {delay!r} needs the tc shaper's namespaces, and this "
                              f"run has the {kind.name} shaper ({why}); use net.delay = 'auto'")
    unseen = "" if delay_modes.MODES[own].faithful_to_tcp else " (latency not seen by TCP)"
    return Decision(kind.name, own, f"{why}: {kind.where}{unseen}", caps)
