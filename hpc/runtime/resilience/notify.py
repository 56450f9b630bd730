"""Tell the user: a notice of each change that matters to the job's ``notify`` target, a webhook or an email.

    send("hung", summary, key="hung-0")                      from a rank (the hang watchdog)
    python -m hpc.runtime.resilience.notify started "on 4 nodes" --key started-0     from the batch script

A webhook gets an HTTP POST of JSON whose "text" is one line for humans (what Slack, Mattermost and Teams' incoming
webhooks show) beside the job's facts: event, job_id, job_name, task, attempt (the restart count, 0 for the first
run), host, time. Those facts are all it carries of the environment: never another variable, never the URL (webhook
URLs hold their token in the path). An email address gets a plain message through the node's ``sendmail``; where a
node has none the notice is not sent (SLURM's own mail, asked for with the profile's sbatch_extra, can tell of start
and end instead: docs/reliability.md).

A notice is a courtesy: ``send`` never raises, gives up after TIMEOUT_S in all (a dead DNS server included), and a
failure is one line on stderr that names the target's host only. The CLI always exits 0. Torch-free: the batch
shell runs it with ``python -m`` before and after the ranks.
"""

from __future__ import annotations

import argparse
import email.message
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from hpc.contract import checks, goodput, layout, runtime_config, timeline
from hpc.contract.atomic import append_whole
from hpc.errors import HpcError
from hpc.runtime.resilience import preemption

# what hpc itself sends (others may be sent; these names are what webhook consumers filter on)
EVENTS = ("started", "requeued", "node_excluded", "node_lost", "straggler", "hung", "failed", "completed")
TIMEOUT_S = 5.0  # a notice's whole budget: connect, send, answer (or sendmail); tests shorten it
MAX_TEXT_CHARS = 2000  # one line for a chat window; a hang summary over a thousand ranks is cut here
SENDMAIL_FALLBACK = "/usr/sbin/sendmail"  # where sendmail lives when /usr/sbin is not on a job's PATH


class _NotSent(Exception):
    """Why a notice did not go out, in words safe for a log (no URL path, no query)."""


def send(event: str, text: str, *, key: str | None = None, target: str | None = None) -> bool:
    """One notice; whether this call delivered it. Never raises, never blocks much over TIMEOUT_S.

    target None: the runtime config's ``notify``; none configured (or outside a job): False, silently. With a key,
    the notice goes out once per job task: a key already sent (tasks/<task>.notified) sends nothing again and
    returns False. A failed notice is not noted, so a later call with its key may try again.
    """
    event = _one_line(event)
    try:
        if target is None:
            config = runtime_config.current_config()
            target = config.notify if config is not None else None
            if not target:
                return False
        key = " ".join(key.split()) if key else None  # one line in the file
        if key and key in _sent_keys():
            return False
        _deliver_within(event, _one_line(text), target, TIMEOUT_S)
    except _NotSent as e:
        _say(f"{event} not sent: {e}")
        return False
    except Exception as e:  # noqa: BLE001 - a notice never fails the job; say what went wrong and go on
        _say(f"{event} not sent: {_scrubbed(f'{type(e).__name__}: {e}', target)}")
        return False
    if key:
        _note_sent(key)
    return True


def attempt() -> int:
    """Which run of the job task this is: its restart count, 0 for the first (SLURM's, or the local script's)."""
    try:
        return preemption.requeue_count()
    except ValueError:
        return 0


