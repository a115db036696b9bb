"""Scenarios, pure rules with injected clocks: events, a checked scenario, files and traces, the
timeline, what it means per worker and round (`world`), links under it, what the record says.
"""
