"""Analysis of snapshots and meshes: power spectrum and multipoles."""

from .power import plot_power_spectrum, power_spectrum

__all__ = ["plot_power_spectrum", "power_spectrum"]
