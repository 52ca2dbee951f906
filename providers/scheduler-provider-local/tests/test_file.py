"""The ``file`` driver on real files: roots, symlinks, modes, owners, sizes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from scheduler_provider_local import FileCredentialProvider, FileSettings
from scheduler_provider_local.file import FileRefused, _open_beneath, read_private_file

from scheduler.api import SchedulerError


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "secrets"
    path.mkdir(mode=0o700)
    return path


def private(path: Path, content: str | bytes, mode: int = 0o600) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, str):
        path.write_text(content)
    else:
        path.write_bytes(content)
    path.chmod(mode)
    return path


def provider_for(*roots: Path, **settings) -> FileCredentialProvider:
    provider = FileCredentialProvider()
    provider.configure(FileSettings(roots=[str(r) for r in roots], **settings))
    return provider


def refused(provider, binding, context, ref: str) -> SchedulerError:
    with pytest.raises(SchedulerError) as info:
        provider.resolve(binding("file", str(ref)), context)
    return info.value


def test_reads_a_private_file_under_a_root_through_the_entry_point(load, root, binding, context, secret) -> None:
    token = private(root / "api" / "token", secret + "\n")
    provider = load("file", roots=[str(root)])
    resolved = provider.resolve(binding("file", str(token)), context)
    assert resolved.value == secret  # one trailing line end dropped
    assert resolved.metadata == {"provider": "file", "source": f"file:{token}", "bytes": len(secret) + 1}
    private(token, secret, 0o400)
    assert provider.resolve(binding("file", str(token)), context).value == secret


def test_strip_newline_can_be_switched_off(root, binding, context) -> None:
    token = private(root / "t", "abc\r\n")
    assert provider_for(root).resolve(binding("file", str(token)), context).value == "abc"
    assert provider_for(root, strip_newline=False).resolve(binding("file", str(token)), context).value == "abc\r\n"


def test_binary_content_stays_bytes(root, binding, context) -> None:
    blob = private(root / "keystore", b"\xff\x00\xfe\n")
    assert provider_for(root).resolve(binding("file", str(blob)), context).value == b"\xff\x00\xfe\n"


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o620, 0o602, 0o660, 0o610, 0o601])
def test_group_or_world_access_is_refused(mode, root, binding, context, secret, no_secret_in) -> None:
    token = private(root / "token", secret, mode)
    err = refused(provider_for(root), binding, context, token)
    assert err.code == "CREDENTIAL_FILE_INSECURE" and f"{mode:04o}" in err.message and "chmod 600" in err.message
    assert err.details["reason"] == "mode"
    no_secret_in(err, secret)


def test_no_roots_means_no_file(root, binding, context, secret) -> None:
    token = private(root / "token", secret)
    err = refused(provider_for(), binding, context, token)
    assert err.code == "CREDENTIAL_REF_DENIED" and err.details["reason"] == "no-roots"


def test_outside_every_root_is_refused(tmp_path, root, binding, context, secret) -> None:
    other = private(tmp_path / "elsewhere" / "token", secret)
    err = refused(provider_for(root), binding, context, other)
    assert err.code == "CREDENTIAL_REF_DENIED" and err.details["reason"] == "outside-roots"
    err = refused(provider_for(root), binding, context, f"{root}/../elsewhere/token")  # lexical traversal
    assert err.code == "CREDENTIAL_REF_DENIED" and err.details["reason"] == "outside-roots"


def test_a_symlink_escaping_its_root_is_refused(tmp_path, root, binding, context, secret, no_secret_in) -> None:
    outside = private(tmp_path / "outside" / "id_rsa", secret)
    (root / "innocent").symlink_to(outside)
    err = refused(provider_for(root), binding, context, root / "innocent")
    assert err.code == "CREDENTIAL_REF_DENIED" and err.details["reason"] == "symlink-escape"
    no_secret_in(err, secret)
    (root / "dir").symlink_to(outside.parent, target_is_directory=True)  # a symlinked directory escaping
    err = refused(provider_for(root), binding, context, root / "dir" / "id_rsa")
    assert err.details["reason"] == "symlink-escape"


def test_a_symlink_into_a_root_from_outside_is_refused(tmp_path, root, binding, context, secret) -> None:
    token = private(root / "token", secret)
    (tmp_path / "alias").symlink_to(token)
    assert refused(provider_for(root), binding, context, tmp_path / "alias").details["reason"] == "outside-roots"


def test_symlinks_that_stay_inside_the_root_are_followed(root, binding, context, secret) -> None:
    private(root / "v2" / "token", secret)
    (root / "current").symlink_to(root / "v2", target_is_directory=True)  # the Kubernetes ..data layout
    (root / "token").symlink_to(root / "current" / "token")
    assert provider_for(root).resolve(binding("file", str(root / "token")), context).value == secret


def test_a_root_that_is_itself_a_symlink_works(tmp_path, binding, context, secret) -> None:
    real = tmp_path / "real-secrets"
    real.mkdir()
    token = private(real / "token", secret)
    (tmp_path / "link-root").symlink_to(real, target_is_directory=True)
    provider = provider_for(tmp_path / "link-root")
    assert provider.resolve(binding("file", str(tmp_path / "link-root" / "token")), context).value == secret
    assert provider.resolve(binding("file", str(token)), context).value == secret


def test_a_component_swapped_for_a_symlink_is_not_followed(tmp_path, root, secret) -> None:
    """The open walks resolved components with O_NOFOLLOW: a symlink met there is a swap, refused."""
    private(tmp_path / "outside" / "token", secret)
    (root / "sub").symlink_to(tmp_path / "outside", target_is_directory=True)
    with pytest.raises(FileRefused) as info:
        _open_beneath(str(root), ["sub", "token"], "x")
    assert info.value.details["reason"] == "symlink-swapped"
    (root / "leaf").symlink_to(tmp_path / "outside" / "token")
    with pytest.raises(FileRefused):
        _open_beneath(str(root), ["leaf"], "x")


@pytest.mark.parametrize("kind", ["directory", "fifo", "root"])
def test_only_regular_files(kind, root, binding, context) -> None:
    target = root / "thing"
    if kind == "directory":
        target.mkdir(mode=0o700)
    elif kind == "fifo":
        os.mkfifo(target, 0o600)  # opening must not block the dispatcher
    else:
        target = root
    err = refused(provider_for(root), binding, context, target)
    assert err.code == "CREDENTIAL_FILE_INSECURE" and err.details["reason"] == "not-regular"


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_a_file_owned_by_another_user_is_refused(root, binding, context, secret) -> None:
    token = private(root / "token", secret)
    os.chown(token, 54321, -1)
    err = refused(provider_for(root), binding, context, token)
    assert err.code == "CREDENTIAL_FILE_INSECURE" and err.details["reason"] == "owner" and "54321" in err.message


def test_size_is_bounded(root, binding, context) -> None:
    exact = private(root / "exact", "x" * 100)
    big = private(root / "big", "x" * 101)
    provider = provider_for(root, max_bytes=100)
    assert provider.resolve(binding("file", str(exact)), context).value == "x" * 100
    err = refused(provider, binding, context, big)
    assert err.code == "CREDENTIAL_FILE_TOO_LARGE" and err.details["max_bytes"] == 100


@pytest.mark.parametrize(("name", "content", "code"), [
    ("missing", None, "CREDENTIAL_NOT_FOUND"),
    ("empty", "", "CREDENTIAL_EMPTY"),
    ("newline", "\n", "CREDENTIAL_EMPTY"),
])
def test_missing_and_empty(name, content, code, root, binding, context) -> None:
    if content is not None:
        private(root / name, content)
    assert refused(provider_for(root), binding, context, root / name).code == code


def test_a_relative_ref_is_invalid(root, binding, context) -> None:
    assert refused(provider_for(root), binding, context, "secrets/token").code == "CREDENTIAL_REF_INVALID"


def test_home_relative_refs_and_roots(monkeypatch, tmp_path, binding, context, secret) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    private(tmp_path / ".secrets" / "token", secret)
    provider = provider_for()
    provider.configure(FileSettings(roots=["~/.secrets"]))
    assert provider.resolve(binding("file", "~/.secrets/token"), context).value == secret


def test_roots_must_be_absolute_in_the_settings_file(load) -> None:
    with pytest.raises(SchedulerError) as info:
        load("file", roots=["relative/dir"])
    assert info.value.code == "CONFIG_INVALID" and "providers.file.roots" in info.value.message


def test_the_settings_reference_reader_checks_the_same_things(tmp_path, secret) -> None:
    token = private(tmp_path / "token", secret + "\n")
    assert read_private_file(str(token)) == secret
    assert read_private_file(str(tmp_path / "nope")) is None
    token.chmod(0o644)
    with pytest.raises(PermissionError) as info:
        read_private_file(str(token))
    assert "0644" in info.value.strerror and secret not in str(info.value)
    token.chmod(0o600)
    (tmp_path / "link").symlink_to(token)  # settings references may be symlinks (mounted secrets)
    assert read_private_file(str(tmp_path / "link")) == secret
