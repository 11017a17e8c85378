"""Basis-function expansions of isolated systems: SCF and MEX (see docs/expansions.md)."""

from __future__ import annotations

from .mex import MEX
from .particles import ExpansionInput, expansion_input
from .scf import SCF, fit_series

__all__ = ["MEX", "ExpansionInput", "expansion_input", "SCF", "fit_series"]
