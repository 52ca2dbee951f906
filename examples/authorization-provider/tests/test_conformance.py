"""The teams provider against the scheduler's authorization conformance cases, through the pytest adapter.

One test per case of ``conformance-fixtures/v2/authorization/``: the provider is loaded
through its entry point as the scheduler loads it, and its setup adapter (entry point
``scheduler.conformance_adapters:teams``, ``scheduler_authz_teams/conformance.py``) writes
each case's policy as a team. Cases about a job's name are skipped with the reason (teams
decides by principal only).
"""

from __future__ import annotations

from scheduler.testing import AuthorizationProviderConformance


class TestTeamsConformance(AuthorizationProviderConformance):
    provider_name = "teams"
