"""Payload adapters: how an executor's conformance cases say *what* to do, not *how* in shell.

An executor conformance case describes a behaviour ("print this text to stdout",
"exit with 3", "run for 30 s", "ignore SIGTERM", "copy stdin to stdout"...) as a list
of ``Step``\\ s. Each executor supplies a small **payload adapter** that turns a
``Behaviour`` into its own job spec fields: ``payload_message`` in its payload language
(shell, Python, an agent prompt...) and, when the behaviour needs them, its own
``executor_options`` (for example the option that feeds stdin). The engine validates
those fields like ``jobs add`` does and runs the job.

An adapter is any object with

    conformance_payload(behaviour: Behaviour) -> dict   # {"payload_message": ..., "executor_options": {...}}

and, optionally, ``languages``: the raw payload languages it also accepts verbatim
(``{"posix-shell"}``: the shell-only cases under ``executor/posix-shell/``), and ``settings``:
the ``[executors.NAME]`` table the executor needs on the host to run its cases (an endpoint,
a key reference; the host's settings file gives it, the engine never does). An adapter with
``settings`` gets the ``settings: empty`` case: a fresh instance of the executor, configured
with an empty table, must refuse to be configured or end the run ``error`` with an
``error_code``, never run the payload; an adapter without them skips it. When it
cannot express a behaviour it raises ``NotImplementedError("why")`` (a builtin, so an
adapter needs no kernel import): the case is then **skipped** with that reason, never
passed.

The engine finds an executor's adapter, in this order: the one given explicitly
(``--adapter MODULE:ATTR``, ``payload_adapter=`` of ``run_kind`` or of a pytest
class); the executor itself when it has a ``conformance_payload`` method; the entry
point named like the executor in the group ``scheduler.conformance_adapters``. An
executor with none of them is one failure, ``CONFORMANCE_NO_PAYLOAD_ADAPTER``.

``PosixShellPayloads`` is the stock adapter for executors whose payload is a POSIX
shell script; set ``stdin_option`` / ``env_policy_option`` to the names of your
``executor_options`` fields when your executor has them.
"""

from __future__ import annotations

import importlib
import shlex
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from scheduler.base.entry_points import dist_name, entry_points_of
from scheduler.base.errors import SchedulerError
from scheduler.base.plugin_kinds import kind_named

#: Entry-point group of payload adapters; the entry point's name is the executor's driver name.
ADAPTER_GROUP = kind_named("conformance_adapter").group

#: Every step action a behaviour may use, with what it means (the schema's ``step`` lists the same).
ACTIONS: dict[str, str] = {
    "stdout": "write this text (UTF-8) to standard output",
    "stderr": "write this text (UTF-8) to standard error",
    "stdout_hex": "write these raw bytes (hex) to standard output",
    "stdout_zeros": "write this many zero bytes to standard output",
    "stdout_env": "write the value of this environment variable and a newline to standard output (an empty line when unset)",
    "stdin_to_stdout": "copy everything on standard input to standard output",
    "sleep_ms": "keep running (busy or blocked) for this many milliseconds",
    "ignore_sigterm": "ignore SIGTERM from here on (a polite stop no longer works)",
    "spawn_child_ms": "start a background child process that runs this many milliseconds, not attached to the output streams",
    "exit": "end now with this exit status",
}

#: Raw payload languages the stock corpus has cases for (a subdirectory of ``executor/`` each).
LANGUAGES = ("posix-shell",)

#: Fields an adapter may return; everything else about the job comes from the case.
ADAPTER_FIELDS = frozenset({"payload_message", "executor_options"})


@attrs.frozen
class Step:
    """One step of a behaviour: an action from ``ACTIONS`` and its argument."""

    action: str = attrs.field(validator=attrs.validators.in_(ACTIONS))
    value: Any = None


@attrs.frozen(kw_only=True)
class RawPayload:
    """A payload written in one language, verbatim (only adapters that list the language get it)."""

    language: str
    text: str


