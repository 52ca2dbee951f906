"""The CLI gives a job at most the invoking OS account's trust level (real ``scheduler`` processes, real other accounts).

Root is ``system``; the owner of the database file is ``operator``; every other account is
``user`` unless a settings file owned by root (or the database owner) that nobody else can
write lists it in ``[identity]``. The invoker's own settings file and ``SCHEDULER_IDENTITY_*``
variables grant nothing. Other accounts are real: setuid to uids 60001/60002 as the file-mode
tests do (skipped with the reason where this machine does not allow it).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from kernel_testing import scheduler_cmd
from test_file_modes import GROUP, MEMBER, OWNER, as_user, shared_dir  # noqa: F401  (fixture)

from scheduler.core.filemodes import FILE_MODE_ENV
from scheduler.plugins.stores import open_store

GROUP_ENV = {FILE_MODE_ENV: "group"}


def spec(name: str, level: str | None = None, payload: str = "true", **identity: Any) -> str:
    out: dict[str, Any] = {"name": name, "schedule_kind": "manual", "payload_message": payload}
    if level:
        identity["trust"] = {"level": level}
    if identity:
        out["identity"] = identity
    return json.dumps(out)


def job_names(db: Path) -> set[str]:
    store = open_store(db)
    try:
        with store.read() as tx:
            return {r["name"] for r in tx.all("SELECT name FROM jobs")}
    finally:
        store.close()


def run_cli(db: Path, *args: str) -> tuple[int, dict[str, Any]]:
    out = subprocess.run([*scheduler_cmd(), "--db", str(db), "--json", *args], capture_output=True, text=True, timeout=60)
    assert "Traceback" not in out.stderr, out.stderr
    return out.returncode, json.loads(out.stdout.strip().splitlines()[-1])


def test_root_may_add_a_system_job(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        code, refused = run_cli(tmp_path / "s.db", "jobs", "add", spec("sys", "system"))
        assert code != 0 and refused["code"] == "IDENTITY_LEVEL_EXCEEDS_INVOKER"
        return
    code, added = run_cli(tmp_path / "s.db", "jobs", "add", spec("sys", "system"))
    assert code == 0, added
    assert added["job"]["identity"]["trust"] == {"level": "system"}


def test_the_database_owner_is_operator_and_nothing_more(shared_dir: Path) -> None:  # noqa: F811 - the fixture imported above
    db = shared_dir / "team" / "scheduler.db"
    code, added = as_user(OWNER, GROUP, [], db, "jobs", "add", spec("ops", "operator"), env=GROUP_ENV)
    assert code == 0, added
    code, refused = as_user(OWNER, GROUP, [], db, "jobs", "add", spec("sys", "system"), env=GROUP_ENV)
    assert code != 0 and refused["code"] == "IDENTITY_LEVEL_EXCEEDS_INVOKER", refused
    assert refused["details"]["level"] == "operator" and refused["details"]["reason"] == "owner of the database file"
    assert job_names(db) == {"ops"}


def test_another_account_gets_user_and_cannot_raise_itself(shared_dir: Path) -> None:  # noqa: F811 - the fixture imported above
    db = shared_dir / "team" / "scheduler.db"
    assert as_user(OWNER, GROUP, [], db, "jobs", "add", spec("owners", "operator"), env=GROUP_ENV)[0] == 0
    member = [MEMBER, MEMBER, [GROUP], db]
    code, added = as_user(*member, "jobs", "add", spec("plain"), env=GROUP_ENV)
    assert code == 0, added
    code, refused = as_user(*member, "jobs", "add", spec("mine", "operator"), env=GROUP_ENV)
    assert code != 0 and refused["code"] == "IDENTITY_LEVEL_EXCEEDS_INVOKER", refused
    assert refused["details"]["level"] == "user" and refused["details"]["uid"] == MEMBER
    # an array is refused as a whole, naming the item
    code, refused = as_user(*member, "jobs", "add", "[" + spec("a") + "," + spec("b", "system") + "]", env=GROUP_ENV)
    assert code != 0 and refused["details"]["index"] == 1
    # the operator job cannot be changed by a user (its command would run at operator level)
    code, refused = as_user(*member, "jobs", "update", "owners", '{"payload_message": "id"}', env=GROUP_ENV)
    assert code != 0 and refused["code"] == "IDENTITY_LEVEL_EXCEEDS_INVOKER", refused
    # and a user cannot make its own job act as another account
    code, refused = as_user(*member, "jobs", "add", json.dumps({"name": "as-alice", "schedule_kind": "manual",
                            "payload_message": "true", "identity": {"subject": {"kind": "user", "principal": "alice"}}}),
                            env=GROUP_ENV)
    assert code != 0 and refused["code"] == "IDENTITY_SUBJECT_NOT_ALLOWED", refused
    assert job_names(db) == {"owners", "plain"}
    store = open_store(db)
    try:
        with store.read() as tx:
            assert tx.scalar("SELECT payload_message FROM jobs WHERE name = 'owners'") == "true"
    finally:
        store.close()


def settings_file(directory: Path, owner: int, text: str) -> Path:
    directory.mkdir(mode=0o755)
    path = directory / "config.toml"
    path.write_text(text)
    path.chmod(0o644)
    os.chown(directory, owner, owner)
    os.chown(path, owner, owner)
    return path


def test_only_a_trusted_settings_file_lists_operators(shared_dir: Path) -> None:  # noqa: F811 - the fixture imported above
    db = shared_dir / "team" / "scheduler.db"
    assert as_user(OWNER, GROUP, [], db, "jobs", "add", spec("first"), env=GROUP_ENV)[0] == 0
    member = [MEMBER, MEMBER, [GROUP], db]
    listing = f'[identity]\noperators = ["uid:{MEMBER}"]\n'
    # a variable the invoker sets grants nothing
    code, refused = as_user(*member, "jobs", "add", spec("by-env", "operator"),
                            env={**GROUP_ENV, "SCHEDULER_IDENTITY_OPERATORS": f'["uid:{MEMBER}"]'})
    assert code != 0 and refused["code"] == "IDENTITY_LEVEL_EXCEEDS_INVOKER", refused
    # nor does the invoker's own file
    own = settings_file(shared_dir / "member-etc", MEMBER, listing)
    code, refused = as_user(*member, "jobs", "add", spec("by-own-file", "operator"), env={**GROUP_ENV, "SCHEDULER_CONFIG": str(own)})
    assert code != 0 and refused["code"] == "IDENTITY_LEVEL_EXCEEDS_INVOKER", refused
    # a root-owned file nobody else can write does
    trusted = settings_file(shared_dir / "etc", 0, listing)
    code, added = as_user(*member, "jobs", "add", spec("by-root-file", "operator"), env={**GROUP_ENV, "SCHEDULER_CONFIG": str(trusted)})
    assert code == 0, added
    # ... but not once others can write it
    trusted.chmod(0o666)
    code, refused = as_user(*member, "jobs", "add", spec("writable", "operator"), env={**GROUP_ENV, "SCHEDULER_CONFIG": str(trusted)})
    assert code != 0 and refused["code"] == "IDENTITY_LEVEL_EXCEEDS_INVOKER", refused
    # a lower default is honoured from any file: it only lowers
    trusted.chmod(0o644)
    lowering = settings_file(shared_dir / "member-low", MEMBER, '[identity]\ndefault_level = "untrusted"\n')
    code, refused = as_user(*member, "jobs", "add", spec("now-user"), env={**GROUP_ENV, "SCHEDULER_CONFIG": str(lowering)})
    assert code != 0 and refused["details"]["level"] == "untrusted", refused
    code, added = as_user(*member, "jobs", "add", spec("untrusted-ok", "untrusted"),
                          env={**GROUP_ENV, "SCHEDULER_CONFIG": str(lowering)})
    assert code == 0, added
    assert job_names(db) == {"first", "by-root-file", "untrusted-ok"}
