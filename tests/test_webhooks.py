"""Signed webhooks and notices (issue 11), against a real HTTP receiver on 127.0.0.1.

The receiver (http.server in a thread) verifies the signature of every request it gets with the
secret of the webhook the request's path names; a bad or missing signature fails the test. Its
behaviour per request is programmable: a status, a hang, a 10 MB answer, a redirect, a reset.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import http.server
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import HOUR, MIN, NOW_MS, SEC, Cli, at

SECRET_A = "acme-secret-0123456789"
SECRET_G = "globex-secret-0123456789"
SECRET_ALL = "every-tenant-secret-0123"

Action = int | str  # an HTTP status, or "hang", "big", "redirect", "reset"


def verify(secret: str, header: str, body: bytes) -> bool:
    """What a receiver does (the README's receiver, in a few lines)."""
    parts = dict(p.split("=", 1) for p in header.split(","))
    mac = hmac.new(secret.encode(), parts["t"].encode() + b"." + body, hashlib.sha256)
    return hmac.compare_digest(mac.hexdigest(), parts["v1"])


class Receiver:
    """A real HTTP server; `got` holds (path, event) for every request whose answer was 2xx."""

    def __init__(self) -> None:
        self.secrets: dict[str, str] = {}
        self.got: list[tuple[str, dict[str, Any]]] = []
        self.requests: list[tuple[str, int]] = []  # (path, seq) of every request
        self.bad: list[str] = []
        self.plan: Callable[[str, int], Action] = lambda path, n: 200
        self.hang_s = 30.0
        self.lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                path = self.path
                secret = receiver.secrets.get(path)
                header = self.headers.get("X-Better-Compute-Signature", "")
                if secret is None or not verify(secret, header, body):
                    receiver.bad.append(f"{path}: {header!r}")
                if self.headers.get("Content-Type") != "application/json":
                    receiver.bad.append(f"{path}: content type {self.headers.get('Content-Type')}")
                doc = json.loads(body)
                with receiver.lock:
                    n = sum(1 for p, _ in receiver.requests if p == path)
                    receiver.requests.append((path, doc["seq"]))
                action = receiver.plan(path, n)
                if action == "hang":
                    time.sleep(receiver.hang_s)
                    return
                if action == "trickle":  # a byte at a time: no socket timeout ever fires
                    with contextlib.suppress(OSError):
                        for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"x" * 200:
                            self.wfile.write(bytes([byte]))
                            self.wfile.flush()
                            time.sleep(0.1)
                    return
                if action == "reset":
                    linger = struct.pack("ii", 1, 0)
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
                    self.connection.close()
                    return
                if action == "redirect":
                    self.send_response(302)
                    self.send_header("Location", "/elsewhere")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if action == "big":
                    size = 10 * 1024 * 1024
                    self.send_response(200)
                    self.send_header("Content-Length", str(size))
                    self.end_headers()
                    with receiver.lock:
                        receiver.got.append((path, doc))
                    with contextlib.suppress(OSError):  # the sender stops reading: it needs no body
                        self.wfile.write(b"x" * size)
                    return
                assert isinstance(action, int)
                if 200 <= action < 300:
                    with receiver.lock:
                        receiver.got.append((path, doc))
                self.send_response(action)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        class Server(http.server.ThreadingHTTPServer):
            request_queue_size = 128  # two ticks open 32 connections at once

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def seqs(self, path: str) -> list[int]:
        with self.lock:
            return [d["seq"] for p, d in self.got if p == path]

    def types(self, path: str) -> list[str]:
        with self.lock:
            return [d["type"] for p, d in self.got if p == path]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    r = Receiver()
    try:
        yield r
        assert r.bad == [], r.bad  # every request carried a valid signature
    finally:
        r.close()


def hook(run: Cli, r: Receiver, path: str, tenant: str, secret: str, *extra: str) -> str:
    r.secrets[path] = secret
    doc = run.ok(
        "webhook", "add", "--tenant", tenant, "--url", r.url(path), "--secret", secret, *extra
    )
    assert doc["secret"] == secret
    return str(doc["id"])


def reserve(run: Cli, tenant: str, key: str, *args: str, now: str | None = None) -> dict[str, Any]:
    extra = {} if now is None else {"now": now}
    return dict(
        run.ok(
            "reserve",
            "--tenant",
            tenant,
            "--gpus",
            "8",
            "--for",
            "2h",
            "--key",
            key,
            *args,
            **extra,
        )
    )


def tick(run: Cli, offset: int = 0) -> dict[str, Any]:
    return dict(run.ok("tick", now=at(offset)))


def added_at(run: Cli, hid: str) -> int:
    """The seq of a webhook's own `webhook.added` event: it receives what comes after."""
    return next(
        e["seq"]
        for e in run.ok("events")
        if e["type"] == "webhook.added" and e["data"]["webhookId"] == hid
    )


def log(run: Cli, hid: str, *args: str) -> list[dict[str, Any]]:
    """The events (as `events --json` prints them) that came after webhook `hid` was added."""
    return list(run.ok("events", "--since", str(added_at(run, hid)), *args))


# ---------------------------------------------------------------- managing webhooks


def test_the_secret_is_shown_once_then_only_its_fingerprint(run: Cli) -> None:
    added = run.ok("webhook", "add", "--tenant", "acme", "--url", "https://hooks.example/x")
    secret = added["secret"]
    assert secret.startswith("whsec_") and len(secret) > 40
    listed = run.ok("webhook", "list")
    assert listed == [{k: v for k, v in added.items() if k != "secret"}]
    assert listed[0]["secretFingerprint"].startswith("sha256:")
    assert secret not in json.dumps(listed)
    code, text, _ = run("webhook", "list", json=False)
    assert code == 0 and secret not in text and added["id"] in text
    logged = [e for e in run.ok("events") if e["type"] == "webhook.added"]
    assert secret not in json.dumps(logged)  # nor in the event log, which names only the host
    assert logged[0]["data"] == {
        "webhookId": added["id"],
        "host": "hooks.example",
        "events": [],
        "by": logged[0]["actor"],
    }
    deleted = run.ok("webhook", "delete", added["id"])
    assert deleted == {"id": added["id"], "deleted": True}
    assert run.ok("webhook", "list") == []
    assert run.fails(3, "webhook", "delete", added["id"])["code"] == "NOT_FOUND"


def test_ids_are_printed_whole_on_a_narrow_terminal(run: Cli) -> None:
    """Review finding: at 80 columns the tables cut ids to `dlv_ay409jb…`, which redeliver,
    delete and test then could not find."""
    url = "http://127.0.0.1:9/hooks/acme/a-long-path/that/goes/on/and/on/and/on"
    hook = run.ok("webhook", "add", "--tenant", "acme", "--url", url)
    run.ok("reserve", "--tenant", "acme", "--gpus", "1", "--for", "1h")
    run.ok("tick")
    delivery = run.ok("webhook", "deliveries")[0]
    for width in ("60", "80"):
        for view in (["webhook", "list"], ["webhook", "deliveries"]):
            code, text, _ = run(*view, json=False, env={"COLUMNS": width})
            assert code == 0 and hook["id"] in text, text
        assert delivery["id"] in text, text


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("ftp://hooks.example/x", "http or https"),
        ("file:///etc/passwd", "http or https"),
        ("https://user:pw@hooks.example/x", "credentials"),
        ("https://token@hooks.example/x", "credentials"),
        ("https:///x", "no host"),
        ("https://hooks.example:99999/x", "not a valid URL"),
        ("https://hooks.example/a b", "without spaces"),
        ("hooks.example/x", "http or https"),
        ("http://127.0.0.1:8080/\u00fc", "percent-encode"),
        ("https://b\u00fccher.example/x", "xn--"),
        ("http://127.0.0.1:0/x", "port 0"),
    ],
)
def test_only_http_urls_without_credentials(run: Cli, url: str, words: str) -> None:
    err = run.fails(2, "webhook", "add", "--tenant", "acme", "--url", url)
    assert err["code"] == "INVALID_INPUT" and words in err["message"], err
    assert run.ok("webhook", "list") == []


