"""The execution-artifact digests of representative jobs, pinned before the kernel redesign.

Approvals, runs, evidence, presentations and proofs bind to a job's artifact digest, so a change of
the projection (a field moved to another module, a section built by a pipeline step instead of one
function, a default read from elsewhere) would silently invalidate every binding already stored.
These digests were computed on the flat kernel before any module moved; they must never change.
Each job covers some of the fields a pipeline step owns; together they cover every step's fields.
"""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.artifacts.handoff import compile_v4
from scheduler.base.canonical import canonical_digest
from scheduler.core.artifact import native_payload
from scheduler.core.spec import validate_spec

JOB_ID = "job-pinned"

SPECS: dict[str, dict[str, Any]] = {
    "native-shell-minimal": {"name": "minimal", "schedule_kind": "manual", "payload_message": "true"},
    "native-shell-cron-options": {
        "name": "report", "schedule_kind": "cron", "schedule_cron": "30 2 * * *", "schedule_tz": "Europe/Berlin",
        "payload_message": "make report", "run_timeout_ms": 90000, "max_retries": 2, "retry_backoff_ms": 500,
        "overlap_policy": "queue", "queue_limit": 3, "delivery_guarantee": "at-least-once",
        "executor_options": {"working_dir": "/srv/reports", "env_policy": "inherit", "stdin_text": "hunter2"},
    },
    "native-agent-isolated": {
        "name": "agent-turn", "schedule_kind": "every", "schedule_every": "1h", "session_target": "isolated",
        "payload_message": "Summarise the inbox", "executor_options": {"context_mode": "isolated", "api_key": "sk-x"},
        "constraints": {"sandbox": True, "network": "none", "max_tokens": 2000},
    },
    "native-main-session": {"name": "main", "schedule_kind": "manual", "session_target": "main",
                            "payload_message": "remind me"},
    "native-output-verify-delivery": {
        "name": "checked", "schedule_kind": "manual", "payload_message": "printf '{}'", "output_format": "json",
        "verify_shell": "test -r /proc/loadavg", "verify_timeout_s": 5, "verify_on_failure": "warn",
        "delivery_mode": "always", "delivery_channel": "webhook", "delivery_to": "http://127.0.0.1:9/hook",
        "job_type": "watchdog", "watchdog_alert_channel": "webhook", "watchdog_alert_to": "http://127.0.0.1:9/a",
    },
    "native-approval": {
        "name": "gated", "schedule_kind": "manual", "payload_message": "deploy", "approval_required": True,
        "approval_timeout_s": 600, "approval_timeout_action": "approve", "approval_risk_level": "high",
        "approval_approver_scope": None,
    },
    "native-every-step": {
        "name": "deploy", "schedule_kind": "manual", "payload_message": "deploy --prod",
        "constraints": {"network": "loopback", "allowed_paths": ["/srv"]},
        "identity": {"subject": {"kind": "service", "principal": "deploy-bot"}, "trust": {"level": "operator"},
                     "delegation": {"mode": "inherit", "max_depth": 2, "allowed_delegators": ["service:*"]}},
        "credentials": [
            {"name": "api", "provider": "env", "ref": "DEPLOY_API", "present": {"medium": "env", "key": "API_TOKEN"}},
            {"name": "cert", "provider": "file", "ref": "/etc/cert", "present": {"medium": "file", "file_name": "c.pem"},
             "required": False},
        ],
        "child_credential_policy": "downscope",
        "authorization_ref": "policyfile:deploy",
        "authorization": {"request": {"include": ["job", "trigger", "identity"]}, "escalation": {"risk_level": "high"}},
        "authorization_proof": {"method": "jwt", "source": {"env": "DEPLOY_PROOF"}, "issuer": "https://issuer.example",
                                "audience": "scheduler", "jwks_url": "https://issuer.example/jwks.json"},
        "evidence": {"provider": "checksum", "payload": {"bind": ["command", "result"], "context": {"ticket": "OPS-1"}},
                     "verify": {"required": True}, "collect": ["stdout"], "retention": "30d"},
        "evidence_ref": "soc2-deploy",
        "approval_required": True, "approval_approver_scope": "uid:0",
        "output_format": "ndjson", "verify_shell": "true",
    },
}

#: Digest of each job's native artifact (job id ``job-pinned``), computed before the redesign.
PINNED_NATIVE: dict[str, str] = {
    "native-agent-isolated": "sha256:fd7c32479c42ee848bb640c766dbfe887ede17f78ac1765c0759d850e3861a03",
    "native-approval": "sha256:66ba0dc931c908901558eca60163d78845880706b0eec5f985b4f96ac55b004d",
    "native-every-step": "sha256:33b8fe5a1ef9fdd38c6d7a0063f945c6731a9a2bbb2377c6a936286b436967d4",
    "native-main-session": "sha256:a676257421d3e0b9a845a772cf22d46ef914d9bd8efb8ed954ccc81807b4216a",
    "native-output-verify-delivery": "sha256:14745b4d7b479db4f771310050c9bbf826606105f480139e5c33836ea49fc025",
    "native-shell-cron-options": "sha256:28925cdda8152deb226e1975016e3cf5bc09acbee7d2723d1b79654967ea9552",
    "native-shell-minimal": "sha256:7421665cd0c58bd9c50638f4d4cbbd09d410713d090c735257faea4e79e7abac",
}

#: Digest of each job's handoff v4 artifact (workflow ``pins``, task = the job's key).
PINNED_HANDOFF: dict[str, str] = {
    "native-agent-isolated": "sha256:b24c65127231df4200279350fb82164c78864e76027434aa4d9205d4e56d819f",
    "native-approval": "sha256:9adf471797f2e3dd1a26c28414ca6a2f2c5540c5ede9b87e2d4b691e70ca7b57",
    "native-every-step": "sha256:834f802a0a123ac2bcc1462cb17c270e539a9fdec3c585f6394608530016d218",
    "native-main-session": "sha256:8f61bda9dec1bbd1e21fe5c76f0549a2c3a95c42ad5f4a51ba4857df6d1e43f0",
    "native-output-verify-delivery": "sha256:6ca4cbfebf41d1738c8df52b86905d356937350eb591fddd404518996883a564",
    "native-shell-cron-options": "sha256:21e9dc35101cbdcd1607fd8b828822ef0066f177e4156172c6fb6ef9bc0f6ff3",
    "native-shell-minimal": "sha256:8562e04cd3d60f5bc671733ebe0548abc15e32c457f11b0b2451e88fec077225",
}


def spec_of(key: str) -> Any:
    return validate_spec(SPECS[key], plugin_options=False)


@pytest.mark.parametrize("key", sorted(SPECS))
def test_native_artifact_digest_is_pinned(key: str) -> None:
    assert canonical_digest(native_payload(spec_of(key), JOB_ID)) == PINNED_NATIVE[key]


@pytest.mark.parametrize("key", sorted(SPECS))
def test_handoff_v4_artifact_digest_is_pinned(key: str) -> None:
    payload = compile_v4(spec_of(key), job_id=JOB_ID, workflow_id="pins", task_id=key)
    assert canonical_digest(payload) == PINNED_HANDOFF[key]


def test_every_pinned_job_has_both_digests_and_they_differ() -> None:
    assert set(PINNED_NATIVE) == set(PINNED_HANDOFF) == set(SPECS)
    assert len(set(PINNED_NATIVE.values()) | set(PINNED_HANDOFF.values())) == 2 * len(SPECS)
