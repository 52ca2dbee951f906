"""Plain commands run without bash (``direct.py``): which ones, and that nothing a job can see changes.

The detector's table is checked first (text -> words or "bash"), then each command of an
equivalence corpus runs twice through the real executor, once the direct way and once
through bash (the detector switched off), and every observable is compared: status, exit
code, stdout, stderr, the environment the command sees. Timeout, cancellation, the gate and
the accounts/working directories that keep bash are checked on real processes.
"""

from __future__ import annotations

import os
import pwd
import threading
from pathlib import Path

import pytest
from scheduler_executor_shell import direct as direct_mod
from scheduler_executor_shell import executor as executor_mod
from scheduler_executor_shell.direct import direct_command, plain_words

from scheduler.testing import LocalRunControl

PATH = "/usr/local/bin:/usr/bin:/bin"

#: payload -> the words the gate execs, or None (bash interprets it).
SYNTAX = {
    "true": ("true",),
    "false": ("false",),
    "  sleep   0 ": ("sleep", "0"),
    "sleep\t1": ("sleep", "1"),
    "/usr/bin/env -u X FOO=bar printenv FOO": ("/usr/bin/env", "-u", "X", "FOO=bar", "printenv", "FOO"),
    "ls -l --color=never /tmp,a:b@c%d+e": ("ls", "-l", "--color=never", "/tmp,a:b@c%d+e"),
    "./run.sh": ("./run.sh",),
    "": None,
    "   ": None,
    "true x": None,  # builtin with arguments: bash's
    "false 1": None,
    "echo hi": None,  # builtins that also exist as programs stay bash's
    "printf x": None,
    "test -f x": None,
    "[ -f x ]": None,
    "pwd": None,
    "kill 1": None,
    "cd /tmp": None,
    "export A=b": None,
    "source x": None,
    ". x": None,
    "eval ls": None,
    "exec ls": None,
    "set -e": None,
    "ulimit -n": None,
    "umask 022": None,
    "alias a=b": None,
    "function f": None,
    "if true": None,
    "for x in a": None,
    "while true": None,
    "case x in": None,
    "time ls": None,
    "coproc ls": None,
    "! ls": None,
    "[[ -f x ]]": None,
    "ls $HOME": None,
    "ls ${HOME}": None,
    "ls `pwd`": None,
    "ls $(pwd)": None,
    "ls ~": None,
    "ls ~/x": None,
    "ls a~b": None,  # any tilde: refused, though only a word-initial one expands
    "ls *.py": None,
    "ls a?": None,
    "ls [ab]": None,
    "ls {a,b}": None,
    "ls {1..3}": None,
    "ls 'a b'": None,
    'ls "a"': None,
    "ls a\\ b": None,
    "ls > out": None,
    "ls < in": None,
    "ls >> out": None,
    "ls 2>&1": None,
    "ls &> out": None,
    "ls | wc": None,
    "ls || true": None,
    "ls && true": None,
    "ls; true": None,
    "ls &": None,
    "ls # comment": None,
    "(ls)": None,
    "A=b ls": None,
    "A=b": None,
    "ls\ntrue": None,
    "ls\r": None,
    "ls é": None,
    "-ls": None,
    "%1": None,  # a job spec: bash runs fg
    "%ls": None,
    "ls %1": ("ls", "%1"),
    "ls !x": None,
    "ls ^x": None,
}


@pytest.mark.parametrize(("payload", "words"), list(SYNTAX.items()))
def test_the_detectors_syntax_table(payload: str, words: tuple[str, ...] | None) -> None:
    assert plain_words(payload) == words