def test_bad_events_secrets_and_tenants_are_refused(run: Cli) -> None:
    url = "https://hooks.example/x"
    bad_type = run.fails(2, "webhook", "add", "--tenant", "acme", "--url", url, "--events", "nope")
    assert "reservation.preempting" in bad_type["message"]
    fleet = run.fails(2, "webhook", "add", "--tenant", "acme", "--url", url, "--events", "node.*")
    assert "--tenant '*'" in fleet["message"]
    assert run.ok("webhook", "add", "--tenant", "*", "--url", url, "--events", "node.*")
    run.ok("webhook", "delete", run.ok("webhook", "list")[0]["id"])
    for deeper in ("pool.policy.set", "pool.policy.*"):  # types may have more than one dot
        hook = run.ok("webhook", "add", "--tenant", "*", "--url", url, "--events", deeper)
        assert hook["events"] == [deeper]
        run.ok("webhook", "delete", hook["id"])
    assert run.fails(2, "webhook", "add", "--tenant", "acme", "--url", url, "--secret", "short")
    assert run.fails(3, "webhook", "add", "--tenant", "nobody", "--url", url)["code"] == "NOT_FOUND"
    assert run.fails(3, "webhook", "test", "whk_missing")["code"] == "NOT_FOUND"
    assert run.fails(2, "webhook", "redeliver")["code"] == "INVALID_INPUT"
    assert run.ok("webhook", "list") == []


