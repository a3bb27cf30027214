"""core/host_memory.py: the memory available, read from /proc/meminfo or os.sysconf, and the check."""

from __future__ import annotations

import os

import pytest

from kvcalc.core import host_memory


def test_reads_mem_available_in_kib(tmp_path, monkeypatch):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24684092 kB\nMemFree:  100 kB\nMemAvailable:   23990716 kB\n")
    monkeypatch.setattr(host_memory, "_MEMINFO", str(meminfo))
    assert host_memory.available_bytes() == 23_990_716 * 1024  # the kernel's "kB" are KiB


def test_falls_back_to_sysconf_then_to_unknown(tmp_path, monkeypatch):
    monkeypatch.setattr(host_memory, "_MEMINFO", str(tmp_path / "absent"))
    pages = {"SC_AVPHYS_PAGES": 1000, "SC_PAGE_SIZE": 4096}
    monkeypatch.setattr(os, "sysconf", lambda name: pages[name])
    assert host_memory.available_bytes() == 4_096_000

    def unsupported(name):
        raise ValueError(name)

    monkeypatch.setattr(os, "sysconf", unsupported)
    assert host_memory.available_bytes() is None
    host_memory.check_fits(10**30, "anything", "nothing to fix")  # unknown memory: nothing is refused


def test_this_machine_reports_some_memory():
    available = host_memory.available_bytes()
    assert available is None or available > 2**20


def test_check_fits_names_both_figures_and_the_fix(monkeypatch):
    monkeypatch.setattr(host_memory, "available_bytes", lambda: 2**30)
    host_memory.check_fits(2**30, "exactly all of it", "-")  # equal fits
    with pytest.raises(ValueError, match=r"^the work would take 1.00 GiB of memory; this machine has 1.00 GiB "
                                         r"available: do less$"):
        host_memory.check_fits(2**30 + 1, "the work", "do less")
