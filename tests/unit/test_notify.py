"""hpc.runtime.resilience.notify: one notice to a webhook or an email address, bounded in time, never failing the
job, and never carrying the environment's secrets or the webhook's own URL."""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hpc.contract import layout
from hpc.contract.runtime_config import RuntimeConfig
from hpc.runtime.resilience import notify, watchdog

TOKEN_PATH = "/hooks/T0/B0/tok3n-in-the-path"


@pytest.fixture(autouse=True)
def job_env(monkeypatch, tmp_path):
    """A job's environment, a secret among it, no proxy (the local server must be reached directly)."""
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY",
                 "SLURM_JOB_ID", "SLURM_JOB_NAME", "SLURM_RESTART_COUNT", "HPC_RESTART_COUNT", "HPC_TASK",
                 "HPC_JOB_DIR", layout.RUNTIME_CONFIG_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_TOKEN", "secret123")
    monkeypatch.setattr(notify, "TIMEOUT_S", 1.0)
    return tmp_path


class _Hook(http.server.BaseHTTPRequestHandler):
    status = 200
    location = ""

    def do_POST(self):  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.received.append((self.path, self.headers.get("Content-Type"), body))
        self.send_response(self.status)
        if self.location:
            self.send_header("Location", self.location)
        self.end_headers()
        self.wfile.write(b"ok")

    do_GET = do_POST  # noqa: N815 - what a followed redirect would turn the POST into

    def log_message(self, *args):
        pass


@pytest.fixture
def webhook():
    """A webhook on a local port: yields (server, URL with a token in its path)."""
    def start(status=200, location=""):
        handler = type("Hook", (_Hook,), {"status": status, "location": location})
        server = http.server.HTTPServer(("127.0.0.1", 0), handler)
        server.received = []
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        servers.append(server)
        return server, f"http://127.0.0.1:{server.server_port}{TOKEN_PATH}?sig=qu3ry"

    servers: list = []
    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _secret_free(text: str) -> None:
    assert "secret123" not in text and "tok3n" not in text and "qu3ry" not in text and "HF_TOKEN" not in text


def test_a_webhook_gets_one_line_and_the_job_facts_and_nothing_else_of_the_environment(webhook, monkeypatch,
                                                                                          capsys):
    server, url = webhook()
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_JOB_NAME", "train-llm")
    monkeypatch.setenv("HPC_TASK", "3")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    assert notify.send("hung", "hang: no step for 300 s;\nrank 5 is stuck", target=url) is True
    (path, content_type, body), = server.received
    assert path == TOKEN_PATH + "?sig=qu3ry" and content_type == "application/json"
    sent = json.loads(body)
    assert set(sent) == {"text", "event", "job_id", "job_name", "task", "attempt", "host", "time"}
    assert sent["event"] == "hung" and sent["job_id"] == "4242" and sent["job_name"] == "train-llm"
    assert sent["task"] == "3" and sent["attempt"] == 2 and sent["host"] == socket.gethostname()
    assert time.strptime(sent["time"], "%Y-%m-%dT%H:%M:%SZ")
    assert "\n" not in sent["text"] and sent["text"].startswith("hpc: train-llm (job 4242, task 3, restart 2) on ")
    assert sent["text"].endswith(": hung: hang: no step for 300 s; rank 5 is stuck")
    _secret_free(body.decode())
    assert capsys.readouterr().err == ""


def test_the_target_and_job_name_come_from_the_runtime_config_and_none_configured_is_silent(webhook, monkeypatch,
                                                                                            tmp_path, capsys):
    assert notify.send("started", "on 2 nodes") is False  # outside a job
    config = tmp_path / "runtime.json"
    RuntimeConfig(job_name="from-config").write(config)
    monkeypatch.setenv(layout.RUNTIME_CONFIG_ENV, str(config))
    assert notify.send("started", "on 2 nodes") is False  # a job without notify
    assert capsys.readouterr().err == ""
    server, url = webhook()
    RuntimeConfig(job_name="from-config", notify=url).write(config)
    monkeypatch.setenv("HPC_JOB_DIR", str(tmp_path / "from-config-20250101-000000-abcd"))
    assert notify.send("completed", "") is True
    sent = json.loads(server.received[0][2])
    assert sent["job_name"] == "from-config" and sent["job_id"] == "from-config-20250101-000000-abcd"
    assert sent["attempt"] == 0 and sent["text"].endswith(": completed")


