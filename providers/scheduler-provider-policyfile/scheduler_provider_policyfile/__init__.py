"""``policyfile``: authorization_ref decisions from a small declarative TOML rules file (see README.md)."""

from __future__ import annotations

from scheduler_provider_policyfile.provider import PolicyFileProvider, PolicyFileSettings, load_rules

__all__ = ["PolicyFileProvider", "PolicyFileSettings", "load_rules"]
