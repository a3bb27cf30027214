"""The host and disk links of the prefix-cache tiers, as `kvcalc share` and `kvcalc sim` both default them
(bytes/s per GPU; --host-bw, --disk-bw). Free of numpy: sim's options read them to build the command line."""

DEFAULT_HOST_BANDWIDTH = 25e9  # bytes/s: PCIe 4.0 x16 as reached in practice; kvcalc sim's swap default
DEFAULT_DISK_BANDWIDTH = 5e9  # bytes/s: one NVMe PCIe 4.0 SSD's sequential read (about 7 GB/s on paper)
