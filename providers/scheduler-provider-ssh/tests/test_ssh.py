"""The ssh provider with real ssh-keygen: signing, verifying, and every way a signature or its trust can be wrong."""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import attrs
import pytest
from scheduler_toolkit.options import catalogue

from scheduler.api import PLUGIN_API_VERSION, EvidenceDeclaration, EvidencePayload, EvidenceProvider, SchedulerError

README = Path(__file__).resolve().parents[1] / "README.md"
SIGNED_KEYS = ("schema", "version", "method", "key_fingerprint", "principal", "namespace", "payload_format",
               "payload_digest", "signed_payload")


def declaration(**options: Any) -> EvidenceDeclaration:
    return EvidenceDeclaration(provider="ssh", options=options or None)


@dataclass(frozen=True)
class FutureDeclaration:
    """A declaration carrying ``methods``, as the evidence job field will."""

    provider: str = "ssh"
    methods: tuple[str, ...] = ()
    options: Any = None


@pytest.fixture
def ssh(load_evidence: Any, keys: Any) -> Any:
    """The provider configured for alice, trusting the allowed-signers file."""
    return load_evidence("ssh", key=str(keys.alice), principal="alice@example.org", allowed_signers=str(keys.allowed_signers))


def signed_document(data: Any) -> bytes:
    # ASCII keys: sorted compact JSON is json-sort-v1 (an independent oracle for what is signed)
    return json.dumps({k: data[k] for k in SIGNED_KEYS}, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def with_data(envelope: Any, **changes: Any) -> Any:
    return attrs.evolve(envelope, data={**envelope.data, **changes})


def keygen_sign(key: Path, namespace: str, data: bytes) -> str:
    return subprocess.run(["ssh-keygen", "-Y", "sign", "-f", str(key), "-n", namespace], input=data, check=True,
                          capture_output=True, timeout=30).stdout.decode()


# -- loading and options --------------------------------------------------------------------------


def test_loads_through_its_entry_point(ssh: Any) -> None:
    assert isinstance(ssh, EvidenceProvider)
    assert ssh.plugin_api == PLUGIN_API_VERSION
    assert ssh.capabilities == frozenset({"attest", "verify-evidence", "signed-evidence"})
    assert ssh.methods == frozenset({"ssh-signature"})
    names = {row["name"] for row in catalogue(ssh.options_class)}
    assert names == {"key", "principal", "namespace", "allowed_signers"}


@pytest.mark.parametrize("settings", [{"timeout_s": -1}, {"key": "relative/key"}, {"allowed_fingerprints": ["MD5:aa"]},
                                      {"principal": "two words"}, {"trust": "x"}])
def test_bad_settings_are_a_configuration_error(load_evidence: Any, settings: dict[str, Any]) -> None:
    with pytest.raises(SchedulerError) as err:
        load_evidence("ssh", **settings)
    assert err.value.code == "CONFIG_INVALID"


@pytest.mark.parametrize("options", [{"key": "id_ed25519"}, {"principal": "a b"}, {"namespace": "a/b"}, {"colour": "x"}])
def test_bad_provider_config_is_refused(ssh: Any, make_payload: Any, options: dict[str, Any]) -> None:
    with pytest.raises(SchedulerError) as err:
        ssh.attest(make_payload(), declaration(**options))
    assert err.value.code == "EVIDENCE_OPTIONS_INVALID"
    assert ssh.verify({}, make_payload(), declaration(**options)).code == "EVIDENCE_OPTIONS_INVALID"


# -- the good path --------------------------------------------------------------------------------


def test_attest_then_verify(ssh: Any, keys: Any, make_payload: Any) -> None:
    payload = make_payload()
    envelope = ssh.attest(payload, declaration())
    data = envelope.data
    assert envelope.provider == "ssh" and envelope.format == "scheduler.evidence.ssh-signature"
    assert envelope.payload_digest == payload.digest == "sha256:" + hashlib.sha256(payload.canonical).hexdigest()
    assert list(data) == [*SIGNED_KEYS, "signature"]
    assert data["method"] == "ssh-signature" and data["version"] == 1 and data["payload_format"] == "canonical-json"
    assert data["key_fingerprint"] == keys.fingerprint("alice")
    assert (data["principal"], data["namespace"]) == ("alice@example.org", "scheduler")
    assert data["signed_payload"].encode() == payload.canonical
    assert data["signature"].startswith("-----BEGIN SSH SIGNATURE-----")
    assert "allowed_signers" not in json.dumps(data)  # trust is never carried by the evidence
    result = ssh.verify(envelope, payload, declaration())
    assert (result.verified, result.provider, result.code) == (True, "ssh", None)
    # the stored JSON form verifies too
    assert ssh.verify(json.loads(json.dumps(attrs.asdict(envelope))), payload, declaration()).verified


def test_plain_ssh_keygen_verifies_the_envelope(ssh: Any, keys: Any, make_payload: Any, tmp_path: Path) -> None:
    envelope = ssh.attest(make_payload(), declaration())
    sig = tmp_path / "evidence.sig"
    sig.write_text(envelope.data["signature"])
    done = subprocess.run(["ssh-keygen", "-Y", "verify", "-f", str(keys.allowed_signers), "-I", "alice@example.org",
                           "-n", "scheduler", "-s", str(sig)], input=signed_document(envelope.data), capture_output=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    assert b'Good "scheduler" signature for alice@example.org' in done.stdout


def test_the_readme_recipe_verifies_by_hand(ssh: Any, keys: Any, make_payload: Any, tmp_path: Path) -> None:
    text = README.read_text()
    section = text.split("## Verifying by hand", 1)[1]
    script = re.search(r"```sh\n(.*?)```", section, re.DOTALL).group(1)  # type: ignore[union-attr]
    work = tmp_path / "by-hand"
    work.mkdir()
    payload = make_payload()
    envelope = ssh.attest(payload, declaration())
    (work / "envelope.json").write_text(json.dumps(dict(envelope.data), indent=2))
    (work / "allowed_signers").write_text(keys.allowed_signers.read_text())
    done = subprocess.run(["sh", "-ec", script], cwd=work, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert 'Good "scheduler" signature for alice@example.org' in done.stdout + done.stderr
    assert payload.digest.removeprefix("sha256:") in done.stdout


def test_agentcli_payloads_use_the_agentcli_namespace_and_envelope(ssh: Any, keys: Any) -> None:
    from_conftest = {"schema": "agentcli.evidence.payload", "version": 1, "execution_id": "run-9",
                     "result": {"status": "ok", "exit_code": 0}}
    canonical = json.dumps(from_conftest, sort_keys=True, separators=(",", ":")).encode()
    payload = EvidencePayload(document=from_conftest, canonical=canonical, digest="sha256:" + hashlib.sha256(canonical).hexdigest())
    envelope = ssh.attest(payload, declaration())
    assert envelope.data["namespace"] == "agentcli" and envelope.data["schema"] == "agentcli.evidence.envelope"
    assert envelope.format == "agentcli.evidence.envelope"
    assert ssh.verify(envelope, payload, declaration()).verified
    # an explicit namespace wins, and then verification expects it
    other = ssh.attest(payload, declaration(namespace="scheduler"))
    assert other.data["namespace"] == "scheduler"
    assert ssh.verify(other, payload, declaration()).code == "EVIDENCE_NAMESPACE_MISMATCH"
    assert ssh.verify(other, payload, declaration(namespace="scheduler")).verified


def test_one_instance_serves_many_threads(ssh: Any, make_payload: Any) -> None:
    results: list[bool] = []

    def work(i: int) -> None:
        payload = make_payload(run_id=f"run-{i}")
        results.append(ssh.verify(ssh.attest(payload, declaration()), payload, declaration()).verified)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == [True] * 6


# -- negative cases -------------------------------------------------------------------------------


def test_a_tampered_payload_fails(ssh: Any, make_payload: Any) -> None:
    payload = make_payload()
    envelope = ssh.attest(payload, declaration())
    tampered = make_payload(exit_code=1)
    assert ssh.verify(envelope, tampered, declaration()).code == "EVIDENCE_PAYLOAD_MISMATCH"
    # the envelope rewritten to claim the tampered payload: the signature no longer covers it
    forged = attrs.evolve(with_data(envelope, payload_digest=tampered.digest, signed_payload=tampered.canonical.decode()),
                          payload_digest=tampered.digest)
    assert ssh.verify(forged, tampered, declaration()).code == "EVIDENCE_SIGNATURE_INVALID"
    # only the signed copy changed
    assert ssh.verify(with_data(envelope, signed_payload=tampered.canonical.decode()), payload,
                      declaration()).code == "EVIDENCE_SIGNED_PAYLOAD_MISMATCH"


def test_an_envelope_transplanted_from_another_payload_fails(ssh: Any, make_payload: Any) -> None:
    envelope = ssh.attest(make_payload(run_id="run-1"), declaration())
    result = ssh.verify(envelope, make_payload(run_id="run-2"), declaration())
    assert (result.verified, result.code) == (False, "EVIDENCE_PAYLOAD_MISMATCH")


def test_a_key_nobody_trusts_fails(load_evidence: Any, keys: Any, make_payload: Any) -> None:
    mallory = load_evidence("ssh", key=str(keys.mallory), principal="alice@example.org",
                            allowed_signers=str(keys.allowed_signers))
    with pytest.raises(SchedulerError) as err:  # the self-check after signing refuses it at once
        mallory.attest(make_payload(), declaration())
    assert err.value.code == "EVIDENCE_SIGNER_UNTRUSTED"
    unchecked = load_evidence("ssh", key=str(keys.mallory), principal="alice@example.org",
                              allowed_signers=str(keys.allowed_signers), self_check=False)
    payload = make_payload()
    envelope = unchecked.attest(payload, declaration())
    result = unchecked.verify(envelope, payload, declaration())
    assert (result.verified, result.code) == (False, "EVIDENCE_SIGNER_UNTRUSTED")


def test_a_wrong_principal_fails(load_evidence: Any, ssh: Any, keys: Any, make_payload: Any) -> None:
    payload = make_payload()
    # alice's key, claiming to be carol: the allowed-signers file trusts that key for alice only
    claims_carol = load_evidence("ssh", key=str(keys.alice), principal="carol@example.org",
                                 allowed_signers=str(keys.allowed_signers), self_check=False)
    envelope = claims_carol.attest(payload, declaration())
    result = claims_carol.verify(envelope, payload, declaration())
    assert (result.verified, result.code) == (False, "EVIDENCE_PRINCIPAL_MISMATCH")
    assert "alice@example.org" in (result.reason or "")
    with pytest.raises(SchedulerError) as err:
        load_evidence("ssh", key=str(keys.alice), principal="carol@example.org",
                      allowed_signers=str(keys.allowed_signers)).attest(payload, declaration())
    assert err.value.code == "EVIDENCE_PRINCIPAL_MISMATCH"
    # a verifier expecting alice refuses an envelope naming carol before asking ssh-keygen
    load_evidence("ssh", principal="alice@example.org", allowed_signers=str(keys.allowed_signers))
    good = ssh.attest(payload, declaration())
    assert ssh.verify(good, payload, declaration(principal="carol@example.org")).code == "EVIDENCE_PRINCIPAL_MISMATCH"


def test_a_wrong_namespace_fails(ssh: Any, make_payload: Any) -> None:
    payload = make_payload()
    other = ssh.attest(payload, declaration(namespace="elsewhere"))
    assert ssh.verify(other, payload, declaration()).code == "EVIDENCE_NAMESPACE_MISMATCH"
    # the envelope relabelled to the expected namespace: the signature itself says otherwise
    relabelled = with_data(other, namespace="scheduler")
    assert ssh.verify(relabelled, payload, declaration()).code == "EVIDENCE_NAMESPACE_MISMATCH"


def test_a_signature_from_another_key_fails(ssh: Any, keys: Any, make_payload: Any) -> None:
    payload = make_payload()
    envelope = ssh.attest(payload, declaration())
    carols = keygen_sign(keys.carol, "scheduler", signed_document(envelope.data))
    assert ssh.verify(with_data(envelope, signature=carols), payload, declaration()).code == "EVIDENCE_FINGERPRINT_MISMATCH"
    swapped = with_data(envelope, key_fingerprint=keys.fingerprint("carol"))
    assert ssh.verify(swapped, payload, declaration()).code == "EVIDENCE_FINGERPRINT_MISMATCH"


def test_a_truncated_or_mangled_signature_fails(ssh: Any, make_payload: Any) -> None:
    payload = make_payload()
    envelope = ssh.attest(payload, declaration())
    signature = envelope.data["signature"]
    lines = signature.strip().splitlines()
    variants = {
        "half": signature[: len(signature) // 2],
        "no footer": "\n".join(lines[:-1]),
        "a body line dropped": "\n".join([lines[0], *lines[2:]]),
        "last body line cut": "\n".join([*lines[:-2], lines[-2][:-8], lines[-1]]),
        "not base64": "\n".join([lines[0], "!!!!" + lines[1][4:], *lines[2:]]),
        "empty": "",
        "armor only": "-----BEGIN SSH SIGNATURE-----\n-----END SSH SIGNATURE-----\n",
    }
    for name, bad in variants.items():
        result = ssh.verify(with_data(envelope, signature=bad), payload, declaration())
        assert (result.verified, result.code) == (False, "EVIDENCE_SIGNATURE_MALFORMED"), name
    # one flipped bit inside the signature value parses, and ssh-keygen rejects it
    body = "".join(lines[1:-1])
    import base64

    raw = bytearray(base64.b64decode(body))
    raw[-5] ^= 0x01
    flipped = lines[0] + "\n" + base64.b64encode(bytes(raw)).decode() + "\n" + lines[-1] + "\n"
    assert ssh.verify(with_data(envelope, signature=flipped), payload, declaration()).code == "EVIDENCE_SIGNATURE_INVALID"


def test_an_unknown_method_fails(ssh: Any, make_payload: Any) -> None:
    payload = make_payload()
    envelope = ssh.attest(payload, declaration())
    assert ssh.verify(with_data(envelope, method="ssh-signature-v2"), payload, declaration()).code == "EVIDENCE_METHOD_MISMATCH"
    with pytest.raises(SchedulerError) as err:
        ssh.attest(payload, FutureDeclaration(methods=("sha256",)))
    assert err.value.code == "EVIDENCE_METHOD_UNSUPPORTED"
    assert ssh.attest(payload, FutureDeclaration(methods=("ssh-signature",))).data["method"] == "ssh-signature"


def test_every_envelope_field_changed_is_detected(ssh: Any, keys: Any, make_payload: Any) -> None:
    payload = make_payload()
    envelope = ssh.attest(payload, declaration())
    changes = {
        "schema": ["agentcli.evidence.envelope", "x"], "version": [2, "1", True], "method": ["sha256"],
        "key_fingerprint": [keys.fingerprint("carol"), "SHA256:x"], "principal": ["carol@example.org", "alice"],
        "namespace": ["agentcli", "other"], "payload_format": ["json"],
        "payload_digest": [make_payload(run_id="x").digest, "sha256:" + "0" * 64],
        "signed_payload": [payload.canonical.decode() + " ", "{}"],
        "signature": [envelope.data["signature"].replace("A", "B", 1), None],
    }
    for key, values in changes.items():
        for value in values:
            result = ssh.verify(with_data(envelope, **{key: value}), payload, declaration())
            assert not result.verified and (result.code or "").startswith("EVIDENCE_"), (key, value)
        missing = {k: v for k, v in envelope.data.items() if k != key}
        assert not ssh.verify(attrs.evolve(envelope, data=missing), payload, declaration()).verified, key
    assert ssh.verify(with_data(envelope, trust="x"), payload, declaration()).code == "EVIDENCE_ENVELOPE_INVALID"


@pytest.mark.parametrize("envelope", [None, 7, {}, {"provider": "ssh", "data": {}}])
def test_garbage_envelopes_never_raise(ssh: Any, make_payload: Any, envelope: Any) -> None:
    result = ssh.verify(envelope, make_payload(), declaration())
    assert result.verified is False and (result.code or "").startswith("EVIDENCE_")


# -- keys -----------------------------------------------------------------------------------------


def test_a_missing_key_is_coded(load_evidence: Any, keys: Any, make_payload: Any) -> None:
    no_key = load_evidence("ssh", principal="alice@example.org")
    with pytest.raises(SchedulerError) as err:
        no_key.attest(make_payload(), declaration())
    assert err.value.code == "EVIDENCE_SSH_KEY_MISSING"
    with pytest.raises(SchedulerError) as err:
        no_key.attest(make_payload(), declaration(key=str(keys.root / "nope")))
    assert err.value.code == "EVIDENCE_SSH_KEY_MISSING"


def test_an_unusable_key_is_coded(ssh: Any, keys: Any, make_payload: Any) -> None:
    junk = keys.root / "junk"
    junk.write_text("not a key\n")
    junk.chmod(0o600)
    public = keys.root / "alice.pub"
    public.chmod(0o600)
    open_key = keys.root / "open"
    open_key.write_bytes(keys.alice.read_bytes())
    open_key.chmod(0o644)
    directory = keys.root / "dir"
    directory.mkdir()
    for path in (junk, public, open_key, directory):
        with pytest.raises(SchedulerError) as err:
            ssh.attest(make_payload(), declaration(key=str(path)))
        assert err.value.code == "EVIDENCE_SSH_KEY_UNREADABLE", path
    assert "chmod 600" in _message(ssh, make_payload(), open_key)


def _message(ssh: Any, payload: Any, key: Path) -> str:
    with pytest.raises(SchedulerError) as err:
        ssh.attest(payload, declaration(key=str(key)))
    return err.value.message


def test_a_passphrase_protected_key_is_refused_without_a_prompt(ssh: Any, keys: Any, make_payload: Any) -> None:
    locked = keys.make("locked", passphrase="correct horse")
    started = time.monotonic()
    with pytest.raises(SchedulerError) as err:
        ssh.attest(make_payload(), declaration(key=str(locked)))
    assert err.value.code == "EVIDENCE_SSH_KEY_ENCRYPTED"
    assert time.monotonic() - started < 5


def test_allowed_keys_limit_what_a_job_may_name(load_evidence: Any, keys: Any, make_payload: Any) -> None:
    provider = load_evidence("ssh", key=str(keys.alice), principal="alice@example.org",
                             allowed_signers=str(keys.allowed_signers), allowed_keys=[str(keys.carol)])
    with pytest.raises(SchedulerError) as err:
        provider.attest(make_payload(), declaration(key=str(keys.mallory)))
    assert err.value.code == "EVIDENCE_SSH_KEY_NOT_ALLOWED"
    carol = provider.attest(make_payload(), declaration(key=str(keys.carol), principal="carol@example.org"))
    assert provider.verify(carol, make_payload(), declaration(principal="carol@example.org")).verified
    assert provider.attest(make_payload(), declaration()).data["principal"] == "alice@example.org"


def test_a_missing_principal_is_coded(load_evidence: Any, keys: Any, make_payload: Any) -> None:
    provider = load_evidence("ssh", key=str(keys.alice))
    with pytest.raises(SchedulerError) as err:
        provider.attest(make_payload(), declaration())
    assert err.value.code == "EVIDENCE_SSH_PRINCIPAL_MISSING"


# -- trust ----------------------------------------------------------------------------------------


def test_verification_needs_configured_trust(load_evidence: Any, keys: Any, make_payload: Any) -> None:
    signer = load_evidence("ssh", key=str(keys.alice), principal="alice@example.org")
    payload = make_payload()
    envelope = signer.attest(payload, declaration())  # signing needs no trust file
    assert signer.verify(envelope, payload, declaration()).code == "EVIDENCE_TRUST_NOT_CONFIGURED"


def test_a_trust_file_named_by_the_job_must_be_listed_in_the_settings(load_evidence: Any, keys: Any, make_payload: Any,
                                                                     tmp_path: Path) -> None:
    # the job's own allowed-signers file trusts mallory: the host does not list it, so it counts for nothing
    rogue = tmp_path / "rogue_signers"
    rogue.write_text(f"alice@example.org {keys.public('mallory')}\n")
    listed = tmp_path / "team_signers"
    listed.write_text(f"alice@example.org {keys.public('mallory')}\n")
    provider = load_evidence("ssh", key=str(keys.mallory), principal="alice@example.org",
                             allowed_signers=str(keys.allowed_signers), trusted_allowed_signers=[str(listed)])
    payload = make_payload()
    with pytest.raises(SchedulerError) as err:
        provider.attest(payload, declaration(allowed_signers=str(rogue)))
    assert err.value.code == "EVIDENCE_TRUST_FILE_UNTRUSTED"
    envelope = provider.attest(payload, declaration(allowed_signers=str(listed)))
    assert provider.verify(envelope, payload, declaration(allowed_signers=str(listed))).verified
    assert provider.verify(envelope, payload, declaration(allowed_signers=str(rogue))).code == "EVIDENCE_TRUST_FILE_UNTRUSTED"
    assert provider.verify(envelope, payload, declaration()).code == "EVIDENCE_SIGNER_UNTRUSTED"


def test_an_unreadable_trust_file_is_coded(load_evidence: Any, keys: Any, make_payload: Any) -> None:
    signer = load_evidence("ssh", key=str(keys.alice), principal="alice@example.org", self_check=False)
    payload = make_payload()
    envelope = signer.attest(payload, declaration())
    provider = load_evidence("ssh", principal="alice@example.org", allowed_signers=str(keys.root / "missing"))
    assert provider.verify(envelope, payload, declaration()).code == "EVIDENCE_TRUST_FILE_UNREADABLE"


def test_pinned_fingerprints_narrow_the_trust_file(load_evidence: Any, keys: Any, make_payload: Any) -> None:
    payload = make_payload()
    envelope = load_evidence("ssh", key=str(keys.alice), principal="alice@example.org",
                             allowed_signers=str(keys.allowed_signers)).attest(payload, declaration())
    pinned = load_evidence("ssh", allowed_signers=str(keys.allowed_signers), allowed_fingerprints=[keys.fingerprint("carol")])
    assert pinned.verify(envelope, payload, declaration()).code == "EVIDENCE_SIGNER_UNTRUSTED"
    ok = load_evidence("ssh", allowed_signers=str(keys.allowed_signers), allowed_fingerprints=[keys.fingerprint("alice")])
    assert ok.verify(envelope, payload, declaration()).verified


# -- ssh-keygen itself ----------------------------------------------------------------------------


def test_a_missing_ssh_keygen_is_coded(load_evidence: Any, ssh: Any, keys: Any, make_payload: Any,
                                       monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    payload = make_payload()
    envelope = ssh.attest(payload, declaration())
    absent = load_evidence("ssh", key=str(keys.alice), principal="alice@example.org",
                           allowed_signers=str(keys.allowed_signers), ssh_keygen=str(tmp_path / "no-ssh-keygen"))
    with pytest.raises(SchedulerError) as err:
        absent.attest(payload, declaration())
    assert err.value.code == "EVIDENCE_SSH_KEYGEN_MISSING"
    assert absent.verify(envelope, payload, declaration()).code == "EVIDENCE_SSH_KEYGEN_MISSING"
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    assert ssh.verify(envelope, payload, declaration()).code == "EVIDENCE_SSH_KEYGEN_MISSING"


def test_a_hanging_ssh_keygen_times_out(load_evidence: Any, ssh: Any, keys: Any, make_payload: Any, tmp_path: Path) -> None:
    payload = make_payload()
    envelope = ssh.attest(payload, declaration())
    stuck = tmp_path / "stuck-ssh-keygen"
    stuck.write_text("#!/bin/sh\nsleep 30 &\nexec sleep 30\n")  # a child holding the pipes too
    stuck.chmod(stuck.stat().st_mode | stat.S_IXUSR)
    slow = load_evidence("ssh", key=str(keys.alice), principal="alice@example.org",
                         allowed_signers=str(keys.allowed_signers), ssh_keygen=str(stuck), timeout_s=0.5)
    started = time.monotonic()
    result = slow.verify(envelope, payload, declaration())
    assert (result.verified, result.code) == (False, "EVIDENCE_SSH_TIMEOUT")
    with pytest.raises(SchedulerError) as err:
        slow.attest(payload, declaration())
    assert err.value.code == "EVIDENCE_SSH_TIMEOUT"
    assert time.monotonic() - started < 4


def test_no_temporary_signature_files_are_left_behind(ssh: Any, make_payload: Any, monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    payload = make_payload()
    envelope = ssh.attest(payload, declaration())
    assert ssh.verify(envelope, payload, declaration()).verified
    assert not ssh.verify(with_data(envelope, principal="carol@example.org"), payload, declaration()).verified
    assert os.listdir(scratch) == []
