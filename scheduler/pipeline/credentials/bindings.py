"""A job's ``credentials`` list: validation, normalisation and the checks made at ``jobs add``.

A binding is ``{"name", "provider", "ref", "present": {"medium", "key"?, "file_name"?},
"required"?, "options"?, "revoke"?}``: which credential provider resolves ``ref`` at run time and how
its value reaches the payload (``env``: variable ``key``; ``file``: a 0600 file named
``file_name`` in a private per-run directory, its path in ``CREDENTIAL_<NAME>_FILE``;
``stdin``: the payload's standard input). A spec never holds a value, only references.

Everything here is pure (no database, no plugin import) except ``credential_problems``,
which reads the capabilities of an already-loaded executor and the provider's
``options_class``. Problems are field problems (``VALIDATION_FAILED`` details) with
``CREDENTIAL_*`` codes; nothing is stored when there is one.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Literal, Required, TypedDict

from scheduler.base.options import build_options, option_problems
from scheduler.core.members import options_class_of
from scheduler.core.processes import LOADER_ENV_PREFIXES, is_loader_variable
from scheduler.core.rows import JSONObject
from scheduler.core.spec import JobSpec
from scheduler.plugins.options import provider_for
from scheduler.plugins.protocols import CredentialBinding, CredentialPresent

Medium = Literal["env", "file", "stdin"]
_MEDIA: dict[object, Medium] = {"env": "env", "file": "file", "stdin": "stdin"}


class Present(TypedDict, total=False):
    """How a normalised binding's value reaches the payload: ``medium``, with ``key`` (env) or ``file_name`` (file)."""

    medium: Required[Medium]
    key: str
    file_name: str


class Binding(TypedDict, total=False):
    """A normalised binding as the job stores it (``check_bindings``): references, never a value."""

    name: Required[str]
    provider: Required[str]
    ref: Required[str]
    present: Required[Present]
    required: Required[bool]
    options: JSONObject
    #: ``after_run``: the provider revokes the value when the run ends (kept only when set, so digests stay).
    revoke: str


#: Where ``check_bindings`` reports: ``add(field, message, code)``.
AddProblem = Callable[[str, str, str], object]

#: Which media exist, and the executor capability each needs.
MEDIA = ("env", "file", "stdin")
MEDIUM_CAPABILITY = {m: f"credentials-{m}" for m in MEDIA}
#: ``revoke`` values: ``never`` (the default, left out of the stored binding) or ``after_run``.
REVOKE_WHEN = ("never", "after_run")
#: ``child_credential_policy`` values (docs/credentials.md explains each).
CHILD_POLICIES = ("none", "inherit", "downscope", "independent")
MAX_BINDINGS = 32

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")
_DRIVER = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_KEYS = frozenset({"name", "provider", "ref", "present", "required", "options", "revoke"})
_PRESENT_KEYS = frozenset({"medium", "key", "file_name"})

#: Variables a credential may never set (compared upper-cased): they change how the shell, the
#: dynamic linker or an interpreter behaves, or they are the scheduler's own.
RESERVED_ENV_KEYS = frozenset({
    "PATH", "HOME", "SHELL", "IFS", "ENV", "BASH_ENV", "CDPATH", "GLOBIGNORE", "SHELLOPTS", "BASHOPTS", "PS4",
    "PROMPT_COMMAND", "USER", "LOGNAME", "PWD", "OLDPWD", "TMPDIR", "TEMP", "TMP", "LANG", "LANGUAGE", "TERM", "TZ",
    "HOSTNAME", "MAIL", "NODE_OPTIONS", "NODE_PATH", "PERL5OPT", "PERL5LIB", "PERLLIB", "RUBYOPT", "RUBYLIB",
    "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "GCONV_PATH", "HOSTALIASES", "LOCALDOMAIN", "RES_OPTIONS", "MALLOC_CHECK_",
    "NLSPATH", "GIT_EXEC_PATH", "GIT_SSH", "GIT_SSH_COMMAND", "SSH_AUTH_SOCK", "EDITOR", "VISUAL", "PAGER",
})
#: Reserved prefixes (upper-cased): loader and interpreter hooks, locale, the scheduler's own variables.
RESERVED_ENV_PREFIXES = (*LOADER_ENV_PREFIXES, "PYTHON", "SCHEDULER_", "BASH_FUNC_", "LC_", "GIT_CONFIG", "OPENSSL_", "SSL_CERT_")
_CREDENTIAL_FILE_VAR = re.compile(r"^CREDENTIAL_.*_FILE$")


