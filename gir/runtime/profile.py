"""The CPU engine's profiler moved to gir/backends/cpu/profile.py; scripts import it from here."""
from gir.backends.cpu.profile import StepTime, copy_bandwidth, profile, report, table

__all__ = ["StepTime", "copy_bandwidth", "profile", "report", "table"]
