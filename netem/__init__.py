"""Network emulation for gasloc-emu: bandwidth profiles, link plans, and the shapers that
enforce them.

Modules (import them directly; this package imports nothing on its own so that the probe agent,
started inside every worker namespace, starts fast):

- ``profiles``     named and file profiles -> a ``LinkPlan`` (rate, latency, caps per directed link)
- ``capabilities`` what this kernel and user can do; ``choose_shaper`` picks tc / userspace / none
- ``commands``     pure: plan + topology -> the ``ip``/``tc`` commands (what ``--dry-run`` prints)
- ``namespaces``   enter the user namespace, build and tear down the topology (``NetworkSession``)
- ``userspace``    sender pacing + receiver release queue, for delay and for machines without tc
- ``probe``        measure every link: configured vs measured
"""