def test_a_tenant_manages_only_its_own_webhooks(run: Cli) -> None:
    run.ok("policy", "set", "--tenant", "acme", "--principal", "bob")
    run.ok("policy", "set", "--tenant", "globex", "--principal", "carol")
    url = "https://hooks.example/x"
    mine = run.ok(
        "webhook", "add", "--tenant", "acme", "--url", url, env={"BETTER_COMPUTE_PRINCIPAL": "bob"}
    )
    bob = {"BETTER_COMPUTE_PRINCIPAL": "bob"}
    carol = {"BETTER_COMPUTE_PRINCIPAL": "carol"}
    assert run.fails(6, "webhook", "add", "--tenant", "globex", "--url", url, env=bob)
    star = run.fails(6, "webhook", "add", "--tenant", "*", "--url", url, env=bob)
    assert "admin" in star["message"]
    everything = run.ok("webhook", "add", "--tenant", "*", "--url", url)  # an admin may
    assert [h["id"] for h in run.ok("webhook", "list", env=bob)] == [mine["id"]]
    assert run.ok("webhook", "list", env=carol) == []
    assert {h["id"] for h in run.ok("webhook", "list")} == {mine["id"], everything["id"]}
    for command in ("delete", "test"):
        assert run.fails(3, "webhook", command, mine["id"], env=carol)["code"] == "NOT_FOUND"
        assert run.fails(3, "webhook", command, everything["id"], env=bob)["code"] == "NOT_FOUND"
    assert run.fails(3, "webhook", "deliveries", "--webhook", mine["id"], env=carol)
    assert run.ok("webhook", "delete", mine["id"], env=bob)["deleted"] is True


def test_webhook_test_sends_a_signed_test_event_and_reports_the_answer(
    run: Cli, receiver: Receiver
) -> None:
    hid = hook(run, receiver, "/a", "acme", SECRET_A)
    doc = run.ok("webhook", "test", hid)
    assert doc == {
        "webhookId": hid,
        "url": receiver.url("/a"),
        "ok": True,
        "status": 200,
        "error": None,
    }
    assert receiver.types("/a") == ["webhook.test"]
    assert receiver.got[0][1]["seq"] == 0 and receiver.got[0][1]["tenantId"] == "acme"
    receiver.plan = lambda path, n: 503
    failed = run.ok("webhook", "test", hid)
    assert failed["ok"] is False and failed["status"] == 503 and "503" in failed["error"]
    assert not any(e["type"] == "webhook.test" for e in run.ok("events"))  # never logged
    # A receiver that trickles its answer a byte at a time trips no socket timeout: the test
    # still ends after webhook.timeoutMs.
    run.ok("config", "set", "webhook.timeoutMs", "1000")
    receiver.plan = lambda path, n: "trickle"
    began = time.monotonic()
    slow = run.ok("webhook", "test", hid)
    assert time.monotonic() - began < 8
    assert slow["ok"] is False and slow["status"] is None and "timed out" in slow["error"]


# ---------------------------------------------------------------- delivery


def test_tick_delivers_each_tenants_events_signed_and_in_order(
    run: Cli, receiver: Receiver
) -> None:
    a = hook(run, receiver, "/a", "acme", SECRET_A)
    g = hook(run, receiver, "/g", "globex", SECRET_G)
    everything = hook(run, receiver, "/all", "*", SECRET_ALL)
    reserve(run, "acme", "a1")
    reserve(run, "globex", "g1")
    done = tick(run)
    # the body is exactly the event as `events --json` prints it to that tenant
    assert [d for p, d in receiver.got if p == "/a"] == log(run, a, "--tenant", "acme")
    assert [d for p, d in receiver.got if p == "/g"] == log(run, g, "--tenant", "globex")
    assert [d for p, d in receiver.got if p == "/all"] == log(run, everything)
    assert len(receiver.seqs("/a")) == 4 and len(receiver.seqs("/all")) == 8
    assert done["deliveries"] == {"sent": 16, "failed": 0, "deadLettered": 0, "left": 0}
    # nothing twice: the next tick has nothing to send
    assert tick(run)["deliveries"] == {"sent": 0, "failed": 0, "deadLettered": 0, "left": 0}
    assert len(receiver.got) == 16


def test_a_webhook_whose_creator_lost_the_tenant_sends_nothing(
    run: Cli, receiver: Receiver
) -> None:
    """§6: a principal who may no longer act for a tenant sees none of its events, so a webhook
    it added (to a URL it chose) is suspended until it may again; its managers see that."""
    eve, bob = {"BETTER_COMPUTE_PRINCIPAL": "eve"}, {"BETTER_COMPUTE_PRINCIPAL": "bob"}
    receiver.secrets["/eve"] = SECRET_A
    url = receiver.url("/eve")
    hid = run.ok("webhook", "add", "--tenant", "acme", "--url", url, "--secret", SECRET_A, env=eve)
    run.ok("policy", "set", "--tenant", "acme", "--principal", "bob")  # eve is out
    reserve(run, "acme", "secret-project")
    tick(run)
    assert receiver.got == []
    [listed] = run.ok("webhook", "list", env=bob)
    assert listed["id"] == hid["id"] and listed["suspended"] is True
    assert run.ok("webhook", "list", env=eve) == []
    run.ok("policy", "set", "--tenant", "acme", "--principal", "eve")  # back in
    reserve(run, "acme", "after")
    tick(run, MIN)
    got = [d for p, d in receiver.got if p == "/eve"]
    assert got and all(d["reservationId"] != receiver_blind(run, "secret-project") for d in got)
    assert run.ok("webhook", "list", env=eve)[0]["suspended"] is False


