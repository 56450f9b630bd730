"""A function job's files, as both sides see them: the signed pickles (the call, each rank's result) and the key.

The call and the results are pickles, so each carries an HMAC-SHA256 made with a key of the job's own (kept in
the job's record and in a 0600 file of its folder): a pickle another user planted, or a signed one copied under
another name, is refused before it is unpickled. Torch-free.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from hpc.contract import layout

MODULE = "hpc.runtime.function_runner"  # what a function job's ranks run (python -m)
CALL_FILE = f"{layout.FUNCTION}/{layout.FUNCTION_CALL}"
KEY_FILE = f"{layout.FUNCTION}/{layout.FUNCTION_KEY}"
SIGNED = b"hpc-hmac-sha256 "  # the first line of every pickle of a function job: this, the MAC in hex


def new_key() -> str:
    return secrets.token_hex(32)


def sign(key: str, name: str, payload: bytes) -> bytes:
    """``payload`` (a pickle) as the file ``name`` (relative to the job folder) holds it, signed: a signed file
    copied under another name (rank 1's result as rank 0's, a result as the call) does not verify."""
    return SIGNED + _mac(key, name, payload).encode() + b"\n" + payload


def verified(key: str, name: str, data: bytes) -> bytes | None:
    """The pickle in ``data`` if ``key`` signed it as ``name``; None if unsigned or signed otherwise."""
    head, _, payload = data.partition(b"\n")
    if not head.startswith(SIGNED):
        return None
    ok = hmac.compare_digest(head[len(SIGNED):], _mac(key, name, payload).encode())
    return payload if ok else None


def _mac(key: str, name: str, payload: bytes) -> str:
    return hmac.new(bytes.fromhex(key), name.encode() + b"\0" + payload, hashlib.sha256).hexdigest()
