"""``ShellOptions``: the shell executor's per-job options (``executor_options`` of a shell job)."""

from __future__ import annotations

from typing import Literal

import attrs


def _no_nul(_instance: object, attribute: attrs.Attribute, value: str | None) -> None:
    """A path with a NUL byte can never be passed to the OS: refuse it when the job is added."""
    if value is not None and "\x00" in value:
        raise ValueError(f"{attribute.name} must not contain NUL characters")


@attrs.frozen(kw_only=True)
class ShellOptions:
    """What a shell job may set in ``executor_options``; the kernel validates and stores it."""

    env_policy: Literal["minimal", "inherit"] = attrs.field(
        default="minimal",
        metadata={"doc": "Environment passed to the command: `minimal` (locale, identity, PATH) or `inherit`"
                         " (the dispatcher's, recorded with a warning). Secret-looking names are dropped either way."},
    )
    env_allow: tuple[str, ...] = attrs.field(
        default=(),
        metadata={"doc": "Variable names passed through although they look like secrets or are outside `minimal`"
                         " (exact names; use sparingly). Never a dynamic-loader variable (LD_*, DYLD_*, GCONV_PATH...:"
                         " ENV_NAME_RESERVED when the job is added)."},
    )
    working_dir: str | None = attrs.field(
        default=None, validator=_no_nul, metadata={"doc": "Working directory of the command: absolute, or starting with `~` (expanded); it must"
                                                  " be an existing directory when the job is added (WORKING_DIR_INVALID;"
                                                  " a relative path is refused)."}
    )
    stdin_text: str | None = attrs.field(default=None, metadata={"doc": "Text piped to the command's standard input."})
    user: str | None = attrs.field(
        default=None, validator=_no_nul,
        metadata={"doc": "Account the command runs as (its uid, group and supplementary groups; HOME, LOGNAME, USER and"
                         " SHELL set as cron does). Needs a root dispatcher and an adder who is root or listed in"
                         " `[identity] run_as_users` (RUN_AS_NOT_ROOT, RUN_AS_NOT_ALLOWED); an unknown account is"
                         " RUN_AS_USER_UNKNOWN."},
    )
    added_by: str | None = attrs.field(
        default=None,
        metadata={"doc": "Set by the kernel when `user` is: the adding account's name (whatever the spec says is overwritten)."},
    )
    added_by_uid: int | None = attrs.field(
        default=None,
        metadata={"doc": "Set by the kernel when `user` is: the adding account's effective uid."},
    )