def test_events_logged_while_the_creator_had_no_rights_are_never_sent(
    run: Cli, receiver: Receiver
) -> None:
    """Rights are judged at every change of them, not only at ticks: eve loses acme and gets it
    back with no tick in between, and what acme logged meanwhile never reaches her URL (a
    review found it was sent by the next tick). What was logged before she lost it is queued
    then, and sent by the tick, since her rights are back by then (a second review: the
    change that gave them back dead-lettered it)."""
    eve = {"BETTER_COMPUTE_PRINCIPAL": "eve"}
    receiver.secrets["/eve"] = SECRET_A
    url = receiver.url("/eve")
    run.ok("webhook", "add", "--tenant", "acme", "--url", url, "--secret", SECRET_A, env=eve)
    reserve(run, "acme", "before")
    run.ok("policy", "set", "--tenant", "acme", "--principal", "bob")  # eve is out
    reserve(run, "acme", "while-out")
    run.ok("policy", "set", "--tenant", "acme", "--principal", "eve")  # back in, no tick between
    reserve(run, "acme", "after")
    tick(run, MIN)
    changes = [e["seq"] for e in run.ok("events", "--tenant", "acme") if e["type"] == "policy.set"]
    out, back = changes  # eve was out from the first to the second
    got = [d["seq"] for p, d in receiver.got if p == "/eve"]
    assert got and back in got and not [s for s in got if out < s < back]
    listed = {d["eventSeq"]: d for d in run.ok("webhook", "deliveries")}
    assert not [s for s in listed if out < s < back]  # never even queued
    before = [d for s, d in listed.items() if s < out]  # logged before she was out: sent
    assert before and all(d["state"] == "delivered" for d in before)
    assert {d["eventSeq"] for d in before} <= set(got)


def test_what_a_suspended_webhook_had_queued_is_dead_lettered(run: Cli, receiver: Receiver) -> None:
    """Nothing waits on rights that may never come back: `left` does not count it forever."""
    eve = {"BETTER_COMPUTE_PRINCIPAL": "eve"}
    receiver.secrets["/eve"] = SECRET_A
    url = receiver.url("/eve")
    run.ok("webhook", "add", "--tenant", "acme", "--url", url, "--secret", SECRET_A, env=eve)
    run.ok("config", "set", "webhook.tickBudgetMs", "0")  # paused: the events queue
    reserve(run, "acme", "queued-before")
    assert tick(run)["deliveries"]["left"] == 4
    run.ok("policy", "set", "--tenant", "acme", "--principal", "bob")  # eve is out
    run.ok("config", "set", "webhook.tickBudgetMs", "10000")
    assert tick(run, MIN)["deliveries"] == {"sent": 0, "failed": 0, "deadLettered": 4, "left": 0}
    assert receiver.got == []
    dead = run.ok("webhook", "deliveries", "--failed")
    assert len(dead) == 4 and {d["state"] for d in dead} == {"dead"}
    assert all(d["attempts"][-1]["error"].startswith("suspended: ") for d in dead)
    # Redelivered while suspended, the next tick dead-lettered them again, one attempt more
    # each (a longer back-off later): refused when named, left dead by --failed.
    err = run.fails(4, "webhook", "redeliver", dead[0]["id"])
    assert "suspended" in err["message"], err
    assert run.fails(4, "webhook", "redeliver", "--failed", "--webhook", dead[0]["webhookId"])
    assert run.ok("webhook", "redeliver", "--failed") == []
    assert run.ok("webhook", "deliveries", "--failed") == dead  # untouched
    run.ok("policy", "set", "--tenant", "acme", "--principal", "eve")  # back in: they go
    assert len(run.ok("webhook", "redeliver", "--failed")) == 4
    assert tick(run, 2 * MIN)["deliveries"]["sent"] == 5  # and the policy event letting eve in


def receiver_blind(run: Cli, key: str) -> str:
    """The id of the reservation with this key (the receiver must never have heard of it)."""
    return str(run.ok("list", "--key", key)[0]["id"])


def test_a_preemption_notice_to_another_tenant_does_not_name_the_preemptor(
    run: Cli, receiver: Receiver
) -> None:
    """The spot seed's redaction holds for webhooks: globex learns it is preempted, not by whom."""
    hook(run, receiver, "/g", "globex", SECRET_G, "--events", "reservation.preempting")
    hook(run, receiver, "/a", "acme", SECRET_A, "--events", "reservation.*")
    run.ok("quota", "set", "--tenant", "globex", "--gpus", "64")
    for i in range(7):
        reserve(run, "globex", f"spot-{i}", "--spot")
    winner = reserve(run, "acme", "big")
    assert winner["state"] == "placed"
    tick(run)
    notices = [d for p, d in receiver.got if p == "/g"]
    assert [d["type"] for d in notices] == ["reservation.preempting"]
    assert notices[0]["actor"] == "system" and "by" not in notices[0]["data"]
    assert winner["id"] not in json.dumps(notices)
    assert all(d["tenantId"] == "acme" for p, d in receiver.got if p == "/a")


