"""Commands on a cluster's login node over SSH: one multiplexed connection per host, never a prompt or a hang.

The first command to a host starts a master connection (ControlMaster) that stays up for ten minutes, so every
later command, rsync included, costs about one network round trip. BatchMode makes ssh fail instead of asking
for a password or a host key; every call has a timeout. Failures are one line naming the fix.
"""

from __future__ import annotations

import base64
import os
import shlex
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from hpc.errors import HpcError

PERSIST_S = 600
# Printed before each command's own output: what a login node's shell start-up prints (a banner, module
# messages) comes before it and is dropped, so it cannot be taken for a job id or a file's contents.
START = "@@hpc-ssh-output@@"
UNREACHABLE = 255  # ssh's own failures exit 255; the remote command's codes come through otherwise
# A script there that refuses to go on (a job root someone else could write) says why after this, on stderr
REFUSED = "@@hpc-refused@@"


# A socket's path may not exceed 104 bytes (macOS; 108 on Linux): the folder, /, the 20-character key, and the
# 17-character suffix ssh adds while it creates one
_SOCKET_DIR_MAX = 104 - 1 - 20 - 17


def _control_dir() -> Path:
    """A private folder for the master connections' sockets: whoever can reach a socket runs commands as us
    on the cluster and reads what comes back. $XDG_RUNTIME_DIR when it is ours alone (and short enough for a
    socket path), else hpc-ssh-<uid> in the temporary folder, refused unless it is ours alone."""
    from hpc.cluster.ownership import insecure

    runtime = os.environ.get("XDG_RUNTIME_DIR")
    usable = runtime and os.path.isabs(runtime) and len(f"{runtime}/hpc-ssh") <= _SOCKET_DIR_MAX
    if usable and insecure(runtime, private=True) is None:
        path = Path(runtime) / "hpc-ssh"
    else:
        path = Path(tempfile.gettempdir()) / f"hpc-ssh-{os.getuid()}"
    try:
        path.mkdir(mode=0o700)  # created private; an existing one is checked below, never trusted
    except FileExistsError:
        pass
    except OSError as e:
        raise HpcError(f"cannot create the SSH connection folder {path}: {e.strerror}",
                       fix="set XDG_RUNTIME_DIR (or TMPDIR) to a folder of your own") from None
    why = insecure(path, private=True)
    if why is not None:
        raise HpcError(f"the SSH connection folder {path} {why}: another user could use or forge your "
                       "connections", fix=f"remove {path} (check who made it) or set XDG_RUNTIME_DIR to a "
                       "private folder of your own")
    return path


