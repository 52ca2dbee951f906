"""Which commands run without bash: a plain simple command is started by a small ``/bin/sh`` gate that execs it.

Every command still waits behind the gate (``runner.py``) until its process identity is
durable; what changes is the program that waits. For a command bash would only have
exec'd (``bash -c 'sleep 5'`` execs ``sleep`` in the same process), the gate is
``/bin/sh -c DIRECT_GATE_SCRIPT sh PATH WORD...``: dash starts in about 0.7 ms here against
1.1 ms for bash, and it never parses the command's text, it gets the words as its
positional parameters and ``exec "$@"`` (``true`` and ``false`` without arguments run as
the gate's builtins, as bash runs them as its own: no exec at all).

The detector is conservative: a payload goes the direct way only when bash provably
does nothing with it but split it at blanks and exec the first word found on ``PATH``:

* only the characters ``A-Z a-z 0-9 _ @ % + = : , . / -``, separated by spaces or tabs:
  no expansion (``$`` backquote ``~`` ``* ? [ ]`` braces), no quoting or backslash, no
  redirection, pipe or list (``< > | & ;``), no subshell or grouping, no comment, no
  newline, no ``!``, nothing outside ASCII;
* a first word that is not an assignment (no ``=``), not an option-looking word (``-x``), not a
  job spec (``%1``: bash runs ``fg``), not a bash keyword and not a bash builtin (``cd``,
  ``export``, ``echo``, ``test``..., ``BASH_BUILTINS``) apart from ``true`` and ``false`` alone;
* a first word that names, through ``PATH`` (only absolute entries, no empty one) or as a
  path, a regular executable file that is an ELF binary or a ``#!`` script whose
  interpreter is one: the first file found must be it (a non-executable or missing
  file, a directory, a script bash would run itself: bash, and its own 126/127 message);
* an environment that bash would not act on or rewrite: no ``BASH*`` variable (``BASH_ENV``,
  exported functions ``BASH_FUNC_*``), none of ``_BASH_VARIABLES`` (``ENV``, ``SHELLOPTS``,
  ``EXECIGNORE``, ``PS1``, ``RANDOM``, ``OPTIND``...), only valid names, ``SHLVL`` absent or
  0-998, ``LC_ALL`` absent or a C locale, ``OLDPWD`` absent or a directory;
* no ``working_dir`` and no ``user``: those runs keep the existing path (``executor.py``);
* a gate shell that is dash (``is_dash``): the equivalence is dash's ``exec "$@"`` (a ``/bin/sh``
  that is bash or busybox sets ``SHLVL`` and ``_`` its own way: bash then).

A file that disappears between the check and the exec gets dash's error message (``sh: 1:
exec: ...: not found``, 127) where bash would print its own: the only case where the texts differ.

The command's environment is then what bash would have given it: the gate sets ``PWD``
as bash does, and the executor sets ``SHLVL`` (bash 5 increments it and decrements it
again for the exec) and the gate exports ``_`` (the path executed).
"""

from __future__ import annotations

import functools
import os
import re
import stat
from collections.abc import Mapping

import attrs

#: The gate for a plain command, by stdin mode and whether a file is exec'd: wait for the go-ahead line, pick stdin,
#: then exec the words (``$0`` is ``sh``, ``$1`` the path exec'd, exported as ``_`` as bash does: the gate's
#: ``read`` has just emptied ``_``), or run the gate's builtin. ``null``: stdin becomes ``/dev/null``; ``pipe``
#: keeps the pipe (the job's text follows the line).
DIRECT_GATE_SCRIPTS = {
    ("null", True): 'IFS= read -r _ || exit 125; exec </dev/null; export _="$1"; shift; exec "$@"',
    ("pipe", True): 'IFS= read -r _ || exit 125; export _="$1"; shift; exec "$@"',
    ("null", False): 'IFS= read -r _ || exit 125; exec </dev/null; "$@"',
    ("pipe", False): 'IFS= read -r _ || exit 125; "$@"',
}