def file_variable(name: str) -> str:
    """``CREDENTIAL_<NAME>_FILE``: the variable holding a file presentation's path."""
    return f"CREDENTIAL_{name.upper()}_FILE"


def reserved_key_reason(key: str) -> str | None:
    """Why ``key`` may not be set by a credential, or None (case-insensitive: ``path`` is refused like ``PATH``)."""
    upper = key.upper()
    if upper in RESERVED_ENV_KEYS:
        return f"{key} changes how the payload's shell or programs behave"
    if is_loader_variable(upper) and not upper.startswith(LOADER_ENV_PREFIXES):
        return f"{key} makes the dynamic loader or libc load code or data"
    prefix = next((p for p in RESERVED_ENV_PREFIXES if upper.startswith(p)), None)
    if prefix:
        return f"variables starting with {prefix} are reserved"
    if _CREDENTIAL_FILE_VAR.match(upper):
        return "CREDENTIAL_*_FILE variables are set by the kernel for file presentations"
    return None


def _text(value: object, limit: int) -> bool:
    return isinstance(value, str) and 0 < len(value) <= limit and "\x00" not in value


def check_bindings(raw: object, add: AddProblem) -> list[Binding] | None:
    """Validate and normalise a ``credentials`` value; ``add(field, message, code)`` records each problem.

    Returns the normalised list (``required`` always present, ``present`` without unset
    keys, ``options`` only when non-empty), or None when there was a problem.
    """
    if not isinstance(raw, list):
        add("credentials", "must be a list of bindings", "INVALID_TYPE")
        return None
    if len(raw) > MAX_BINDINGS:
        add("credentials", f"at most {MAX_BINDINGS} bindings", "TOO_LARGE")
        return None
    out: list[Binding] = []
    bad = False
    for i, item in enumerate(raw):
        where = f"credentials[{i}]"
        binding = _check_one(item, where, add)
        if binding is None:
            bad = True
        else:
            out.append(binding)
    problems = _cross_check(out, add)  # also among the valid ones, so every problem is reported at once
    return None if bad or problems else out


