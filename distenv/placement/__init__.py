"""Placement: each local rank on the CPUs nearest its accelerator (docs/placement.md).

`topology` reads the node from the kernel, `binding` decides each rank's CPUs per mode (pure),
`apply` is what the entry points call; `cpus` is the kernel's CPU-list format.
"""