#: ``compgen -b`` of bash 5.2: a command word bash runs itself (refused, except ``GATE_BUILTINS``).
BASH_BUILTINS = frozenset({
    ".", ":", "[", "alias", "bg", "bind", "break", "builtin", "caller", "cd", "command", "compgen", "complete",
    "compopt", "continue", "declare", "dirs", "disown", "echo", "enable", "eval", "exec", "exit", "export", "false",
    "fc", "fg", "getopts", "hash", "help", "history", "jobs", "kill", "let", "local", "logout", "mapfile", "popd",
    "printf", "pushd", "pwd", "read", "readarray", "readonly", "return", "set", "shift", "shopt", "source", "suspend",
    "test", "times", "trap", "true", "type", "typeset", "ulimit", "umask", "unalias", "unset", "wait",
})
#: ``compgen -k``: reserved words (refused as a first word).
BASH_KEYWORDS = frozenset({
    "if", "then", "else", "elif", "fi", "case", "esac", "for", "select", "while", "until", "do", "done", "in",
    "function", "time", "{", "}", "!", "[[", "]]", "coproc",
})
#: Builtins the gate shell runs with the same meaning as bash's, when given no argument.
GATE_BUILTINS = frozenset({"true", "false"})

#: A payload of plain words only (see the module docstring).
_PLAIN = re.compile(r"[ \t]*[A-Za-z0-9_@%+=:,./-]+(?:[ \t]+[A-Za-z0-9_@%+=:,./-]+)*[ \t]*")
#: Environment variables bash acts on before or while running a simple command, or resets, drops or sets its own
#: way before it execs one (refused; found by comparing ``env`` under bash and under the gate for each documented
#: bash variable: tests/test_direct.py).
_BASH_VARIABLES = frozenset({
    "ENV", "SHELLOPTS", "EXECIGNORE", "POSIXLY_CORRECT", "COMP_WORDBREAKS", "EPOCHREALTIME", "EPOCHSECONDS", "HISTCMD",
    "LINENO", "OPTERR", "OPTIND", "PPID", "PS1", "PS2", "PS4", "RANDOM", "SRANDOM",
})
#: ``LC_ALL`` values bash accepts without a warning on every host (another one may make it print a setlocale warning).
_PORTABLE_LC_ALL = frozenset({"", "C", "POSIX", "C.UTF-8", "C.utf8"})
_SHLVL = re.compile(r"[0-9]{1,3}")
_ELF = b"\x7fELF"


