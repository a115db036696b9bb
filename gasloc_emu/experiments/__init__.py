"""Experiment presets: arms x seeds, tables, plots and the results page.
"""
