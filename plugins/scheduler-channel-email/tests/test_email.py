"""The e-mail channel against real aiosmtpd servers on loopback: plain, STARTTLS and implicit TLS, with login."""

from __future__ import annotations

import hashlib
import socket
import time
from email import message_from_bytes
from email.policy import default as default_policy
from pathlib import Path
from typing import Any

import pytest
from scheduler_toolkit.options import build_options

from scheduler.api import (
    PLUGIN_API_VERSION,
    Channel,
    DeliveryPart,
    DeliveryRoute,
    PermanentDeliveryError,
    SchedulerError,
    TransientDeliveryError,
)

USER, PASSWORD = "mailer", "s3cret-Pa55word-value"
FROM = "Scheduler <scheduler@example.org>"
TO = "ops@example.org"


def part(body: str = "[Job completed] backup\nStatus: ok", key: str = "run-1:delivery:part:1/1", index: int = 1,
         count: int = 1, **extra: Any) -> DeliveryPart:
    return DeliveryPart(idempotency_key=key, index=index, count=count, body=body, run_id="run-1", job_id="job-1", **extra)


def route(target: str | None = TO, **options: Any) -> DeliveryRoute:
    from scheduler_channel_email import EmailOptions

    return DeliveryRoute(channel="email", target=target, options=build_options(EmailOptions, options, "delivery_options"))


def parsed(received: Any) -> Any:
    return message_from_bytes(received.data, policy=default_policy)


@pytest.fixture
def password_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setenv("TEST_SMTP_PASSWORD", PASSWORD)
    return {"credential": "env:TEST_SMTP_PASSWORD"}


@pytest.fixture
def plain(smtp_server: Any) -> Any:
    return smtp_server()


@pytest.fixture
def plain_channel(load_channel: Any, plain: Any) -> Any:
    return load_channel("email", host="127.0.0.1", port=plain.port, security="plain", from_address=FROM, timeout_s=1.0)


def test_loaded_through_the_entry_point(plain_channel: Any) -> None:
    assert isinstance(plain_channel, Channel) and plain_channel.plugin_api == PLUGIN_API_VERSION
    assert plain_channel.capabilities == {"attachments"}
    assert plain_channel.limits.supports_attachments and plain_channel.limits.max_attachment_bytes == 25 * 1024 * 1024


def test_plain_to_loopback_delivers_a_text_message(plain_channel: Any, plain: Any) -> None:
    receipt = plain_channel.send(part("[Job completed] backup\nGrüße ✓"), route("Ops <ops@example.org>, dev@example.org"))
    (received,) = plain.messages
    assert received.mail_from == "scheduler@example.org"
    assert received.rcpt_tos == ["ops@example.org", "dev@example.org"]
    message = parsed(received)
    assert message["From"] == FROM and message["To"] == "ops@example.org, dev@example.org"
    assert message["Subject"] == "[scheduler] [Job completed] backup"
    expected_id = f"<{hashlib.sha256(b'run-1:delivery:part:1/1').hexdigest()[:40]}@example.org>"
    assert message["Message-ID"] == expected_id and receipt.receipt_id == expected_id
    assert message["X-Scheduler-Idempotency-Key"] == "run-1:delivery:part:1/1"
    assert message["X-Scheduler-Run-Id"] == "run-1" and message["X-Scheduler-Job-Id"] == "job-1"
    assert message.get_content_type() == "text/plain"
    assert message.get_content().replace("\r\n", "\n") == "[Job completed] backup\nGrüße ✓\n"
    assert receipt.details["recipients"] == ["ops@example.org", "dev@example.org"]


def test_the_same_part_gets_the_same_message_id(plain_channel: Any, plain: Any) -> None:
    plain_channel.send(part(), route())
    plain_channel.send(part(), route())
    plain_channel.send(part(key="run-1:delivery:part:2/2", index=2, count=2), route())
    ids = [parsed(m)["Message-ID"] for m in plain.messages]
    assert ids[0] == ids[1] != ids[2]


