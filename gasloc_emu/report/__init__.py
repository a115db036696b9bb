"""What a run leaves and shows: run folders, the summary, the dashboard, comparisons.
"""
