"""Several hosts: which node this is (`roles`), the rendezvous store, a node's side of the run.
"""
