"""One worker's training: the model, the corpus and shards, the compute model, the worker loop
(inner AdamW phase, then the algorithm's outer step), devices.
"""
