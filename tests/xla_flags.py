"""XLA_FLAGS for a test's subprocess: its own device count, the suite's other flags kept (the
fast suite's compile level, Makefile `FAST_SUITE_XLA_FLAGS`)."""

import os

DEVICES = "--xla_force_host_platform_device_count"


def with_devices(devices: int) -> str:
    """E.g. "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0" in
    the environment, devices=2 -> "--xla_force_host_platform_device_count=2
    --xla_backend_optimization_level=0"."""
    kept = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(DEVICES)]
    return " ".join([f"{DEVICES}={devices}", *kept])
