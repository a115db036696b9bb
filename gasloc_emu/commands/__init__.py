"""The command layer: click commands (`cli`), their bodies (`app`), the console script (`entry`).
"""