def _script(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_the_detectors_resolution_table(tmp_path: Path) -> None:
    """Found on PATH as an ELF program or a #! script of one: direct; anything bash decides itself: None."""
    env = {"PATH": PATH}
    sleep = direct_command("sleep 1", env)
    assert sleep is not None and sleep.path is not None and os.path.samefile(sleep.path, "/bin/sleep")
    assert direct_command("true", env) == direct_mod.DirectCommand(words=("true",), path=None)  # the gate's builtin
    good = _script(tmp_path / "good", "#!/bin/sh\necho hi\n")
    assert direct_command(str(good), env) == direct_mod.DirectCommand(words=(str(good),), path=str(good))
    shebang_of_script = _script(tmp_path / "nested", f"#!{good}\n")
    no_shebang = _script(tmp_path / "plain", "echo hi\n")
    missing_interpreter = _script(tmp_path / "lost", "#!/no/such/interpreter\n")
    relative_interpreter = _script(tmp_path / "rel", "#!sh\n")
    not_executable = tmp_path / "noexec"
    not_executable.write_text("#!/bin/sh\n")
    for payload in (str(shebang_of_script), str(no_shebang), str(missing_interpreter), str(relative_interpreter),
                    str(not_executable), str(tmp_path), str(tmp_path / "absent"), "no-such-command-here"):
        assert direct_command(payload, env) is None, payload
    # PATH: a non-executable first match is bash's (it may run a later one, or say "Permission denied")
    (tmp_path / "bin").mkdir()
    shadow = tmp_path / "bin" / "sleep"
    shadow.write_text("#!/bin/sh\n")
    assert direct_command("sleep 1", {"PATH": f"{tmp_path / 'bin'}:{PATH}"}) is None
    for path_var in (f":{PATH}", f"bin:{PATH}", f"/usr/bin/:{PATH}", ""):
        assert direct_command("sleep 1", {"PATH": path_var}) is None, path_var
    assert direct_command("sleep 1", {}) is None  # no PATH: bash's default search
    # environments bash acts on
    for extra in ({"BASH_ENV": "/x"}, {"BASH_FUNC_sleep%%": "() { :; }"}, {"ENV": "/x"}, {"SHELLOPTS": "xtrace"},
                  {"EXECIGNORE": "*"}, {"POSIXLY_CORRECT": "1"}, {"a-b": "1"}, {"1X": "1"}, {"CAF\u00c9": "1"}, {"SHLVL": "999"}, {"SHLVL": "x"},
                  {"PS1": "$ "}, {"RANDOM": "4"}, {"OPTIND": "3"}, {"LC_ALL": "xx_YY.UTF-8"},
                  {"OLDPWD": str(tmp_path / "absent")}):
        assert direct_command("sleep 1", {**env, **extra}) is None, extra
    for extra in ({"SHLVL": "3"}, {"LC_ALL": "C.UTF-8"}, {"OLDPWD": str(tmp_path)}, {"PS3": "x"}, {"_X9": "1"}, {"LANG": "xx"}):
        assert direct_command("sleep 1", {**env, **extra}) is not None, extra


def test_a_changed_file_is_looked_at_again(tmp_path: Path) -> None:
    tool = _script(tmp_path / "tool", "#!/bin/sh\n")
    assert direct_command(str(tool), {"PATH": PATH}) is not None
    tool.write_text("echo now a bash script without #!\n")
    assert direct_command(str(tool), {"PATH": PATH}) is None


def _both(run_job, monkeypatch: pytest.MonkeyPatch, payload: str, **fields):
    """The payload through the executor the direct way, then through bash: both results."""
    fast = run_job(payload, **fields).result
    with monkeypatch.context() as m:
        m.setattr(executor_mod, "direct_command", lambda *_a: None)
        slow = run_job(payload, **fields).result
    return fast, slow


def _observed(r) -> tuple:
    """What a job sees of a run (the run's own id, which differs from run to run, left out)."""
    out = "".join(line for line in r.stdout.excerpt.splitlines(keepends=True) if not line.startswith("SCHEDULER_RUN_ID="))
    return (r.status, r.exit_code, r.error_code, r.error_message, out, r.stderr.excerpt)


EQUIVALENT = [
    "true",
    "false",
    "/bin/echo hello   world",
    "printenv PATH",
    "ls /no/such/path",
    "sleep 0",
    "sh -c exit 3",
    "id -u",
    "cat",
    "wc -c",
    "ls /proc/self/fd",  # no descriptor of the gate is left open
]


@pytest.mark.parametrize("payload", EQUIVALENT)
def test_direct_and_bash_give_the_same_result(run_job, monkeypatch: pytest.MonkeyPatch, payload: str) -> None:
    fast, slow = _both(run_job, monkeypatch, payload, executor_options={"stdin_text": "some input\n"})
    assert fast.details.get("direct") is True and "direct" not in slow.details
    assert _observed(fast) == _observed(slow)


def test_the_command_sees_the_environment_bash_would_give_it(run_job, monkeypatch, tmp_path: Path) -> None:
    """env as the command: the same variables with the same values (SHLVL, _ and PWD set as bash sets them); only
    their order differs (bash writes its exports in its own order)."""
    fast, slow = _both(run_job, monkeypatch, "env", executor_options={"env_policy": "inherit"})
    assert fast.details.get("direct") is True
    assert sorted(_observed(fast)[4].splitlines()) == sorted(_observed(slow)[4].splitlines())
    assert "_=/usr/bin/env" in fast.stdout.excerpt.splitlines() or "_=/bin/env" in fast.stdout.excerpt.splitlines()
    script = _script(tmp_path / "show", '#!/bin/sh\necho "$0 $# $*"; env | grep -E "^(_|SHLVL|PWD)=" | sort\n')
    fast, slow = _both(run_job, monkeypatch, f"{script} a  b")
    assert fast.details.get("direct") is True and _observed(fast) == _observed(slow)
    assert fast.stdout.excerpt.startswith(f"{script} 2 a b\n")


def test_a_missing_command_is_bashs_127_and_message(run_job) -> None:
    r = run_job("no-such-command-here --flag").result
    assert "direct" not in r.details
    assert (r.status, r.exit_code) == ("error", 127)
    assert r.stderr.excerpt == "/bin/bash: line 1: no-such-command-here: command not found\n"


def test_exit_status_and_a_signal_are_the_commands_own(run_job, monkeypatch: pytest.MonkeyPatch) -> None:
    r = run_job("sh -c exit\\ 3").result  # backslash: bash's; the plain form below is direct
    assert "direct" not in r.details
    r = run_job("false").result
    assert (r.details.get("direct"), r.exit_code, r.error_code) == (True, 1, "EXIT_NONZERO")
    r = run_job("python3 -c exit(4)").result
    assert "direct" not in r.details  # parentheses

    fast, slow = _both(run_job, monkeypatch, "timeout -s KILL 0.1 sleep 5")  # it kills its own group
    assert fast.details.get("direct") is True and _observed(fast) == _observed(slow) and fast.exit_code == -9


def test_the_direct_command_is_the_recorded_process(run_job) -> None:
    """Same PID, group and start time as the gate that was recorded: the gate execs the command in place."""
    control = LocalRunControl()
    r = run_job("sh -c echo\\ $$", control=control).result  # bash's (quoting), for the shape of the handle
    ran = run_job("/bin/sh -c exit", control=control).result
    assert ran.details.get("direct") is True and r.status == ran.status == "ok"
    handle = control.handles[-1]
    assert handle["pid"] == handle["pgid"] == ran.details["pid"] and handle["start_time"].startswith("ticks:")
    out = run_job("cat /proc/self/stat").result
    fields = out.stdout.excerpt.split(") ")[1].split()
    assert out.details.get("direct") is True
    assert int(fields[2]) == out.details["pid"]  # its process group is its own PID: setsid, as with bash


def test_timeout_kills_the_direct_commands_group(run_job, group_gone) -> None:
    ran = run_job("sleep 30", run_timeout_ms=300)
    r = ran.result
    assert r.details.get("direct") is True
    assert (r.status, r.error_code, r.exit_code) == ("timeout", "RUN_TIMEOUT", -15)
    assert ran.elapsed < 5 and ran.control.terminations == ["SIGTERM"]
    group_gone(ran.control.handles[0]["pgid"], reaped=True)


def test_cancel_kills_the_direct_commands_group(run_job, group_gone) -> None:
    control = LocalRunControl()
    timer = threading.Timer(0.3, control.cancel, kwargs={"reason": "user"})
    timer.start()
    try:
        ran = run_job("sleep 30", control=control)
    finally:
        timer.cancel()
    r = ran.result
    assert r.details.get("direct") is True
    assert (r.status, r.error_code, r.details["cancel_reason"]) == ("cancelled", "RUN_CANCELLED", "user")
    assert ran.elapsed < 5 and control.terminations == ["SIGTERM"]
    group_gone(control.handles[0]["pgid"], reaped=True)


def test_a_direct_command_never_starts_when_its_handle_is_not_recorded(run_job, tmp_path: Path, group_gone, fence_lost_control) -> None:
    marker = tmp_path / "side-effect"

    control = fence_lost_control
    r = run_job(f"touch {marker}", control=control).result
    assert (r.status, r.error_code, r.details.get("direct")) == ("error", "LEASE_LOST", True)
    assert not marker.exists()
    group_gone(control.handles[0]["pgid"])


def test_the_direct_command_waits_behind_the_gate(run_job, tmp_path: Path) -> None:
    marker = tmp_path / "started"
    seen: list[bool] = []

    class Checking(LocalRunControl):
        def record_handle(self, handle: dict) -> None:
            seen.append(marker.exists())
            super().record_handle(handle)

    r = run_job(f"touch {marker}", control=Checking()).result
    assert (r.status, r.details.get("direct"), seen) == ("ok", True, [False])
    assert marker.exists()


def test_a_working_dir_keeps_bash(run_job, tmp_path: Path) -> None:
    r = run_job("pwd -P", executor_options={"working_dir": str(tmp_path)}).result  # builtin anyway
    assert r.stdout.excerpt == f"{tmp_path.resolve()}\n"
    r = run_job("ls", executor_options={"working_dir": str(tmp_path)}).result
    assert r.status == "ok" and "direct" not in r.details


def test_a_run_as_another_user_keeps_bash(run_job) -> None:
    if os.geteuid() != 0:
        pytest.skip("running as another account needs a root dispatcher")
    nobody = pwd.getpwnam("nobody")
    r = run_job("id -u", executor_options={"user": "nobody", "added_by": "root", "added_by_uid": 0}).result
    assert (r.status, r.stdout.excerpt) == ("ok", f"{nobody.pw_uid}\n")
    assert "direct" not in r.details and r.details["uid"] == nobody.pw_uid


def test_another_configured_shell_keeps_that_shell(run_job, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDULER_EXECUTORS_SHELL_SHELL", "/bin/sh")
    r = run_job("id -u").result
    assert r.status == "ok" and "direct" not in r.details and r.details["shell"] == "/bin/sh"


@pytest.mark.parametrize("pwd_kind", ["symlink", "stale", "unset"])
def test_pwd_is_set_as_bash_sets_it(run_job, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, pwd_kind: str) -> None:
    """An inherited PWD naming the working directory through a symlink is kept; a stale or missing one is replaced."""
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    monkeypatch.chdir(link)
    if pwd_kind == "symlink":
        monkeypatch.setenv("PWD", str(link))
    elif pwd_kind == "stale":
        monkeypatch.setenv("PWD", str(tmp_path))
    else:
        monkeypatch.delenv("PWD", raising=False)
    fast, slow = _both(run_job, monkeypatch, "printenv PWD", executor_options={"env_policy": "inherit"})
    assert fast.details.get("direct") is True and _observed(fast) == _observed(slow)
    expected = link if pwd_kind == "symlink" else real.resolve()
    assert fast.stdout.excerpt == f"{expected}\n"


def test_a_plain_verification_runs_the_same_way(run_job, monkeypatch: pytest.MonkeyPatch) -> None:
    r = run_job("true", verify_shell="false").result
    assert (r.status, r.error_code, r.verification["exit_code"]) == ("error", "VERIFY_FAILED", 1)
    r = run_job("true", verify_shell="test -d /").result  # a builtin: bash's
    assert r.status == "ok" and r.verification["status"] == "passed"
    r = run_job("true", verify_shell="ls /").result
    assert r.status == "ok" and r.verification["status"] == "passed"


def test_a_gate_shell_that_is_not_dash_keeps_bash(run_job, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(executor_mod, "is_dash", lambda _path: False)
    r = run_job("ls /").result
    assert r.status == "ok" and "direct" not in r.details
    assert direct_mod.is_dash("/bin/sh") == (os.path.basename(os.path.realpath("/bin/sh")) == "dash")


#: The variables of bash's manual ("Shell Variables") and a few others, each tried with these values.
BASH_MANUAL_VARIABLES = (
    "BASH", "BASHOPTS", "BASHPID", "BASH_ALIASES", "BASH_ARGC", "BASH_ARGV", "BASH_ARGV0", "BASH_CMDS",
    "BASH_COMMAND", "BASH_COMPAT", "BASH_EXECUTION_STRING", "BASH_LINENO", "BASH_LOADABLES_PATH", "BASH_REMATCH",
    "BASH_SOURCE", "BASH_SUBSHELL", "BASH_VERSINFO", "BASH_VERSION", "BASH_XTRACEFD", "CDPATH", "CHILD_MAX",
    "COLUMNS", "COMP_CWORD", "COMP_KEY", "COMP_LINE", "COMP_POINT", "COMP_TYPE", "COMP_WORDBREAKS", "COMP_WORDS",
    "COMPREPLY", "COPROC", "DIRSTACK", "EMACS", "ENV", "EPOCHREALTIME", "EPOCHSECONDS", "EUID", "EXECIGNORE",
    "FCEDIT", "FIGNORE", "FUNCNAME", "FUNCNEST", "GLOBIGNORE", "GROUPS", "HISTCMD", "HISTCONTROL", "HISTFILE",
    "HISTFILESIZE", "HISTIGNORE", "HISTSIZE", "HISTTIMEFORMAT", "HOSTFILE", "HOSTNAME", "HOSTTYPE", "IFS",
    "IGNOREEOF", "INPUTRC", "INSIDE_EMACS", "LANG", "LC_ALL", "LC_COLLATE", "LC_CTYPE", "LC_MESSAGES",
    "LC_NUMERIC", "LC_TIME", "LINENO", "LINES", "MACHTYPE", "MAIL", "MAILCHECK", "MAILPATH", "MAPFILE", "OLDPWD",
    "OPTARG", "OPTERR", "OPTIND", "OSTYPE", "PIPESTATUS", "POSIXLY_CORRECT", "PPID", "PROMPT_COMMAND",
    "PROMPT_DIRTRIM", "PS0", "PS1", "PS2", "PS3", "PS4", "READLINE_LINE", "READLINE_POINT", "REPLY", "SECONDS",
    "SHELL", "SHELLOPTS", "SHLVL", "SRANDOM", "TIMEFORMAT", "TMOUT", "UID", "auto_resume", "histchars",
)


@pytest.mark.parametrize("value", ["x", "1", "/usr"])
def test_every_bash_variable_either_keeps_bash_or_reaches_the_command_as_under_bash(
        run_job, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    """With each variable set in the dispatcher environment: the command's environment is bash's, or bash runs it."""
    direct_count = 0
    for name in BASH_MANUAL_VARIABLES:
        with monkeypatch.context() as m:
            m.setenv(name, value)
            fast, slow = _both(run_job, m, "env", executor_options={"env_policy": "inherit"})
        if fast.details.get("direct"):
            direct_count += 1
            assert (fast.exit_code, fast.stderr.excerpt) == (slow.exit_code, slow.stderr.excerpt), name
            assert sorted(_observed(fast)[4].splitlines()) == sorted(_observed(slow)[4].splitlines()), name
    assert direct_count > len(BASH_MANUAL_VARIABLES) // 2  # most of them are nothing to bash
