"""`simulate`: every worker in one process on a virtual clock (rounds: `simulate`; asynchronous
gossip: `async_sim`; the clock: `virtual_clock`).
"""