@attrs.frozen(kw_only=True)
class Behaviour:
    """What one executor case asks the payload to do; handed to ``conformance_payload``.

    Exactly one of ``steps`` (the portable form) and ``raw`` is set. ``stdin`` is text
    the payload must receive on standard input; ``env_policy`` (``minimal`` or
    ``inherit``) is the environment policy the executor must apply. Both map to the
    executor's own options, so an adapter that has no such option declines them.
    """

    case_id: str
    steps: tuple[Step, ...] = ()
    raw: RawPayload | None = None
    stdin: str | None = None
    env_policy: str | None = None

    @classmethod
    def from_case_input(cls, case_id: str, data: Mapping[str, Any]) -> Behaviour:
        """Build the behaviour from an executor case's ``input`` (already schema-validated)."""
        steps: list[Step] = []
        for raw_step in data.get("behaviour", ()):
            ((action, value),) = raw_step.items()
            steps.append(Step(action, value))
        payload = data.get("payload")
        raw = RawPayload(language=payload["language"], text=payload["text"]) if payload else None
        return cls(case_id=case_id, steps=tuple(steps), raw=raw, stdin=data.get("stdin"), env_policy=data.get("env_policy"))

    def actions(self) -> list[str]:
        """The step actions in order (handy in an adapter's error messages)."""
        return [s.action for s in self.steps]


def _seconds(ms: int) -> str:
    """``30000`` -> ``30``, ``250`` -> ``0.25`` (``sleep`` of GNU coreutils, busybox and BSD take fractions)."""
    whole, rest = divmod(int(ms), 1000)
    return str(whole) if rest == 0 else f"{whole}.{rest:03d}".rstrip("0")


class PosixShellPayloads:
    """The stock payload adapter for executors whose ``payload_message`` is a POSIX shell script.

    Every step becomes one shell command line (``printf``, ``head -c``, ``cat``,
    ``sleep``, ``trap '' TERM``, ``exit``); raw cases written in ``posix-shell`` are
    passed through verbatim. ``stdin`` and ``env_policy`` need executor options: set
    ``stdin_option`` / ``env_policy_option`` to their names in your ``executor_options``
    (the ``shell`` executor: ``stdin_text`` and ``env_policy``); left ``None`` they are
    declined with ``NotImplementedError`` and those cases are skipped.
    """

    languages: frozenset[str] = frozenset({"posix-shell"})
    #: Name of the ``executor_options`` field that carries the payload's standard input, if any.
    stdin_option: str | None = None
    #: Name of the ``executor_options`` field that takes ``minimal`` / ``inherit``, if any.
    env_policy_option: str | None = None

    def conformance_payload(self, behaviour: Behaviour) -> dict[str, Any]:
        """The job spec fields that make a POSIX shell executor act out ``behaviour``."""
        options = self.options_for(behaviour)
        if behaviour.raw is not None:
            if behaviour.raw.language not in self.languages:
                raise NotImplementedError(f"payloads in {behaviour.raw.language} are not understood")
            text = behaviour.raw.text
        else:
            text = self.script(behaviour.steps)
        fields: dict[str, Any] = {"payload_message": text}
        if options:
            fields["executor_options"] = options
        return fields

    def options_for(self, behaviour: Behaviour) -> dict[str, Any]:
        """The ``executor_options`` that ``stdin`` and ``env_policy`` need; decline what has no option."""
        options: dict[str, Any] = {}
        if behaviour.stdin is not None:
            if not self.stdin_option:
                raise NotImplementedError("the executor has no option that feeds standard input to its payload")
            options[self.stdin_option] = behaviour.stdin
        if behaviour.env_policy is not None:
            if not self.env_policy_option:
                raise NotImplementedError("the executor has no environment-policy option")
            options[self.env_policy_option] = behaviour.env_policy
        return options

    def script(self, steps: Iterable[Step]) -> str:
        """One shell command line per step."""
        return "\n".join(self.command(step) for step in steps) or ":"

    def command(self, step: Step) -> str:
        """The shell command of one step (override to change or decline a single action)."""
        action, value = step.action, step.value
        if action == "stdout":
            return f"printf '%s' {shlex.quote(value)}"
        if action == "stderr":
            return f"printf '%s' {shlex.quote(value)} >&2"
        if action == "stdout_hex":
            octal = "".join(f"\\{byte:03o}" for byte in bytes.fromhex(value))
            return f"printf '{octal}'"
        if action == "stdout_zeros":
            return f"head -c {int(value)} /dev/zero"
        if action == "stdout_env":
            return f"printf '%s\\n' \"${{{value}-}}\""
        if action == "stdin_to_stdout":
            return "cat"
        if action == "sleep_ms":
            return f"sleep {_seconds(value)}"
        if action == "ignore_sigterm":
            return "trap '' TERM"
        if action == "spawn_child_ms":
            return f"sleep {_seconds(value)} </dev/null >/dev/null 2>&1 &"
        if action == "exit":
            return f"exit {int(value)}"
        raise NotImplementedError(f"step {action!r} has no shell form")


def _instantiate(obj: Any) -> Any:
    """An adapter class is instantiated without arguments; an object is used as it is."""
    return obj() if isinstance(obj, type) else obj


