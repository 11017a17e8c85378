"""Basis-function expansions of isolated systems: SCF and MEX (see docs/expansions.md)."""

from __future__ import annotations

from .particles import ExpansionInput, expansion_input

__all__ = ["ExpansionInput", "expansion_input"]