class Ssh:
    def __init__(self, remote):
        self.remote = remote

    @property
    def label(self) -> str:
        r = self.remote
        return f"{r.user + '@' if r.user else ''}{r.host}{':' + str(r.port) if r.port else ''}"

    def _key(self) -> str:
        """One master connection per destination and settings: a connection made with other keys or host
        keys is not reused (ssh's own %C names the destination only)."""
        import hashlib

        return hashlib.sha256(repr(self.remote).encode()).hexdigest()[:20]

    def options(self) -> list[str]:
        r = self.remote
        opts = ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={r.connect_timeout}",
                "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3",
                "-o", "ControlMaster=auto", "-o", f"ControlPath={_control_dir()}/{self._key()}",
                "-o", f"ControlPersist={PERSIST_S}", "-o", "StrictHostKeyChecking=yes", "-o", "LogLevel=ERROR"]
        if r.known_hosts:
            opts += ["-o", f"UserKnownHostsFile={r.known_hosts}"]
        if r.port:
            opts += ["-p", str(r.port)]
        if r.identity_file:
            opts += ["-i", os.path.expanduser(r.identity_file), "-o", "IdentitiesOnly=yes"]
        if r.jump_host:
            opts += ["-J", r.jump_host]
        if r.user:
            opts += ["-l", r.user]
        return opts

    def command_line(self, script: str) -> list[str]:
        """ssh argv running ``script`` (bash) on the login node, after the profile's env lines. The login shell
        may be tcsh or fish: it only sees ``bash -c '...'`` around base64, which every shell passes on as is."""
        text = "\n".join([*self.remote.env, f"printf %s {START}", script])
        return ["ssh", *self.options(), self.remote.host, "--", _in_bash(text)]

    def shell(self, script: str, *, input: bytes | None = None, timeout: float = 60,
              check: bool = True) -> subprocess.CompletedProcess:
        """Run shell text there; returns the finished process (stdout as bytes)."""
        argv = self.command_line(script)
        try:
            proc = subprocess.run(argv, check=False, input=input, capture_output=True, timeout=timeout,
                                  stdin=None if input is not None else subprocess.DEVNULL)
        except FileNotFoundError:
            raise HpcError("ssh not found on this machine", fix="install the OpenSSH client") from None
        except subprocess.TimeoutExpired:
            raise HpcError(f"ssh {self.label} did not answer within {timeout:g} s",
                           fix="check the network and the login node; `ssh -O exit` ends a stuck connection") from None
        if proc.returncode == UNREACHABLE:
            raise self.failure(proc.stderr.decode(errors="replace"))
        refused = self.refusal(proc.stderr.decode(errors="replace"))
        if refused is not None:
            raise refused
        marker = START.encode()
        if marker in proc.stdout:
            proc.stdout = proc.stdout.split(marker, 1)[1]
        if check and proc.returncode != 0:
            message = " ".join(proc.stderr.decode(errors="replace").split())[:400] or f"exit code {proc.returncode}"
            raise HpcError(f"on {self.label}: {message}", fix="see the message from the login node")
        return proc

    def run(self, argv: Sequence[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """A command there, as ``subprocess.run(..., text=True)`` would return it here: the Slurm runner."""
        proc = self.shell(shlex.join(argv), timeout=timeout, check=False)
        return subprocess.CompletedProcess(list(argv), proc.returncode, proc.stdout.decode(errors="replace"),
                                           proc.stderr.decode(errors="replace"))

    def rsync(self, source: str, dest: str, *, prepare: str, link_dest: str | None = None,
              timeout: float = 600) -> str:
        """rsync a local folder's contents into ``dest`` there over the shared connection, after the bash script
        ``prepare`` (which makes the folders); files equal to those in ``link_dest`` there are hard-linked from it
        instead of sent. Returns rsync's --stats."""
        argv = ["rsync", "-a", "--stats", "-e", shlex.join(["ssh", *self.options()]),
                f"--rsync-path={_in_bash(prepare)} && rsync", *([f"--link-dest={link_dest}"] if link_dest else []),
                source.rstrip("/") + "/", f"{self.remote.host}:{dest}"]
        try:
            proc = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=timeout,
                                  stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise HpcError("rsync not found on this machine",
                           fix="install rsync (it sends only what changed)") from None
        except subprocess.TimeoutExpired:
            raise HpcError(f"sending the code to {self.label} took over {timeout:g} s",
                           fix="exclude large files from the snapshot (snapshot_exclude)") from None
        if proc.returncode != 0:
            refused = self.refusal(proc.stderr)
            if refused is not None:
                raise refused
            if "ssh:" in proc.stderr or proc.returncode == 255:
                raise self.failure(proc.stderr)
            message = " ".join(proc.stderr.split())[:400]
            raise HpcError(f"rsync to {self.label} failed: {message}",
                           fix="check that rsync is installed on the login node and the folder is writable")
        return proc.stdout

    def refusal(self, stderr: str) -> HpcError | None:
        """What a script there refused to do (REFUSED, then why), as one line."""
        if REFUSED not in stderr:
            return None
        why = " ".join(stderr.split(REFUSED, 1)[1].split("\n", 1)[0].split())
        return HpcError(f"on {self.label}: {why}", fix="set remote.job_root to a folder of your own there that only "
                        "you can write")

    def failure(self, stderr: str) -> HpcError:
        """ssh's own failure (exit 255) as one line with the fix."""
        text = " ".join(stderr.split())
        host = self.label
        if "Host key verification failed" in text or "REMOTE HOST IDENTIFICATION HAS CHANGED" in text:
            return HpcError(f"ssh {host}: the host key is unknown or has changed",
                            fix=f"connect once by hand (ssh {self.remote.host}) and check the key, or set "
                                "remote.known_hosts in the profile")
        if "Permission denied" in text:
            return HpcError(f"ssh {host}: the login node refused the key ({text[:200]})",
                            fix="set remote.identity_file (an unencrypted key, or one held by ssh-agent)")
        if "Could not resolve hostname" in text:
            return HpcError(f"ssh {host}: unknown host name", fix="check remote.host, or its alias in ~/.ssh/config")
        if "Connection refused" in text or "timed out" in text or "No route to host" in text \
                or "Network is unreachable" in text:
            return HpcError(f"ssh {host}: unreachable ({text[:200]})",
                            fix="check the network, VPN and remote.port; is the login node up?")
        return HpcError(f"ssh {host} failed: {text[:300] or 'exit code 255'}", fix="try `ssh -v` by hand")


def _in_bash(text: str) -> str:
    """``text`` as one bash command for whatever login shell: base64 in single quotes passes through any."""
    packed = base64.b64encode(text.encode()).decode()
    return f"bash -c 'eval \"$(echo {packed} | base64 -d)\"'"