def load_adapter_spec(spec: str, what: str = "payload") -> Any:
    """Import ``MODULE:ATTR`` and return the object (a class is instantiated); ``CONFORMANCE_ADAPTER_INVALID`` if that fails.

    ``what`` names the kind of adapter in messages (``payload`` for executors, ``service`` for channels).
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise SchedulerError("CONFORMANCE_ADAPTER_INVALID", f"{what} adapter {spec!r} is not MODULE:ATTR")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
        return _instantiate(target)
    except Exception as exc:  # noqa: BLE001 - any import problem is the adapter's
        raise SchedulerError(
            "CONFORMANCE_ADAPTER_INVALID", f"{what} adapter {spec!r} could not be loaded: {type(exc).__name__}: {exc}"
        ) from None


def import_adapter(spec: str) -> Any:
    """Import ``MODULE:ATTR`` (``--adapter``) and return the adapter object; ``CONFORMANCE_ADAPTER_INVALID`` if that fails."""
    return check_adapter(load_adapter_spec(spec, "payload"), spec)


def adapter_from_entry_points(name: str, method: str, what: str) -> Any:
    """The adapter registered as ``name`` in ``scheduler.conformance_adapters`` that has ``method``; None when none is.

    Executors and channels share the group, so an executor and a channel of the same name
    may both register one: every entry point of that name is loaded and the first with the
    kind's method wins. One that fails to load, or only ones without the method, are
    ``CONFORMANCE_ADAPTER_INVALID``.
    """
    failures: list[str] = []
    for ep in (ep for ep in entry_points_of(ADAPTER_GROUP) if ep.name == name):
        # Not load_driver: an adapter is not a provider (no plugin_api); the entry point's target is loaded as is.
        where = f"entry point {ADAPTER_GROUP}:{name} ({ep.value}) from {dist_name(ep)}"
        try:
            adapter = _instantiate(ep.load())
        except Exception as exc:  # noqa: BLE001 - an adapter that cannot be loaded or built is reported, not raised
            failures.append(f"{what} adapter {where} failed to load: {type(exc).__name__}: {exc}")
            continue
        if callable(getattr(adapter, method, None)):
            return adapter
        failures.append(f"{what} adapter {where} has no {method}() method")
    if failures:
        raise SchedulerError("CONFORMANCE_ADAPTER_INVALID", "; ".join(failures))
    return None


def check_adapter(adapter: Any, where: str) -> Any:
    """Return ``adapter`` if it has a callable ``conformance_payload``; else ``CONFORMANCE_ADAPTER_INVALID``."""
    if not callable(getattr(adapter, "conformance_payload", None)):
        raise SchedulerError(
            "CONFORMANCE_ADAPTER_INVALID", f"payload adapter {where} has no conformance_payload(behaviour) method"
        )
    return adapter


def resolve_payload_adapter(name: str | None, provider: Any, explicit: Any = None) -> Any:
    """The payload adapter for the executor ``name`` / ``provider`` (order: see the module docstring).

    ``explicit`` may be an adapter object, an adapter class, or a ``MODULE:ATTR`` string.
    Raises ``CONFORMANCE_NO_PAYLOAD_ADAPTER`` when there is none, and
    ``CONFORMANCE_ADAPTER_INVALID`` when the one found cannot be loaded or used.
    """
    if explicit is not None:
        if isinstance(explicit, str):
            return import_adapter(explicit)
        return check_adapter(_instantiate(explicit), repr(explicit))
    if callable(getattr(provider, "conformance_payload", None)):
        return provider
    if name:
        found = adapter_from_entry_points(name, "conformance_payload", "payload")
        if found is not None:
            return found
    label = f"executor {name!r}" if name else f"executor {type(provider).__name__}"
    raise SchedulerError(
        "CONFORMANCE_NO_PAYLOAD_ADAPTER",
        f"{label} has no conformance payload adapter, so its cases cannot be written in its payload language: give the "
        f"executor a conformance_payload(behaviour) method, register an entry point named {name or 'after the executor'!r} "
        f"in the group {ADAPTER_GROUP}, or pass one explicitly (--adapter MODULE:ATTR, payload_adapter=...)",
    )


__all__ = [
    "ACTIONS",
    "ADAPTER_FIELDS",
    "ADAPTER_GROUP",
    "LANGUAGES",
    "Behaviour",
    "PosixShellPayloads",
    "RawPayload",
    "Step",
    "adapter_from_entry_points",
    "check_adapter",
    "import_adapter",
    "load_adapter_spec",
    "resolve_payload_adapter",
]
