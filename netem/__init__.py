"""Network emulation for gasloc-emu: bandwidth profiles, link plans, and the shapers that
enforce them.

Modules (import them directly; this package imports nothing on its own so that the probe agent,
started inside every worker namespace, starts fast):

- ``profiles``     named and file profiles -> a ``LinkPlan`` (rate, latency, caps per directed link)
- ``shapers``     the ways a rate is enforced (tc, userspace, none) as objects: what each does
- ``delay``        the ways a latency, jitter and loss reach the packets (netem, packet line, ...)
- ``capabilities`` what this kernel and user can do; ``choose_shaper`` picks a shaper and delay
- ``commands``     pure: plan + topology -> the ``ip``/``tc`` commands (what ``--dry-run`` prints)
- ``namespaces``   enter the user namespace, build and tear down the topology (``NetworkSession``)
- ``userspace``    sender pacing + receiver release queue, for delay and for machines without tc
- ``probe``        measure every link: configured vs measured
"""