@attrs.frozen
class DirectCommand:
    """A payload the gate runs without bash: its words, and the file exec'd (None for a gate builtin)."""

    words: tuple[str, ...]
    path: str | None

    def environment(self, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` as bash would have passed it to this command: ``SHLVL`` set (``_`` and ``PWD`` are the gate's)."""
        out = dict(env)
        out["SHLVL"] = str(int(env.get("SHLVL", "0")))
        return out

    def gate_argv(self, gate_shell: str, mode: str) -> list[str]:
        """The gate's command line for stdin ``mode`` ("null" or "pipe")."""
        script = DIRECT_GATE_SCRIPTS[(mode, self.path is not None)]
        head = [gate_shell, "-c", script, "sh"] + ([] if self.path is None else [self.path])
        return head + list(self.words)


@functools.lru_cache(maxsize=4)
def is_dash(gate_shell: str) -> bool:
    """Whether ``gate_shell`` is dash (through its symlinks), looked up once per path: the gate the rules were made for."""
    return os.path.basename(os.path.realpath(gate_shell)) == "dash"


@functools.lru_cache(maxsize=256)
def plain_words(payload: str) -> tuple[str, ...] | None:
    """The words of ``payload`` when it is a plain simple command bash would only split and exec, else None.

    The syntax half of the detector (a pure function of the text, hence cached): see the
    module docstring for the rules. ``true``/``false`` without arguments pass; other builtins do not.
    """
    if not _PLAIN.fullmatch(payload):
        return None
    words = tuple(payload.split())
    first = words[0]
    if "=" in first or first.startswith(("-", "%")) or first in BASH_KEYWORDS:
        return None
    if first in BASH_BUILTINS and not (first in GATE_BUILTINS and len(words) == 1):
        return None
    return words


def direct_command(payload: str, env: Mapping[str, str]) -> DirectCommand | None:
    """The payload as a ``DirectCommand`` when bash would do nothing but exec it (module docstring), else None.

    ``env`` is the command's environment (its ``PATH`` is searched here as bash would); the
    dispatcher's working directory is the command's (a job with ``working_dir`` is not asked).
    """
    words = plain_words(payload)
    if words is None or not _env_is_plain(env):
        return None
    first = words[0]
    if first in GATE_BUILTINS:
        return DirectCommand(words=words, path=None)
    path = _resolve(first, env.get("PATH"))
    return None if path is None else DirectCommand(words=words, path=path)


def _env_is_plain(env: Mapping[str, str]) -> bool:
    """True when bash would not act on anything in ``env`` before running a plain command."""
    for name in env:  # a valid name: ASCII letters, digits and "_", not a digit first ([A-Za-z_][A-Za-z0-9_]*)
        if name.startswith("BASH") or name in _BASH_VARIABLES or not (name.isascii() and name.isidentifier()):
            return False
    if env.get("LC_ALL", "") not in _PORTABLE_LC_ALL:
        return False
    oldpwd = env.get("OLDPWD")
    if oldpwd is not None and not os.path.isdir(oldpwd):
        return False  # bash drops an OLDPWD that names no directory
    shlvl = env.get("SHLVL")
    return shlvl is None or (_SHLVL.fullmatch(shlvl) is not None and int(shlvl) < 999)


def _resolve(word: str, path_var: str | None) -> str | None:
    """The file bash would exec for ``word`` when it is an ELF binary or a ``#!`` script of one, else None."""
    if "/" in word:
        return word if _runnable(word) else None
    if not path_var:
        return None  # bash searches its built-in default PATH then
    for entry in path_var.split(":"):
        if not entry.startswith("/") or entry.endswith("/"):
            return None  # an empty (current directory) or relative entry, or one bash joins its own way
        candidate = f"{entry}/{word}"
        try:
            st = os.stat(candidate)
        except FileNotFoundError:
            continue
        except OSError:
            return None
        return candidate if _runnable(candidate, st) else None
    return None  # not found: bash prints its own "command not found" (127)


def _runnable(path: str, st: os.stat_result | None = None, *, script: bool = True) -> bool:
    """A regular file this process may execute that the kernel runs: ELF, or (``script``) ``#!`` an ELF interpreter."""
    try:
        st = st or os.stat(path)
    except OSError:
        return False
    if not stat.S_ISREG(st.st_mode) or not os.access(path, os.X_OK):
        return False
    kind = _kind(path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if kind == _ELF_KIND:
        return True
    return script and kind is not None and _runnable(kind, script=False)


_ELF_KIND = ""


@functools.lru_cache(maxsize=256)
def _kind(path: str, _dev: int, _ino: int, _size: int, _mtime_ns: int, _ctime_ns: int) -> str | None:
    """What the file starts with, as of this stat key (a changed file is read again): ``""`` for ELF, the
    interpreter's absolute path for ``#!``, None for anything else (bash and dash would each run it as their
    own script: bash's business)."""
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError:
        return None
    if head.startswith(_ELF):
        return _ELF_KIND
    if not head.startswith(b"#!") or b"\n" not in head:
        return None
    parts = head[2 : head.index(b"\n")].split()
    if not parts or not parts[0].startswith(b"/"):
        return None
    return os.fsdecode(parts[0])
