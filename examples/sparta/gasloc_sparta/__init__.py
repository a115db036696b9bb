"""An example gasloc-emu plugin package: the SPARTA algorithm (``algo.name = sparta``) and a
small MLP language model (``model.preset = mlp-lm``), registered by this package's
pyproject.toml under the entry-point groups ``gasloc_emu.algorithms`` and ``gasloc_emu.models``.
"""
from __future__ import annotations

from .model import tiny_mlp_lm
from .sparta import SPARTA, SpartaSettings

__all__ = ["SPARTA", "SpartaSettings", "tiny_mlp_lm"]