def facts(event: str, text: str) -> dict:
    """The webhook's JSON: the line for humans and the job's facts, from these variables only."""
    job_dir = os.environ.get("HPC_JOB_DIR")
    job_id = os.environ.get("SLURM_JOB_ID") or (Path(job_dir).name if job_dir else "")
    task = os.environ.get("HPC_TASK", "0")
    name = os.environ.get("SLURM_JOB_NAME") or _config_job_name()
    host, run = socket.gethostname(), attempt()
    parts = ([f"job {job_id}"] if job_id else []) + [f"task {task}"] + ([f"restart {run}"] if run else [])
    label = f"{name or 'job'} ({', '.join(parts)})"
    cost = _goodput(job_dir, task) if event == "completed" and job_dir else None
    if cost is not None:
        text = f"{text}; " if text else ""
        text += (f"goodput {cost['goodput']:.0%} of {cost['allocated_node_s']:.0f} node-seconds over "
                 f"{cost['attempts']} attempt(s), {cost['redone_steps']} step(s) redone")
    line = f"hpc: {label} on {host}: {event.replace('_', ' ')}" + (f": {text}" if text else "")
    extra = {"goodput": round(cost["goodput"], 4), "redone_steps": cost["redone_steps"]} if cost else {}
    return {"text": _shortened(line), "event": event, "job_id": job_id, "job_name": name, "task": task,
            "attempt": run, "host": host, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **extra}


def _goodput(job_dir: str, task: str) -> dict | None:
    """The completed task's goodput as the job saw it (its timeline; the allocation up to now), for the notice."""
    try:
        attempts = goodput.build(timeline.read(job_dir, task), now=time.time())
        totals = goodput.totals(attempts)
    except Exception:  # noqa: BLE001 - a notice goes out without its cost rather than not at all
        return None
    return totals if attempts and totals["goodput"] is not None else None


# --- delivery ------------------------------------------------------------------------------------------
def _deliver_within(event: str, text: str, target: str, budget_s: float) -> None:
    """Delivers in a daemon thread and waits budget_s at most: socket timeouts do not cover name resolution, which
    a cluster's DNS may stretch past any budget. A thread left behind ends with the process."""
    try:
        checks.notify_target(target)
    except HpcError:
        raise _NotSent("the target is neither a webhook URL nor an email address") from None
    outcome: list[Exception | None] = []

    def deliver() -> None:
        try:
            if target.startswith(("http://", "https://")):
                _post(target, facts(event, text), budget_s)
            else:
                _mail(target, facts(event, text), budget_s)
            outcome.append(None)
        except Exception as e:  # noqa: BLE001 - handed to the caller's thread, which says what it was
            outcome.append(e)

    worker = threading.Thread(target=deliver, name="hpc-notify", daemon=True)
    worker.start()
    worker.join(budget_s)
    if not outcome:
        raise _NotSent(f"{_where(target)} did not answer within {budget_s:g} s")
    if outcome[0] is not None:
        raise outcome[0]


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    # a redirect could carry the payload to another host: a webhook answers where it was asked, or fails
    def redirect_request(self, *args, **kwargs):
        return None


def _post(url: str, payload: dict, timeout_s: float) -> None:
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",
                                     headers={"Content-Type": "application/json", "User-Agent": "hpc-notify"})
    origin = _where(url)
    try:
        with urllib.request.build_opener(_NoRedirects).open(request, timeout=timeout_s) as answer:
            answer.read(4096)  # the answer is a courtesy ("ok"); read a little so the server is not cut off
    except urllib.error.HTTPError as e:
        moved = " (redirects are not followed)" if 300 <= e.code < 400 else ""
        raise _NotSent(f"{origin} answered {e.code}{moved}") from None
    except urllib.error.URLError as e:
        reason = e.reason
        if isinstance(reason, TimeoutError):
            raise _NotSent(f"{origin} did not answer within {timeout_s:g} s") from None
        raise _NotSent(f"cannot reach {origin}: {_scrubbed(str(reason), url)}") from None
    except TimeoutError:
        raise _NotSent(f"{origin} did not answer within {timeout_s:g} s") from None
    except OSError as e:
        raise _NotSent(f"cannot reach {origin}: {_scrubbed(str(e), url)}") from None


