"""Credential provider ``testcred`` for the kernel's credential tests (side-loaded, never installed).

The binding's ``ref`` says how it answers:

* ``value:TEXT``: ``TEXT``, echoing the binding (a correct answer);
* ``fail``: ``CREDENTIAL_NOT_FOUND``; ``crash``: a ``RuntimeError``; ``other-error``: a non-credential ``SchedulerError``;
* ``mismatch:TEXT``: ``TEXT`` answered for another binding name; ``unbound:TEXT``: an answer that names no binding;
* ``wrong-medium:TEXT``: ``TEXT`` for medium ``stdin`` whatever the binding says;
* ``expired:TEXT``: ``TEXT`` that expired a second ago; ``sleep:SECONDS:TEXT``: ``TEXT`` after a pause;
* ``bytes:HEX``: the bytes ``HEX`` decodes to; ``not-a-credential``: a plain string instead of a ``ResolvedCredential``.
"""

from __future__ import annotations

import time

from scheduler.api import CredentialBinding, CredentialContext, ResolvedCredential, SchedulerError

#: Every context this process's provider saw (the tests read the lineage a chain child was resolved with).
SEEN: list[CredentialContext] = []


class TestCredentialProvider:
    """Credential driver ``testcred``."""

    plugin_api = 3
    capabilities: frozenset[str] = frozenset()

    def resolve(self, binding: CredentialBinding, context: CredentialContext) -> ResolvedCredential:
        """Answer as the binding's ref says (see the module docstring)."""
        SEEN.append(context)
        kind, _, rest = binding.ref.partition(":")
        if kind == "value":
            return ResolvedCredential.for_binding(binding, rest)
        if kind == "fail":
            raise SchedulerError("CREDENTIAL_NOT_FOUND", f"credential {binding.name!r}: nothing under this ref")
        if kind == "crash":
            raise RuntimeError("provider bug")
        if kind == "other-error":
            raise SchedulerError("SOMETHING_ELSE", "not a credential code")
        if kind == "mismatch":
            return ResolvedCredential.for_binding(binding, rest).__class__(
                value=rest, name=binding.name + "_other", medium=binding.present.medium, key=binding.present.key,
                file_name=binding.present.file_name, required=binding.required)
        if kind == "unbound":
            return ResolvedCredential(value=rest)
        if kind == "wrong-medium":
            return ResolvedCredential(value=rest, name=binding.name, medium="stdin", required=binding.required)
        if kind == "expired":
            return ResolvedCredential.for_binding(binding, rest, expires_at_ms=int(time.time() * 1000) - 1000)
        if kind == "sleep":
            seconds, _, text = rest.partition(":")
            time.sleep(float(seconds))
            return ResolvedCredential.for_binding(binding, text)
        if kind == "bytes":
            return ResolvedCredential.for_binding(binding, bytes.fromhex(rest))
        if kind == "not-a-credential":
            return "a plain string"  # type: ignore[return-value]
        raise SchedulerError("CREDENTIAL_REF_INVALID", f"testcred does not know ref kind {kind!r}")