def _check_one(item: object, where: str, add: AddProblem) -> Binding | None:
    if not isinstance(item, dict):
        add(where, "must be an object {name, provider, ref, present}", "CREDENTIAL_BINDING_INVALID")
        return None
    problems = 0

    def bad(field: str, message: str, code: str = "CREDENTIAL_BINDING_INVALID") -> None:
        nonlocal problems
        problems += 1
        add(f"{where}.{field}" if field else where, message, code)

    for key in sorted(set(item) - _KEYS, key=str):
        bad(str(key), f"unknown key {key!r} (a binding holds name, provider, ref, present, required, options, revoke;"
                      " never a value)")
    name, provider, ref, present = item.get("name"), item.get("provider"), item.get("ref"), item.get("present")
    if not isinstance(name, str) or not _NAME.match(name):
        bad("name", "must be a name of letters, digits and _ starting with a letter (max 64)")
    if not isinstance(provider, str) or not _DRIVER.match(provider):
        bad("provider", "must be a credential provider name ([a-z0-9_.-], max 64)")
    if not _text(ref, 1024):
        bad("ref", "must be a non-empty reference of at most 1024 characters (what the provider resolves, never a value)")
    required = item.get("required", True)
    if not isinstance(required, bool):
        bad("required", "must be true or false")
    revoke = item.get("revoke", "never")
    if revoke not in REVOKE_WHEN:
        bad("revoke", "must be never or after_run (the provider revokes the value when the run ends)")
    options = item.get("options", {})
    if options is None:
        options = {}
    if not isinstance(options, dict):
        bad("options", "must be an object of the provider's options")
    norm_present: Present = {"medium": "env"}
    if not isinstance(present, dict):
        bad("present", 'must be an object {"medium": "env"|"file"|"stdin", "key"?, "file_name"?}')
    else:
        for key in sorted(set(present) - _PRESENT_KEYS, key=str):
            bad(f"present.{key}", f"unknown key {key!r} (medium, key, file_name)")
        medium = present.get("medium")
        key, file_name = present.get("key"), present.get("file_name")
        if medium not in MEDIA:
            bad("present.medium", "must be one of env, file, stdin")
        norm_present["medium"] = _MEDIA.get(medium, "env")  # a medium not in MEDIA is a problem: nothing is returned
        if medium == "env":
            if not isinstance(key, str) or not _ENV_KEY.match(key):
                bad("present.key", "an env presentation needs key: an environment variable name ([A-Za-z_][A-Za-z0-9_]*)")
            else:
                reason = reserved_key_reason(key)
                if reason:
                    bad("present.key", f"{key} is reserved: {reason}", "CREDENTIAL_ENV_KEY_RESERVED")
                norm_present["key"] = key
        elif key is not None:
            bad("present.key", f"key is only for medium env (a {medium} presentation sets no variable of your choosing)")
        if medium == "file":
            if file_name is not None:
                if not isinstance(file_name, str) or not _FILE_NAME.match(file_name) or file_name in (".", ".."):
                    bad("present.file_name", "must be a plain file name ([A-Za-z0-9._-], no /, max 128)", "PATH_TRAVERSAL"
                        if isinstance(file_name, str) and ("/" in file_name or ".." in file_name) else "CREDENTIAL_BINDING_INVALID")
                else:
                    norm_present["file_name"] = file_name
        elif file_name is not None:
            bad("present.file_name", "file_name is only for medium file")
    if problems or not isinstance(name, str) or not isinstance(provider, str) or not isinstance(ref, str):
        return None
    out: Binding = {"name": name, "provider": provider, "ref": ref, "present": norm_present, "required": required}
    if options:
        out["options"] = dict(options)
    if revoke == "after_run":
        out["revoke"] = "after_run"
    return out


def _cross_check(bindings: list[Binding], add: AddProblem) -> int:
    """Duplicates and media that cannot mix; returns the number of problems."""
    problems = 0
    names: dict[str, int] = {}
    keys: dict[str, int] = {}
    files: dict[str, int] = {}
    stdin: list[int] = []
    for i, b in enumerate(bindings):
        where = f"credentials[{i}]"
        upper = b["name"].upper()
        if upper in names:
            add(f"{where}.name", f"duplicate name {b['name']!r} (also credentials[{names[upper]}]; names are compared "
                "case-insensitively)", "CREDENTIAL_DUPLICATE")
            problems += 1
        names.setdefault(upper, i)
        present = b["present"]
        variable = present.get("key") if present["medium"] == "env" else file_variable(b["name"]) if present["medium"] == "file" else None
        if variable is not None:
            if variable in keys:
                add(f"{where}.present", f"variable {variable} is already set by credentials[{keys[variable]}]", "CREDENTIAL_DUPLICATE")
                problems += 1
            keys.setdefault(variable, i)
        if present["medium"] == "file":
            fname = present.get("file_name") or b["name"]
            if fname in files:
                add(f"{where}.present.file_name", f"file name {fname!r} is already used by credentials[{files[fname]}]",
                    "CREDENTIAL_DUPLICATE")
                problems += 1
            files.setdefault(fname, i)
        if present["medium"] == "stdin":
            stdin.append(i)
    for i in stdin[1:]:
        add(f"credentials[{i}].present.medium", f"only one credential can be presented on stdin (credentials[{stdin[0]}] "
            "already is)", "CREDENTIAL_MEDIA_CONFLICT")
        problems += 1
    return problems


