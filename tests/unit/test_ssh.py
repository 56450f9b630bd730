"""The SSH seam without a server: the options that keep it from prompting or hanging, one connection per
settings, and ssh's failures as one line with the fix. (tests/test_remote_ssh.py runs it for real.)"""

import base64
import subprocess

import pytest

from hpc.cluster.config import precedence
from hpc.cluster.config.schema import Remote
from hpc.cluster.ssh import Ssh
from hpc.errors import HpcError


def remote(**kw) -> Remote:
    return Remote(**{"host": "login.example.org", "job_root": "/scratch/me/jobs", **kw})


def option(argv: list[str], name: str) -> str | None:
    values = [argv[i + 1].split("=", 1)[1] for i, a in enumerate(argv[:-1]) if a == "-o" and
              argv[i + 1].startswith(name + "=")]
    return values[0] if values else None


def test_every_call_is_batch_mode_with_timeouts_and_a_shared_master():
    argv = Ssh(remote(user="me", port=2200, identity_file="/k/id", jump_host="bastion", env=["module load slurm"],
                      connect_timeout=7)).command_line("squeue --me")
    assert argv[0] == "ssh" and argv[-3:-1] == ["login.example.org", "--"]
    wrapped = argv[-1]  # bash, whatever the login shell: it sees base64 in single quotes only
    assert wrapped.startswith("bash -c 'eval ") and wrapped.count("'") == 2 and "!" not in wrapped
    packed = wrapped.split("echo ", 1)[1].split(" |", 1)[0]
    lines = base64.b64decode(packed).decode().split("\n")  # the profile's lines first; then a start marker
    assert lines[0] == "module load slurm" and lines[-1] == "squeue --me" and lines[1].startswith("printf")
    assert option(argv, "BatchMode") == "yes" and option(argv, "ConnectTimeout") == "7"
    assert option(argv, "StrictHostKeyChecking") == "yes"  # an unknown key fails; it is never asked about
    assert option(argv, "ControlMaster") == "auto" and option(argv, "ServerAliveInterval") == "5"
    for flag, value in (("-p", "2200"), ("-i", "/k/id"), ("-J", "bastion"), ("-l", "me")):
        assert argv[argv.index(flag) + 1] == value


def test_other_keys_or_host_keys_get_a_connection_of_their_own():
    a, b = Ssh(remote()), Ssh(remote(identity_file="/other/key"))
    assert option(a.options(), "ControlPath") == option(Ssh(remote()).options(), "ControlPath")
    assert option(a.options(), "ControlPath") != option(b.options(), "ControlPath")


@pytest.mark.parametrize("stderr,words", [
    ("Host key verification failed.", "host key is unknown"),
    ("me@login: Permission denied (publickey).", "refused the key"),
    ("ssh: Could not resolve hostname login.example.org: Name or service not known", "unknown host name"),
    ("ssh: connect to host login.example.org port 22: Connection refused", "unreachable"),
    ("ssh: connect to host login.example.org port 22: Connection timed out", "unreachable"),
    ("kex_exchange_identification: read: Connection reset by peer", "failed"),
])
def test_ssh_failures_are_one_line_with_a_fix(stderr, words):
    err = Ssh(remote()).failure(stderr + "\n")
    assert isinstance(err, HpcError) and words in str(err) and "fix:" in str(err) and "\n" not in str(err)


def test_a_remote_profile_is_checked_on_load(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nremote:\n  host: login\n  job_root: /scratch\n  prot: 22\n")
    with pytest.raises(HpcError, match="remote.prot"):
        precedence.resolve(str(bad), [precedence.flag_layer({"script": "t.py"})])
    for host, root, key in (("'login; rm -rf /'", "/scratch", "remote.host"), ("-oProxyCommand=x", "/s", "remote.host"),
                            ("login", "scratch/jobs", "remote.job_root"), ("login", "/scratch/%u", "remote.job_root")):
        bad.write_text(f"name: bad\nremote:\n  host: {host}\n  job_root: {root}\n")
        with pytest.raises(HpcError, match=key):
            precedence.resolve(str(bad), [precedence.flag_layer({"script": "t.py"})])


def test_the_wrapped_command_runs_in_bash_from_another_login_shell():
    """What sshd hands the login shell: here sh (dash) stands in for tcsh or fish."""
    wrapped = Ssh(remote(env=["export GREETING='hi there'"])).command_line('echo "$GREETING" ${BASH_VERSION:+bash}')[-1]
    out = subprocess.run(["sh", "-c", wrapped], capture_output=True, text=True, check=True).stdout
    assert out.endswith("hi there bash\n")