def test_subjects_cc_and_reply_to(plain_channel: Any, plain: Any) -> None:
    plain_channel.send(part(key="k:part:2/3", index=2, count=3), route())
    plain_channel.send(part(), route(subject="Job {job_id}: {first_line} [{index}/{count}]", cc=["boss@example.org"],
                                     reply_to="noreply@example.org"))
    first, second = (parsed(m) for m in plain.messages)
    assert first["Subject"] == "[scheduler] [Job completed] backup (2/3)"
    assert second["Subject"] == "[scheduler] Job job-1: [Job completed] backup [1/1]"
    assert second["Cc"] == "boss@example.org" and second["Reply-To"] == "noreply@example.org"
    assert plain.messages[1].rcpt_tos == ["ops@example.org", "boss@example.org"]


def test_options_are_validated(plain_channel: Any) -> None:
    from scheduler_channel_email import EmailOptions

    for bad in ({"subject": "{password}"}, {"subject": "two\nlines"}, {"cc": ["not an address"]}, {"reply_to": "x"}):
        with pytest.raises(SchedulerError) as caught:
            build_options(EmailOptions, bad, "delivery_options")
        assert caught.value.code == "VALIDATION_FAILED"


def test_targets(load_channel: Any, plain: Any) -> None:
    channel = load_channel("email", host="localhost", port=plain.port, security="plain", from_address=FROM,
                           default_to="fallback@example.org")
    channel.send(part(), route(None))
    assert plain.messages[0].rcpt_tos == ["fallback@example.org"]
    bare = load_channel("email", host="localhost", port=plain.port, security="plain", from_address=FROM)
    for target, code in ((None, "EMAIL_TARGET_MISSING"), ("not-an-address", "EMAIL_TARGET_INVALID"),
                         ("a@example.org\r\nBcc: evil@example.org", "EMAIL_TARGET_INVALID")):
        with pytest.raises(PermanentDeliveryError) as caught:
            bare.send(part(), route(target))
        assert caught.value.code == code
    no_sender = load_channel("email", host="localhost", port=plain.port, security="plain")
    with pytest.raises(PermanentDeliveryError) as caught:
        no_sender.send(part(), route())
    assert caught.value.code == "EMAIL_NOT_CONFIGURED"
    assert len(plain.messages) == 1


def test_plain_to_a_remote_host_is_refused_at_configure_time(load_channel: Any) -> None:
    for host in ("smtp.example.org", "10.0.0.5", "192.168.1.1"):
        with pytest.raises(SchedulerError) as caught:
            load_channel("email", host=host, security="plain", from_address=FROM)
        assert caught.value.code == "EMAIL_PLAINTEXT_REFUSED"
    for host in ("localhost", "127.0.0.1", "127.0.0.53", "::1"):
        assert load_channel("email", host=host, security="plain", from_address=FROM) is not None


def test_starttls_with_login(load_channel: Any, smtp_server: Any, certs: tuple[Path, Path], password_env: dict[str, str]) -> None:
    server = smtp_server(tls="starttls", auth=True)
    channel = load_channel("email", host="localhost", port=server.port, security="starttls", ca_file=str(certs[0]),
                           username=USER, password=password_env, from_address=FROM, timeout_s=2.0)
    channel.send(part(), route())
    assert server.logins == [(USER, PASSWORD)]
    assert len(server.messages) == 1


def test_implicit_tls_with_login(load_channel: Any, smtp_server: Any, certs: tuple[Path, Path],
                                 password_env: dict[str, str]) -> None:
    server = smtp_server(tls="implicit", auth=True)
    channel = load_channel("email", host="127.0.0.1", port=server.port, security="tls", ca_file=str(certs[0]),
                           username=USER, password=password_env, from_address=FROM, timeout_s=2.0)
    channel.send(part(), route())
    assert server.logins == [(USER, PASSWORD)] and len(server.messages) == 1