def test_a_500_is_retried_with_backoff_and_later_events_wait(run: Cli, receiver: Receiver) -> None:
    hid = hook(run, receiver, "/a", "acme", SECRET_A)
    receiver.plan = lambda path, n: 500 if n < 2 else 200
    reserve(run, "acme", "a1")  # created, placed
    first = tick(run)  # + binding, active
    seqs = [e["seq"] for e in log(run, hid)]
    assert len(seqs) == 4
    assert first["deliveries"] == {"sent": 0, "failed": 1, "deadLettered": 0, "left": 4}
    assert receiver.requests == [("/a", seqs[0])]  # only the head was tried
    assert tick(run, 2 * SEC)["deliveries"]["sent"] == 0  # its backoff (5-10 s) has not passed
    assert tick(run, 11 * SEC)["deliveries"] == {
        "sent": 0,
        "failed": 1,
        "deadLettered": 0,
        "left": 4,
    }
    assert tick(run, MIN)["deliveries"] == {"sent": 4, "failed": 0, "deadLettered": 0, "left": 0}
    assert [s for _, s in receiver.requests] == [seqs[0], seqs[0], *seqs]
    rows = run.ok("webhook", "deliveries", "--webhook", hid)
    assert [(r["eventSeq"], r["state"]) for r in rows] == [(s, "delivered") for s in seqs]
    head = rows[0]["attempts"]
    assert [(a["status"], a["error"]) for a in head] == [
        (500, "HTTP 500"),
        (500, "HTTP 500"),
        (200, None),
    ]
    assert [a["at"] for a in head] == [NOW_MS, NOW_MS + 11 * SEC, NOW_MS + MIN]


def test_a_tick_counts_only_the_deliveries_its_principal_may_see(
    run: Cli, receiver: Receiver
) -> None:
    """Anyone may run tick, and it sends every webhook's events; its counts described globex's
    failing receiver to an acme member, to whom globex's deliveries are NOT_FOUND."""
    run.ok("policy", "set", "--tenant", "acme", "--principal", "bob")
    run.ok("policy", "set", "--tenant", "globex", "--principal", "carol")
    hook(run, receiver, "/g", "globex", SECRET_G)
    receiver.plan = lambda path, n: 500
    reserve(run, "globex", "g1")
    bob = {"BETTER_COMPUTE_PRINCIPAL": "bob"}
    carol = {"BETTER_COMPUTE_PRINCIPAL": "carol"}
    assert "deliveries" not in run.ok("tick", now=at(0), env=bob)  # as if there were none
    assert len(receiver.requests) == 1  # sent all the same
    hook(run, receiver, "/a", "acme", SECRET_A)
    seen_by_bob = run.ok("tick", now=at(1 * SEC), env=bob)["deliveries"]
    assert seen_by_bob == {"sent": 0, "failed": 0, "deadLettered": 0, "left": 0}
    assert run.ok("tick", now=at(11 * SEC), env=carol)["deliveries"]["left"] == 4
    assert run.ok("tick", now=at(MIN))["deliveries"]["failed"] == 1  # an admin sees them all