def credential_problems(spec: JobSpec, executor: object | None) -> list[dict[str, str]]:
    """Problems of a validated spec's bindings against its target, executor and providers (``jobs add``/``validate``).

    The main-session target refuses credentials; the executor must declare
    ``credentials-<medium>`` for each medium used; a stdin credential cannot be combined
    with the executor's own ``stdin_text``; a provider's ``options`` must fit its
    ``options_class`` (when it is installed: a missing one is the missing-plugin rule's).
    """
    bindings = getattr(spec, "credentials", None) or []
    if not bindings:
        return []
    problems: list[dict[str, str]] = []
    if spec.session_target == "main":
        problems.append({"field": "credentials", "code": "CREDENTIAL_MEDIUM_UNSUPPORTED",
                         "error": "the main session refuses credentials (it is shared and outlives the run); use a shell job"})
        return problems
    if executor is not None:
        capabilities = set(getattr(executor, "capabilities", ()))
        for i, b in enumerate(bindings):
            medium = b["present"]["medium"]
            if MEDIUM_CAPABILITY[medium] not in capabilities:
                problems.append({"field": f"credentials[{i}].present.medium", "code": "CREDENTIAL_MEDIUM_UNSUPPORTED",
                                 "error": f"executor {spec.executor_name()!r} cannot present credentials by {medium} (it lacks "
                                          f"the capability {MEDIUM_CAPABILITY[medium]})"})
    if any(b["present"]["medium"] == "stdin" for b in bindings) and (spec.executor_options or {}).get("stdin_text") is not None:
        problems.append({"field": "credentials", "code": "CREDENTIAL_MEDIA_CONFLICT",
                         "error": "a stdin credential and executor_options.stdin_text both want the payload's standard input"})
    problems += _option_problems(bindings)
    problems += _revoke_problems(bindings)
    return problems


def _revoke_problems(bindings: list[Binding]) -> list[dict[str, str]]:
    """A binding asking for revocation after the run needs a provider that declares ``revoke`` (when it is installed)."""
    problems: list[dict[str, str]] = []
    for i, b in enumerate(bindings):
        provider = provider_for("credential", b["provider"]) if b.get("revoke") == "after_run" else None
        if provider is not None and ("revoke" not in getattr(provider, "capabilities", ()) or not callable(
                getattr(provider, "revoke", None))):
            problems.append({"field": f"credentials[{i}].revoke", "code": "CREDENTIAL_REVOKE_UNSUPPORTED",
                             "error": f"credential provider {b['provider']!r} cannot revoke (it does not declare the capability"
                                      " revoke)"})
    return problems


def _option_problems(bindings: list[Binding]) -> list[dict[str, str]]:
    """Each binding's ``options`` against its installed provider's ``options_class``."""
    problems: list[dict[str, str]] = []
    for i, b in enumerate(bindings):
        provider = provider_for("credential", b["provider"])
        if provider is None:
            continue
        cls = options_class_of(provider)
        raw = b.get("options") or {}
        if cls is None:
            if raw:
                problems.append({"field": f"credentials[{i}].options", "code": "UNKNOWN_FIELD",
                                 "error": f"credential provider {b['provider']!r} takes no options"})
            continue
        _, found = option_problems(cls, raw, f"credentials[{i}].options")
        problems += found
    return problems


def binding_objects(bindings: list[Binding], providers: Mapping[str, object] | None = None) -> list[CredentialBinding]:
    """``CredentialBinding`` objects of normalised bindings (``options`` built by each provider's class when given)."""
    out = []
    for i, b in enumerate(bindings):
        options = None
        provider = (providers or {}).get(b["provider"])
        cls = options_class_of(provider) if provider is not None else None
        if cls is not None:
            options = build_options(cls, b.get("options") or {}, f"credentials[{i}].options")
        p = b["present"]
        out.append(CredentialBinding(name=b["name"], provider=b["provider"], ref=b["ref"], required=b.get("required", True),
                                     present=CredentialPresent(medium=p["medium"], key=p.get("key"), file_name=p.get("file_name")),
                                     options=options))
    return out