def test_an_unverifiable_certificate_is_permanent(load_channel: Any, smtp_server: Any, password_env: dict[str, str]) -> None:
    for tls, security in (("implicit", "tls"), ("starttls", "starttls")):
        server = smtp_server(tls=tls, auth=True)
        channel = load_channel("email", host="127.0.0.1", port=server.port, security=security, username=USER,
                               password=password_env, from_address=FROM, timeout_s=2.0)  # system CAs only
        with pytest.raises(PermanentDeliveryError) as caught:
            channel.send(part(), route())
        assert caught.value.code == "EMAIL_TLS_FAILED"
        assert not server.logins and not server.messages


def test_starttls_required_but_not_offered(load_channel: Any, plain: Any) -> None:
    channel = load_channel("email", host="127.0.0.1", port=plain.port, security="starttls", from_address=FROM)
    with pytest.raises(PermanentDeliveryError) as caught:
        channel.send(part(), route())
    assert caught.value.code == "EMAIL_STARTTLS_UNSUPPORTED" and not plain.messages


def test_a_wrong_password_is_permanent_and_never_quoted(load_channel: Any, smtp_server: Any, certs: tuple[Path, Path],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WRONG_PASSWORD", "wrong-Pa55-value")
    server = smtp_server(tls="starttls", auth=True)
    channel = load_channel("email", host="localhost", port=server.port, ca_file=str(certs[0]), username=USER,
                           password={"credential": "env:WRONG_PASSWORD"}, from_address=FROM, timeout_s=2.0)
    with pytest.raises(PermanentDeliveryError) as caught:
        channel.send(part(), route())
    assert caught.value.code == "EMAIL_AUTH_FAILED"
    assert "wrong-Pa55-value" not in str(caught.value) and caught.value.__cause__ is None
    assert not server.messages


def test_password_problems(load_channel: Any, plain: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_SUCH_PASSWORD", raising=False)
    channel = load_channel("email", host="127.0.0.1", port=plain.port, security="plain", username=USER,
                           password={"credential": "env:NO_SUCH_PASSWORD"}, from_address=FROM)
    with pytest.raises(PermanentDeliveryError) as caught:
        channel.send(part(), route())
    assert caught.value.code == "SECRET_UNRESOLVED"
    channel = load_channel("email", host="127.0.0.1", port=plain.port, security="plain", username=USER, from_address=FROM)
    with pytest.raises(PermanentDeliveryError) as caught:
        channel.send(part(), route())
    assert caught.value.code == "EMAIL_NOT_CONFIGURED"
    with pytest.raises(SchedulerError) as config:
        load_channel("email", password="literal-password")
    assert config.value.code == "CONFIG_INVALID" and "literal-password" not in str(config.value.to_json())


def test_attachments(plain_channel: Any, plain: Any, tmp_path: Path) -> None:
    csv = tmp_path / "report.csv"
    csv.write_bytes(b"a,b\n1,2\n")
    blob = b"\x00\x01binary\xff"
    attachments = (
        {"name": "report.csv", "mime_type": "text/csv", "size_bytes": 8, "sha256": hashlib.sha256(b"a,b\n1,2\n").hexdigest(),
         "path": str(csv)},
        {"name": "blob.bin", "mime_type": "application/octet-stream", "size_bytes": len(blob),
         "sha256": hashlib.sha256(blob).hexdigest(), "content": blob},
    )
    plain_channel.send(part(attachments=attachments), route())
    message = parsed(plain.messages[0])
    assert message.get_content_type() == "multipart/mixed"
    body = message.get_body(("plain",))
    assert body.get_content().startswith("[Job completed] backup")
    files = {a.get_filename(): (a.get_content_type(), a.get_payload(decode=True)) for a in message.iter_attachments()}
    assert files == {"report.csv": ("text/csv", b"a,b\n1,2\n"), "blob.bin": ("application/octet-stream", blob)}


def test_bad_attachments_are_permanent(load_channel: Any, plain: Any) -> None:
    channel = load_channel("email", host="127.0.0.1", port=plain.port, security="plain", from_address=FROM,
                           max_attachment_bytes=4)
    for attachment, code in (({"name": "a", "content": b"12345"}, "EMAIL_ATTACHMENT_TOO_LARGE"),
                             ({"name": "a", "content": b"12", "sha256": "0" * 64}, "EMAIL_ATTACHMENT_INVALID")):
        with pytest.raises(PermanentDeliveryError) as caught:
            channel.send(part(attachments=(attachment,)), route())
        assert caught.value.code == code
    assert not plain.messages


def test_recipient_refusals(plain_channel: Any, plain: Any) -> None:
    plain.rcpt_replies["busy@example.org"] = "450 4.2.1 mailbox busy"
    with pytest.raises(TransientDeliveryError) as caught:
        plain_channel.send(part(), route("busy@example.org"))
    assert caught.value.code == "EMAIL_TEMPORARY_FAILURE" and "mailbox busy" in caught.value.message
    plain.rcpt_replies["nobody@example.org"] = "550 5.1.1 no such user"
    with pytest.raises(PermanentDeliveryError) as caught:
        plain_channel.send(part(), route("nobody@example.org"))
    assert caught.value.code == "EMAIL_RECIPIENTS_REFUSED" and "nobody@example.org" in caught.value.message
    with pytest.raises(PermanentDeliveryError) as caught:
        plain_channel.send(part(), route("ops@example.org, nobody@example.org"))
    assert caught.value.code == "EMAIL_SOME_RECIPIENTS_REFUSED"
    (received,) = plain.messages  # the accepted recipient got it once; the part is not retried
    assert received.rcpt_tos == ["ops@example.org"]


@pytest.mark.parametrize(("reply", "kind", "code"), [
    ("451 4.3.0 try again later", TransientDeliveryError, "EMAIL_TEMPORARY_FAILURE"),
    ("554 5.7.1 message rejected as spam", PermanentDeliveryError, "EMAIL_REJECTED"),
])
def test_data_refusals(plain_channel: Any, plain: Any, reply: str, kind: type, code: str) -> None:
    plain.data_script.append(reply)
    with pytest.raises(kind) as caught:
        plain_channel.send(part(), route())
    assert caught.value.code == code and reply.split(" ", 1)[0] in caught.value.message
    assert not plain.messages


def test_a_server_that_hangs_in_data_times_out(plain_channel: Any, plain: Any) -> None:
    plain.data_script.append(("hang", 5))
    started = time.monotonic()
    with pytest.raises(TransientDeliveryError) as caught:
        plain_channel.send(part(), route())
    assert caught.value.code == "EMAIL_TIMEOUT" and time.monotonic() - started < 4


def test_a_server_that_never_greets_times_out(load_channel: Any, silent_port: int) -> None:
    channel = load_channel("email", host="127.0.0.1", port=silent_port, security="plain", from_address=FROM, timeout_s=0.5)
    started = time.monotonic()
    with pytest.raises(TransientDeliveryError) as caught:
        channel.send(part(), route())
    assert caught.value.code == "EMAIL_TIMEOUT" and time.monotonic() - started < 3


def test_a_connection_dropped_mid_data_is_transient(plain_channel: Any, plain: Any) -> None:
    plain.data_script.append("drop")
    with pytest.raises(TransientDeliveryError) as caught:
        plain_channel.send(part(), route())
    assert caught.value.code == "EMAIL_CONNECTION_FAILED"
    plain_channel.send(part(), route())  # the retry goes through
    assert len(plain.messages) == 1


def test_a_refused_connection_is_transient(load_channel: Any) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    channel = load_channel("email", host="127.0.0.1", port=port, security="plain", from_address=FROM)
    with pytest.raises(TransientDeliveryError) as caught:
        channel.send(part(), route())
    assert caught.value.code == "EMAIL_CONNECTION_FAILED"