def test_an_error_answer_is_one_line_on_stderr_naming_the_host_only(webhook, capsys):
    _, url = webhook(500)
    assert notify.send("failed", "exit 1", target=url) is False
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hpc: notify: failed not sent: http://127.0.0.1:")
    assert err.rstrip().endswith(" answered 500")
    _secret_free(err)


def test_a_redirect_is_not_followed(webhook, capsys):
    elsewhere, other_url = webhook()
    _, url = webhook(302, location=other_url)
    assert notify.send("failed", "exit 1", target=url) is False
    assert elsewhere.received == []
    err = capsys.readouterr().err
    assert "answered 302 (redirects are not followed)" in err and err.count("\n") == 1
    _secret_free(err)


def test_a_server_that_never_answers_is_given_up_on_within_the_budget(monkeypatch, capsys):
    monkeypatch.setattr(notify, "TIMEOUT_S", 0.5)
    with socket.socket() as silent:  # listens, never accepts: the connection is made, no answer ever comes
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        started = time.monotonic()
        assert notify.send("straggler", "rank 3", target=f"http://127.0.0.1:{silent.getsockname()[1]}"
                                                         f"{TOKEN_PATH}") is False
        assert time.monotonic() - started < 3
    err = capsys.readouterr().err
    assert "did not answer within 0.5 s" in err and err.count("\n") == 1
    _secret_free(err)


def test_name_resolution_that_hangs_is_cut_off_too(monkeypatch, capsys):
    monkeypatch.setattr(notify, "TIMEOUT_S", 0.3)
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: time.sleep(5))  # a dead DNS server
    started = time.monotonic()
    assert notify.send("hung", "x", target=f"https://hooks.example.com{TOKEN_PATH}") is False
    assert time.monotonic() - started < 2
    err = capsys.readouterr().err
    assert "https://hooks.example.com did not answer within 0.3 s" in err
    _secret_free(err)