@pytest.mark.parametrize("group", ["webhook", "pool"])
def test_a_group_without_its_command_is_one_usage_error(run: Cli, group: str) -> None:
    """`--json webhook` printed its help on stdout (exit 2, stderr empty) where every other group
    gives the usage error as JSON on stderr."""
    entry = [sys.executable, "-c", "from better_compute.cli import main; main()"]
    done = subprocess.run(
        [*entry, "--db", str(run.db), "--json", group], capture_output=True, text=True, check=False
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert json.loads(done.stderr)["error"]["code"] == "INVALID_INPUT"


def test_dead_letter_after_the_retry_period_then_redeliver(run: Cli, receiver: Receiver) -> None:
    run.ok("config", "set", "webhook.retryForMs", str(2 * MIN))
    hid = hook(run, receiver, "/a", "acme", SECRET_A, "--events", "reservation.created")
    receiver.plan = lambda path, n: 500
    reserve(run, "acme", "a1")
    offsets = [0, 15 * SEC, 45 * SEC, 90 * SEC, 3 * MIN]
    reports = [tick(run, t)["deliveries"] for t in offsets]
    # a retry that would come after the period is not made: the delivery is dead-lettered then
    assert sum(r["deadLettered"] for r in reports) == 1 and reports[-1]["left"] == 0
    dead = run.ok("webhook", "deliveries", "--failed")
    created = [e["seq"] for e in log(run, hid) if e["type"] == "reservation.created"]
    assert [(d["webhookId"], d["eventSeq"], d["state"]) for d in dead] == [
        (hid, created[0], "dead")
    ]
    assert all(a["status"] == 500 for a in dead[0]["attempts"])
    assert dead[0]["attempts"][-1]["at"] <= NOW_MS + 3 * MIN
    # a later event is not held up by the dead one
    reserve(run, "acme", "a2", now=at(4 * MIN))
    receiver.plan = lambda path, n: 200
    assert tick(run, 4 * MIN)["deliveries"]["sent"] == 1
    assert (
        run.fails(2, "webhook", "redeliver", dead[0]["id"], "--failed")["code"] == "INVALID_INPUT"
    )
    again = run.ok("webhook", "redeliver", "--failed")
    assert [(d["id"], d["state"]) for d in again] == [(dead[0]["id"], "queued")]
    assert run.fails(4, "webhook", "redeliver", dead[0]["id"])["code"] == "CONFLICT"
    assert tick(run, 5 * MIN)["deliveries"]["sent"] == 1
    assert run.ok("webhook", "deliveries", "--failed") == []
    later = [e["seq"] for e in log(run, hid) if e["type"] == "reservation.created"][1]
    assert receiver.seqs("/a") == [later, created[0]]  # redelivered on request, after the later one


def test_a_timeout_is_a_failed_attempt(run: Cli, receiver: Receiver) -> None:
    run.ok("config", "set", "webhook.timeoutMs", "300")
    hook(run, receiver, "/a", "acme", SECRET_A, "--events", "reservation.created")
    receiver.hang_s = 3
    receiver.plan = lambda path, n: "hang" if n == 0 else 200
    reserve(run, "acme", "a1")
    began = time.monotonic()
    report = tick(run)["deliveries"]
    assert time.monotonic() - began < 2.5
    assert report == {"sent": 0, "failed": 1, "deadLettered": 0, "left": 1}
    attempt = run.ok("webhook", "deliveries")[0]["attempts"][0]
    assert attempt["status"] is None and "timed out" in attempt["error"]
    assert tick(run, MIN)["deliveries"]["sent"] == 1


def test_a_hanging_receiver_does_not_hold_the_tick_past_its_budget(
    run: Cli, receiver: Receiver
) -> None:
    run.ok("config", "set", "webhook.timeoutMs", "60000")
    run.ok("config", "set", "webhook.tickBudgetMs", "1000")
    hook(run, receiver, "/slow", "acme", SECRET_A)
    fast = hook(run, receiver, "/fast", "globex", SECRET_G)
    receiver.plan = lambda path, n: "hang" if path == "/slow" else 200
    a = reserve(run, "acme", "a1")
    reserve(run, "globex", "g1")
    began = time.monotonic()
    done = tick(run)
    took = time.monotonic() - began
    assert took < 3.5, took
    assert {c["type"] for c in done["changes"]} == {"reservation.binding", "reservation.active"}
    assert run.ok("get", a["id"])["state"] == "active"  # the lifecycle committed regardless
    # the fast receiver got everything; the slow one's head failed, and its queue waits
    assert receiver.seqs("/fast") == [e["seq"] for e in log(run, fast, "--tenant", "globex")]
    assert done["deliveries"]["failed"] == 1 and done["deliveries"]["left"] == 4
    attempt = run.ok("webhook", "deliveries", "--webhook", run.ok("webhook", "list")[0]["id"])
    assert "budget" in attempt[0]["attempts"][0]["error"]


def test_a_trickling_receiver_is_cut_off_by_the_budget(run: Cli, receiver: Receiver) -> None:
    run.ok("config", "set", "webhook.timeoutMs", "5000")
    run.ok("config", "set", "webhook.tickBudgetMs", "1000")
    hid = hook(run, receiver, "/t", "acme", SECRET_A, "--events", "reservation.created")
    receiver.plan = lambda path, n: "trickle"
    reserve(run, "acme", "a1")
    began = time.monotonic()
    done = tick(run)
    assert time.monotonic() - began < 3.5
    assert done["deliveries"] == {"sent": 0, "failed": 1, "deadLettered": 0, "left": 1}
    attempt = run.ok("webhook", "deliveries", "--webhook", hid)[0]["attempts"][0]
    assert attempt["status"] is None and "budget" in attempt["error"]


@pytest.mark.parametrize("action", ["big", "redirect", "reset"])
def test_hostile_answers_never_fail_the_tick(run: Cli, receiver: Receiver, action: str) -> None:
    hook(run, receiver, "/h", "acme", SECRET_A, "--events", "reservation.created")
    receiver.plan = lambda path, n: action
    reserve(run, "acme", "a1")
    began = time.monotonic()
    done = tick(run)
    assert time.monotonic() - began < 4
    rows = run.ok("webhook", "deliveries")
    attempt = rows[0]["attempts"][0]
    if action == "big":  # a 2xx status line is the answer; the 10 MB body is never read
        assert done["deliveries"]["sent"] == 1 and attempt["status"] == 200
    elif action == "redirect":
        assert attempt["status"] == 302 and "not followed" in attempt["error"]
        assert [p for p, _ in receiver.requests] == ["/h"]  # /elsewhere was never asked
    else:
        assert attempt["status"] is None and attempt["error"]
        assert done["deliveries"]["left"] == 1


def test_https_verifies_certificates(run: Cli) -> None:
    """A TLS server with a self-signed certificate is refused: the attempt fails, the tick runs."""
    ssl = pytest.importorskip("ssl")
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("no openssl to make a certificate")
    folder = run.db.parent
    key, cert = folder / "key.pem", folder / "cert.pem"
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"https://127.0.0.1:{server.server_address[1]}/x"
        hid = run.ok("webhook", "add", "--tenant", "acme", "--url", url)["id"]
        doc = run.ok("webhook", "test", hid)
        assert doc["ok"] is False and "CERTIFICATE_VERIFY_FAILED" in doc["error"]
    finally:
        server.shutdown()
        server.server_close()


# ---------------------------------------------------------------- two ticks at once


def _cli() -> list[str]:
    exe = shutil.which("better-compute")
    if exe is not None:
        return [exe]
    return [sys.executable, "-c", "from better_compute.cli import main; main()"]


@pytest.mark.sqlite_only(reason="real tick processes are given the ledger's file path")
def test_two_ticks_racing_never_send_the_same_attempt(run: Cli, receiver: Receiver) -> None:
    """Two real processes tick at once. More webhooks than one tick sends to at a time, so both
    send; every (webhook, event) arrives once, in seq order per webhook."""
    run.ok("config", "set", "webhook.tickBudgetMs", "60000")  # no send is cut short: every
    run.ok("config", "set", "webhook.timeoutMs", "20000")  # request below is one attempt
    kinds = [("acme", SECRET_A), ("globex", SECRET_G), ("*", SECRET_ALL)]
    hids = [hook(run, receiver, f"/{i}", *kinds[i % 3]) for i in range(24)]
    for i in range(4):
        reserve(run, "acme" if i % 2 else "globex", f"k{i}", "--gpus", "2")

    # The first answers wait (at most 4 s) until more requests are open at once than one tick
    # sends at a time: then both ticks are sending, truly in parallel.
    gate = threading.Condition()
    open_now = [0, 0]  # open requests, the most seen at once

    def plan(path: str, n: int) -> Action:
        with gate:
            open_now[0] += 1
            open_now[1] = max(open_now[1], open_now[0])
            gate.notify_all()
            gate.wait_for(lambda: open_now[1] > 16, timeout=4)
            open_now[0] -= 1
        return 200

    receiver.plan = plan
    env = {k: v for k, v in os.environ.items() if not k.startswith("BETTER_COMPUTE_")}
    for name in ("http_proxy", "HTTP_PROXY"):
        env.pop(name, None)
    command = [*_cli(), "--db", str(run.db), "--now", at(MIN), "--json", "tick"]
    procs = [
        subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
    reports = [json.loads(out)["deliveries"] for out, _ in outs]
    failures = [a for d in run.ok("webhook", "deliveries") for a in d["attempts"] if a["error"]]
    assert failures == []
    assert tick(run, MIN)["deliveries"]["left"] == 0
    for i, hid in enumerate(hids):
        sent = [s for p, s in receiver.requests if p == f"/{i}"]
        assert sent == sorted(set(sent)), f"/{i}: {sent}"  # once each, in seq order
        assert receiver.seqs(f"/{i}") == [
            e["seq"]
            for e in log(
                run, hid, *([] if kinds[i % 3][0] == "*" else ["--tenant", kinds[i % 3][0]])
            )
        ]
    assert open_now[1] > 16 and all(r["sent"] > 0 for r in reports), (open_now, reports)
    assert len(receiver.requests) == len(set(receiver.requests))


# ---------------------------------------------------------------- notices


def test_starting_and_expiring_notices_come_once_and_are_delivered(
    run: Cli, receiver: Receiver
) -> None:
    hook(
        run,
        receiver,
        "/a",
        "acme",
        SECRET_A,
        "--events",
        "reservation.starting,reservation.expiring",
    )
    later = reserve(run, "acme", "cal", "--start", "+1h")  # [1h, 3h)
    now_one = reserve(run, "acme", "now", "--gpus", "4")  # [0, 2h): never a starting notice
    types = [(c["type"], c["reservationId"]) for c in tick(run)["changes"]]
    assert ("reservation.starting", now_one["id"]) not in types
    assert tick(run, 44 * MIN)["changes"] == []
    assert [(c["type"], c["reservationId"]) for c in tick(run, 45 * MIN)["changes"]] == [
        ("reservation.starting", later["id"])
    ]
    assert tick(run, 50 * MIN)["changes"] == []
    tick(run, HOUR)  # binding, active
    assert [(c["type"], c["reservationId"]) for c in tick(run, 80 * MIN)["changes"]] == [
        ("reservation.expiring", now_one["id"])
    ]
    tick(run, 81 * MIN)
    expiring = [c for c in tick(run, 140 * MIN)["changes"] if c["type"] == "reservation.expiring"]
    assert [c["reservationId"] for c in expiring] == [later["id"]]
    assert [c["data"]["end"] for c in expiring] == [NOW_MS + 3 * HOUR]
    tick(run, 150 * MIN)
    assert receiver.types("/a") == [
        "reservation.starting",
        "reservation.expiring",
        "reservation.expiring",
    ]
    logged = run.ok("events", "--tenant", "acme")
    assert sum(e["type"] == "reservation.starting" for e in logged) == 1
    assert sum(e["type"] == "reservation.expiring" for e in logged) == 2


def test_a_failed_repair_check_gives_no_starting_notice(run: Cli) -> None:
    rsv = reserve(run, "acme", "cal", "--start", "+1h", "--gpus", "8", "--gang", "7")
    assert rsv["state"] == "placed"
    run.ok("node", "cordon", rsv["allocations"][0]["nodeId"])
    types = [c["type"] for c in tick(run, 45 * MIN)["changes"]]
    assert types == ["reservation.pending"]
    assert "reservation.starting" not in [e["type"] for e in run.ok("events")]


def test_notice_settings_turn_notices_off(run: Cli) -> None:
    run.ok("config", "set", "notice.expiringMs", "0")
    run.ok("config", "set", "repair.leadMs", "0")
    reserve(run, "acme", "cal", "--start", "+1h")
    types = set()
    for t in range(0, 4 * HOUR, 15 * MIN):
        types |= {c["type"] for c in tick(run, t)["changes"]}
    assert "reservation.starting" not in types and "reservation.expiring" not in types
    assert "reservation.released" in types


@pytest.mark.sqlite_only(reason="holds SQLite's file lock from another connection")
def test_a_locked_ledger_ends_delivery_within_the_budget(run: Cli, receiver: Receiver) -> None:
    """Another command holding the write lock costs delivery its budget, not the busy timeout."""
    import sqlite3

    from better_compute.render.webhooks import body
    from better_compute.service import delivery
    from better_compute.service.context import open_ctx
    from tests.conftest import ME, NOW

    run.ok("config", "set", "webhook.tickBudgetMs", "500")
    hook(run, receiver, "/a", "acme", SECRET_A)
    reserve(run, "acme", "a1")
    ctx = open_ctx(str(run.db), NOW, ME, None)
    other = sqlite3.connect(run.db, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        began = time.monotonic()
        report = delivery.deliver(ctx, body)
        assert time.monotonic() - began < 2
        assert report is not None and report.sent == 0
        other.execute("ROLLBACK")
        later = delivery.deliver(ctx, body)
        assert later is not None and later.sent == 2 and later.left == 0
    finally:
        other.close()
        ctx.db.close()
    assert receiver.types("/a") == ["reservation.created", "reservation.placed"]


# ---------------------------------------------------------------- backoff and signature


@given(st.integers(min_value=1, max_value=200), st.text(min_size=1, max_size=20))
def test_backoff_is_exponential_capped_jittered_and_replayable(attempt: int, dlv: str) -> None:
    from better_compute.service.delivery import BACKOFF_BASE_MS, BACKOFF_CAP_MS, retry_delay

    base = min(BACKOFF_BASE_MS * 2 ** min(attempt - 1, 30), BACKOFF_CAP_MS)
    delay = retry_delay(attempt, dlv)
    assert base // 2 <= delay < base
    assert retry_delay(attempt, dlv) == delay  # from the delivery, never from the process


@given(st.text(min_size=16, max_size=40), st.integers(0, 2**45), st.binary(max_size=200))
def test_the_signature_is_what_the_readme_receiver_checks(secret: str, t: int, body: bytes) -> None:
    from better_compute.service.delivery import sign

    header = sign(secret, t, body)
    assert header.startswith(f"t={t},v1=")
    assert verify(secret, header, body)
    assert not verify(secret, header, body + b" ")
    assert not verify(secret, header.replace(f"t={t}", f"t={t + 1}"), body)


def test_tenants_take_turns_and_first_tries_go_before_retries() -> None:
    """One tenant's many hanging receivers cannot keep another tenant's webhook, or a receiver
    that has not failed, waiting behind them: the 16 send slots go by this order."""
    from better_compute.service.delivery import MAX_IN_FLIGHT, sending_order
    from better_compute.storage.webhooks import Head

    def head(hook: str, tenant: str, attempts: int = 0) -> Head:
        return Head(f"dlv_{hook}", hook, tenant, 1, NOW_MS, attempts)

    hanging = [head(f"whk_a{i:02d}", "acme") for i in range(80)]
    order = sending_order([*hanging, head("whk_z", "globex"), head("whk_zz", "*")])
    first = [h.webhook_id for h in order[:MAX_IN_FLIGHT]]
    assert first[:3] == ["whk_a00", "whk_z", "whk_zz"]  # each tenant's first webhook, by id
    retried = [head(f"whk_a{i:02d}", "acme", attempts=1) for i in range(40)]
    order = sending_order([*retried, head("whk_b", "acme")])
    assert order[0].webhook_id == "whk_b"  # never tried: ahead of its tenant's retries
    # another tenant's retry still gets its turn in the first round, ahead of acme's fresh heads
    order = sending_order([*hanging, head("whk_r", "globex", attempts=3)])
    assert [h.webhook_id for h in order[:2]] == ["whk_a00", "whk_r"]


def test_deliveries_behind_a_failing_head_say_they_wait_for_it(
    run: Cli, receiver: Receiver
) -> None:
    """Only a webhook's head is sent: the deliveries queued behind it name it, instead of a
    next attempt that has long passed (a reviewer read `queued, next 00:01` an hour later)."""
    hook(run, receiver, "/a", "acme", SECRET_A, "--events", "reservation.created")
    receiver.plan = lambda path, n: 500
    for key in ("a1", "a2", "a3"):
        reserve(run, "acme", key)
    tick(run, 0)
    tick(run, HOUR)
    queued = run.ok("webhook", "deliveries")
    head = queued[0]["eventSeq"]
    assert [d["state"] for d in queued] == ["queued"] * 3
    assert [d["behindEventSeq"] for d in queued] == [None, head, head]
    assert len(queued[0]["attempts"]) == 2 and queued[1]["attempts"] == []
    table = run("webhook", "deliveries", json=False, now=at(HOUR))[1]
    assert table.count(f"queued behind #{head}") == 2 and table.count("queued, next") == 1
