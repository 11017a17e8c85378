"""Analysis of snapshots and meshes: power spectrum and multipoles, linear theory."""

from .power import linear_power, plot_power_spectrum, power_spectrum

__all__ = ["linear_power", "plot_power_spectrum", "power_spectrum"]
