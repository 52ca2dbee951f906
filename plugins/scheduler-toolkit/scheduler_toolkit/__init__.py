"""scheduler-toolkit: the helpers scheduler plugins share, one module per job.

``scheduler.api`` is the plugin contract (the provider Protocols, what a provider receives and
returns, the errors, ``hookimpl``, ``PLUGIN_API_VERSION``); this distribution is everything
else several plugins need. It is released with the kernel and pinned to its minor series, the
one first-party distribution allowed to import kernel internals: where the kernel itself uses a
helper, the code stays in the kernel and a module here re-exports it (the same object); where
only plugins use it, the code lives here.

* ``scheduler_toolkit.http``: HTTP failures as delivery errors, ``Retry-After``, endpoint
  labels, attachments, the pooled ``httpx`` client, the abortable streamed request;
* ``scheduler_toolkit.prompt_safety``: the prompt sanitiser and the injection tripwire;
* ``scheduler_toolkit.process``: process identity, process-group kills, bounded helper programs;
* ``scheduler_toolkit.evidence``: the payload and envelope checks of evidence providers;
* ``scheduler_toolkit.output``: stream capture into the artifact store, digest-checked reads;
* ``scheduler_toolkit.structured``: the structured-output record (``output_format``);
* ``scheduler_toolkit.canonical``: json-sort-v1 canonical JSON and ``sha256:`` digests;
* ``scheduler_toolkit.options``: plugin option and settings classes from JSON objects;
* ``scheduler_toolkit.settings``: a plugin's settings table, secret references and schemes;
* ``scheduler_toolkit.timeutil``: epoch milliseconds and ISO-8601;
* ``scheduler_toolkit.run_ids``: a run id as listings show it (``short_run_id``);
* ``scheduler_toolkit.cli``: the CLI's output contract for plugin commands (``emit``, ``table``);
* ``scheduler_toolkit.store``: what a store plugin builds its schema and migrations from;
* ``scheduler_toolkit.steps``: the run step contract and its base class (``scheduler.steps``);
* ``scheduler_toolkit.identity``: who a run acts as (resolved identities, delegations);
* ``scheduler_toolkit.proofs``: the JSON proof document of signature proofs and the bytes it signs;
* ``scheduler_toolkit.types``: value types nested in what a provider receives or returns, the
  result types of optional members, and the kernel's vocabularies (capabilities, error codes).

Importing this package imports none of them: each module costs only what it needs.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
