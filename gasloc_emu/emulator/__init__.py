"""`run`: worker processes on a shaped network (the launcher, its supervisor, the processes, the
worker's entry point, the launch contract, the network plan, asynchronous pairing).
"""
