"""Prefix sharing and copy-on-write scenarios, and prefix-cache replay of a trace."""