def test_an_unreachable_port_and_a_bad_target_are_one_line_each(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    assert notify.send("requeued", "preempted", target=f"http://127.0.0.1:{port}{TOKEN_PATH}?sig=qu3ry") is False
    err = capsys.readouterr().err
    assert err.startswith(f"hpc: notify: requeued not sent: cannot reach http://127.0.0.1:{port}")
    _secret_free(err)
    assert notify.send("requeued", "x", target=f"http://user:pa55word@127.0.0.1{TOKEN_PATH}") is False
    err = capsys.readouterr().err  # http.client quotes the userinfo back in its error
    assert err.count("\n") == 1 and "pa55word" not in err
    _secret_free(err)
    for bad in ("ftp://example.com/x", "not a target", ""):
        assert notify.send("requeued", "preempted", target=bad) is False
        err = capsys.readouterr().err
        assert err == "hpc: notify: requeued not sent: the target is neither a webhook URL nor an email address\n"


def test_a_key_sends_once_per_task_in_the_job_folder_and_every_time_outside_a_job(webhook, monkeypatch, tmp_path):
    server, url = webhook()
    assert notify.send("started", "a", key="started-0", target=url) is True
    assert notify.send("started", "a", key="started-0", target=url) is True  # no job folder: nowhere to keep it
    monkeypatch.setenv("HPC_JOB_DIR", str(tmp_path))
    monkeypatch.setenv("HPC_TASK", "7")
    assert notify.send("started", "a", key="started-0", target=url) is True
    assert notify.send("started", "a", key="started-0", target=url) is False
    assert notify.send("started", "b", key="started-1", target=url) is True
    assert len(server.received) == 4
    notified = Path(layout.JobFolder(tmp_path).task("7", layout.TaskFile.NOTIFIED))
    assert notified.read_text() == "started-0\nstarted-1\n"
    monkeypatch.setenv("HPC_TASK", "8")  # another array task keeps its own
    assert notify.send("started", "a", key="started-0", target=url) is True


def test_a_failed_keyed_notice_is_not_noted_so_it_may_be_tried_again(webhook, monkeypatch, tmp_path):
    monkeypatch.setenv("HPC_JOB_DIR", str(tmp_path))
    _, failing = webhook(500)
    assert notify.send("hung", "x", key="hung-0", target=failing) is False
    server, url = webhook()
    assert notify.send("hung", "x", key="hung-0", target=url) is True and len(server.received) == 1


def _fake_sendmail(folder: Path, monkeypatch, exit_code: int = 0) -> Path:
    got = folder / "mail.txt"
    script = folder / "bin" / "sendmail"
    script.parent.mkdir()
    script.write_text(f'#!/bin/sh\necho "$@" > "{got}.args"\ncat > "{got}"\nexit {exit_code}\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")
    return got


def test_an_email_address_gets_a_plain_message_through_sendmail(monkeypatch, tmp_path, capsys):
    got = _fake_sendmail(tmp_path, monkeypatch)
    monkeypatch.setenv("SLURM_JOB_NAME", "train-llm")
    assert notify.send("node_excluded", "node7: bad GPU", target="you@example.org") is True
    assert Path(f"{got}.args").read_text().split() == ["-t", "-oi"]
    mail = got.read_text()
    assert "To: you@example.org\n" in mail and "Subject: hpc: train-llm node_excluded\n" in mail
    assert ": node excluded: node7: bad GPU" in mail and "secret123" not in mail
    assert capsys.readouterr().err == ""


def test_email_without_sendmail_or_with_a_failing_one_is_not_sent(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sendmail on it
    monkeypatch.setattr(notify, "SENDMAIL_FALLBACK", str(tmp_path / "nowhere"))
    assert notify.send("failed", "x", target="you@example.org") is False
    assert "not sent: no sendmail on this node" in capsys.readouterr().err
    _fake_sendmail(tmp_path, monkeypatch, exit_code=75)
    assert notify.send("failed", "x", target="you@example.org") is False
    assert "failed not sent: sendmail exited 75" in capsys.readouterr().err


def test_the_cli_exits_0_when_the_notice_fails(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = tmp_path / "runtime.json"
    RuntimeConfig(notify=f"http://127.0.0.1:{port}{TOKEN_PATH}").write(config)
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env.update({layout.RUNTIME_CONFIG_ENV: str(config), "HPC_JOB_DIR": str(tmp_path), "HF_TOKEN": "secret123"})
    # the path the batch scripts run: the old one, kept
    done = subprocess.run([sys.executable, "-m", "hpc.runtime.notify", "failed", "exit 1", "--key", "failed-0"],
                          env=env, capture_output=True, text=True, timeout=30,
                          cwd=Path(notify.__file__).resolve().parents[3])
    assert done.returncode == 0 and done.stdout == ""
    assert done.stderr.startswith(f"hpc: notify: failed not sent: cannot reach http://127.0.0.1:{port}")
    _secret_free(done.stderr)
    assert not Path(layout.JobFolder(tmp_path).task("0", layout.TaskFile.NOTIFIED)).exists()
    assert notify.main(["only-an-event"]) == 0  # a bad call in a job script fails nothing either


def test_the_rank_that_writes_the_hang_verdict_sends_it_once_per_attempt(monkeypatch, tmp_path):
    sent = []
    monkeypatch.setattr(notify, "send", lambda event, text, **kw: sent.append((event, text, kw)) or True)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    dog = watchdog.HangWatchdog(60, rank=0, world_size=1, host="node1", report_dir=tmp_path)
    record = {"rank": 0, "host": "node1", "in_collective": False, "where": "step (train.py:9)",
              "last_beat": "batch", "seconds_since_beat": 61.0, "time": time.time()}
    summary = dog._report(record, "stack", "rank 0 on node1 is not in a collective")
    assert summary and (tmp_path / "summary.txt").read_text() == summary + "\n"
    assert sent == [("hung", summary, {"key": "hung-1"})]
    monkeypatch.setattr(notify, "send", lambda *a, **k: 1 / 0)  # a broken notice never stops the process ending
    assert dog._report(record, "stack", "again") is not None
