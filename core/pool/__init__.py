"""The KV block pool: block tables, prefix cache, fork and copy-on-write, reclamation."""