def _mail(address: str, payload: dict, timeout_s: float) -> None:
    sendmail = shutil.which("sendmail") or (SENDMAIL_FALLBACK if os.access(SENDMAIL_FALLBACK, os.X_OK) else None)
    if sendmail is None:
        raise _NotSent("no sendmail on this node (SLURM's own mail still tells of the job's start and end)")
    message = email.message.EmailMessage()
    message["To"] = address
    message["Subject"] = _one_line(f"hpc: {payload['job_name'] or payload['job_id'] or 'job'} {payload['event']}")
    facts_lines = [f"{k}: {payload[k]}" for k in ("event", "job_id", "job_name", "task", "attempt", "host", "time")]
    message.set_content("\n".join([payload["text"], "", *facts_lines]) + "\n")
    try:
        done = subprocess.run([sendmail, "-t", "-oi"], input=message.as_bytes(), capture_output=True,
                              timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise _NotSent(f"sendmail did not finish within {timeout_s:g} s") from None
    except OSError as e:
        raise _NotSent(f"cannot run sendmail: {e.strerror or e}") from None
    if done.returncode != 0:
        said = _one_line(done.stderr.decode(errors="replace"))[-200:]
        raise _NotSent(f"sendmail exited {done.returncode}" + (f": {said}" if said else ""))


# --- once per key --------------------------------------------------------------------------------------
def _keys_file() -> str | None:
    # outside a job (None) there is nowhere shared to keep them: every call sends
    return layout.this_task_file(layout.TaskFile.NOTIFIED)


def _sent_keys() -> set[str]:
    path = _keys_file()
    if path is None:
        return set()
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return {line.rstrip("\n") for line in f}
    except FileNotFoundError:
        return set()


def _note_sent(key: str) -> None:
    path = _keys_file()
    if path is None:
        return
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        append_whole(path, key + "\n", mode=0o644)
    except OSError as e:
        # the notice went out; a repeat of it is the worst that follows
        _say(f"sent, but cannot note key {key!r} in {path}: {e.strerror or e}")


# --- words ---------------------------------------------------------------------------------------------
def _where(url: str) -> str:
    """scheme://host[:port] only: a webhook's path and query hold its token."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or "?"
        return f"{parts.scheme}://{host}" + (f":{parts.port}" if parts.port else "")
    except ValueError:
        return "the webhook"


def _scrubbed(message: str, target: str | None) -> str:
    """A library's error text with the URL (or its path and query) replaced by its host."""
    message = _one_line(message)
    if not target or not target.startswith(("http://", "https://")):
        return message
    message = message.replace(target, _where(target))
    try:
        parts = urllib.parse.urlsplit(target)
    except ValueError:  # a URL urllib cannot split: its error may quote any of it
        return "the error text is withheld (it may quote the URL)"
    # userinfo too: http.client quotes "user:pass@host" back in its error for a URL it cannot split
    for secret in (parts.path + (f"?{parts.query}" if parts.query else ""), parts.query, parts.path,
                   parts.password, parts.username):
        if secret and len(secret) > 1:  # not "" or "/": those say nothing, and would mangle the text
            message = message.replace(secret, "…")
    return message


def _config_job_name() -> str:
    try:
        config = runtime_config.current_config()
    except HpcError:
        return ""
    return config.job_name if config is not None else ""


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _shortened(text: str) -> str:
    return text if len(text) <= MAX_TEXT_CHARS else text[:MAX_TEXT_CHARS - 1] + "…"


def _say(message: str) -> None:
    try:
        print(f"hpc: notify: {message}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass  # no stderr (closed, a full disk): the notice is lost either way


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpc.runtime.resilience.notify",
                                     description="Send one notice to the job's notify target; always exits 0.")
    parser.add_argument("event", help=f"what happened: {', '.join(EVENTS)}")
    parser.add_argument("text", help="one line for humans")
    parser.add_argument("--key", help="send once per job task under this key (e.g. started-$SLURM_RESTART_COUNT)")
    try:
        args = parser.parse_args(argv)
    except SystemExit:  # a bad call in a job script must not fail the job either; argparse said why
        return 0
    send(args.event, args.text, key=args.key)
    return 0


if __name__ == "__main__":
    sys.exit(main())
